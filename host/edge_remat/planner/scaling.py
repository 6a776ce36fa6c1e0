"""Integer scaling for CP-SAT, which only takes integer coefficients.

Exact where the numbers allow it (integers with a common divisor; decimals with few digits);
otherwise rounded in the direction that keeps the answer honest: sizes and deadline costs up
(a plan the solver accepts really fits), objective costs down (the solver's bound stays a bound).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MAX_MEMORY_UNITS = 2**26  # capacity in units; keeps cumulative reasoning far from int64 overflow
MAX_COST_UNITS = 2**40


@dataclass(frozen=True)
class Scale:
    unit: float  # one integer unit is worth this many bytes, seconds or joules
    exact: bool

    def up(self, value: float) -> int:
        if value == 0:
            return 0
        whole = self._whole(value)
        if whole is not None:
            return -(-whole[0] // whole[1])
        return math.ceil(value / self.unit - (1e-9 if self.exact else 0))

    def down(self, value: float) -> int:
        whole = self._whole(value)
        if whole is not None:
            return whole[0] // whole[1]
        return math.floor(value / self.unit + (1e-9 if self.exact else 0))

    def _whole(self, value: float) -> tuple[int, int] | None:
        """Value and unit as integers where both are whole (byte counts): integer division
        then rounds exactly, where a float tolerance would round a budget one byte short of
        a unit above 1 GB up to the whole unit, and a plan could pass it."""
        if (self.exact and float(self.unit).is_integer()
                and float(value).is_integer() and abs(value) < 2**63):
            return int(value), int(self.unit)
        return None

    def describe(self) -> dict:
        return {"unit": self.unit, "exact": self.exact}


def memory_scale(sizes: list[int], capacity: int) -> Scale:
    divisor = 0
    for size in sizes:
        divisor = math.gcd(divisor, int(size))
    divisor = max(divisor, 1)
    if capacity / divisor <= MAX_MEMORY_UNITS:
        return Scale(divisor, True)
    return Scale(math.ceil(capacity / MAX_MEMORY_UNITS), False)


def cost_scale(values: list[float], total: float, resolution: float = 2**30) -> Scale:
    """A unit in which every value is an integer, if a decimal one exists; else total/resolution."""
    values = [v for v in values if v != 0]
    if not values:
        return Scale(1.0, True)
    for digits in range(7):
        factor = 10**digits
        scaled = [v * factor for v in values]
        if all(abs(x - round(x)) <= 1e-9 * max(1.0, abs(x)) for x in scaled):
            divisor = 0
            for x in scaled:
                divisor = math.gcd(divisor, int(round(x)))
            if total * factor / divisor <= MAX_COST_UNITS:
                return Scale(divisor / factor, True)
            break
    return Scale(max(total, max(values)) / resolution, False)
