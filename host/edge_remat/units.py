"""Human units at the command line (512MiB, 80%, 1.3x); bytes, seconds and fractions inside."""

from __future__ import annotations

import math
from dataclasses import dataclass

from edge_remat_agent.formats.fields import MAX_GRAPH_BYTES, MAX_RATE
from edge_remat_agent.units import KNOWN_UNITS, SIZE_UNITS, split_quantity

# A bare number below this is a fraction of the plain schedule's peak, above it a byte count:
# no budget is a handful of bytes, and no fraction is this large.
FRACTION_LIMIT = 16
# A size given here (a budget, a memory limit) is at most what a graph may hold, MAX_GRAPH_BYTES
# (2**53 bytes, 8 PiB), a rate at most MAX_RATE (2**60 bytes a second): the bounds every file
# read is held to (formats/fields.py), so that no option plans what no file could.


class UnitError(ValueError):
    pass


def parse_budget(text: str, option: str = "budget",
                 sizes_only: bool = False) -> tuple[str, float]:
    """'0.8' or '80%' -> ('fraction', 0.8); '512MiB' or '736128' -> ('bytes', 536870912).
    `option` names what is read in the messages (e.g. '--memory-limit'); `sizes_only`: a
    fraction of the plain peak means nothing there (a board's RAM, a bandwidth), so a bare
    number is bytes however small and a percentage is refused."""
    usage = "a size (512MiB, 2GB, 736128)" if sizes_only else \
        "a fraction (0.8), a percentage (80%) or a size (512MiB, 2GB, 736128)"
    quantity = split_quantity(text)
    if quantity is None and split_quantity(str(text).strip().removeprefix("-")) is not None:
        raise UnitError(f"{option} {text!r} must be positive")  # as 0 is (QA: "cannot read")
    if quantity is None:
        raise UnitError(f"cannot read {option} {text!r}: use {usage}")
    value, unit = quantity
    if unit == "%" and sizes_only:
        raise UnitError(f"{option} {text!r} is a percentage: use {usage}")
    if unit == "%":
        value /= 100.0
        unit = "fraction"
    fraction = unit == "fraction" or (unit == "" and value < FRACTION_LIMIT and not sizes_only)
    if fraction and value <= 0:
        raise UnitError(f"{option} {text!r} must be positive")
    if fraction and value < FRACTION_LIMIT:
        return "fraction", value
    if fraction:
        raise UnitError(f"{option} {text!r} is {value:g} times the plain peak: give at most "
                        f"{FRACTION_LIMIT - 1}00%, or a size such as 512MiB")
    if unit not in SIZE_UNITS:
        raise UnitError(f"unknown size unit {unit!r} in {option} {text!r} (known: "
                        f"{KNOWN_UNITS}; k, M, G and T are kB, MB, GB and TB)")
    if value <= 0:
        raise UnitError(f"{option} {text!r} must be positive")
    if not math.isfinite(value) or value * SIZE_UNITS[unit] > MAX_GRAPH_BYTES:
        raise UnitError(f"{option} {text!r} is larger than any board's memory (at most "
                        f"{MAX_GRAPH_BYTES} bytes, {MAX_GRAPH_BYTES // SIZE_UNITS['tib']} TiB)")
    return "bytes", value * SIZE_UNITS[unit]


# The short decimal units (`4M`), which users often write for the binary ones (MiB).
SHORT_DECIMAL = {"k": ("kB", "KiB"), "m": ("MB", "MiB"), "g": ("GB", "GiB"), "t": ("TB", "TiB")}


def bare_bytes_note(text: str, option: str = "--budget") -> str | None:
    """A warning for a bare number from FRACTION_LIMIT to 100 (`--budget 50`): read as that
    many bytes, which no model trains in, where a percentage was almost surely meant; and for
    a size with a short decimal unit (`--budget 4M`): 4,000,000 bytes, where 4 MiB
    (4,194,304) is often meant."""
    quantity = split_quantity(str(text))
    if quantity is not None and quantity[1] in SHORT_DECIMAL:
        return _short_decimal_note(text, option, *quantity)
    if quantity is None or quantity[1] != "" or not FRACTION_LIMIT <= quantity[0] <= 100:
        return None
    return (f"{option} {text} is read as {quantity[0]:g} bytes (a bare number below "
            f"{FRACTION_LIMIT} is a fraction of the plain peak, from {FRACTION_LIMIT} up bytes): "
            f"for {quantity[0]:g}% of the plain peak, write {quantity[0]:g}%")


def _short_decimal_note(text: str, option: str, value: float, unit: str) -> str | None:
    decimal, binary = SHORT_DECIMAL[unit]
    read = value * SIZE_UNITS[unit]
    if not (math.isfinite(read) and 0 < read <= MAX_GRAPH_BYTES):
        return None  # refused anyway, in its own line
    meant = value * SIZE_UNITS[binary.lower()]
    return (f"{option} {text} is read as {read:,.0f} bytes ({value:g} {decimal}, decimal "
            f"units): for {value:g} {binary} ({meant:,.0f} bytes), write {value:g}{binary}")


def parse_size(text: str, option: str) -> float:
    """A size option ('600MiB'): bytes; the messages name the option. A rate: parse_rate."""
    return parse_budget(text, option, sizes_only=True)[1]


# A rate's "per second", as users write it after a size: 90MB/s, 90 MB/sec, 90MBps.
_PER_SECOND = ("/s", "/sec", "ps")
RATE_USAGE = "bytes a second (90MB/s, 1.2GB/s, 500MiB/s, 90000000)"


def parse_rate(text: str, option: str) -> float:
    """A bandwidth option ('90MB/s', '90MB' or '90000000'): bytes a second, said as a rate in
    the messages (QA: `--flash-read-bw 1e30` was 'larger than any board's memory', and
    `--flash-write-bw 90MB/s` was told to give 'a size (512MiB, ...)')."""
    size = str(text).strip()
    negative = size.startswith("-")
    size = size.removeprefix("-")
    for suffix in _PER_SECOND:
        if size.lower().endswith(suffix) and split_quantity(size[:-len(suffix)]) is not None:
            size = size[:-len(suffix)]
            break
    quantity = split_quantity(size)
    if quantity is not None and negative:
        raise UnitError(f"{option} {text!r} must be positive: give {RATE_USAGE}")
    if quantity is None or negative:
        raise UnitError(f"cannot read {option} {text!r}: give {RATE_USAGE}")
    value, unit = quantity
    if unit == "%":
        raise UnitError(f"{option} {text!r} is a percentage: give {RATE_USAGE}")
    if unit not in SIZE_UNITS:
        raise UnitError(f"unknown unit {unit!r} in {option} {text!r} (known: {KNOWN_UNITS}, "
                        f"each optionally /s; k, M, G and T are kB, MB, GB and TB): give "
                        f"{RATE_USAGE}")
    if value <= 0:
        raise UnitError(f"{option} {text!r} must be positive: give {RATE_USAGE}")
    if not math.isfinite(value) or value * SIZE_UNITS[unit] > MAX_RATE:
        raise UnitError(f"{option} {text!r} is faster than any flash or link: give at most "
                        f"2^60 bytes a second ({MAX_RATE:.3g})")
    return value * SIZE_UNITS[unit]


@dataclass(frozen=True)
class Budget:
    """A memory budget, read once from the command line: a byte count, or a fraction of the
    plain schedule's peak (resolved against it by the planner)."""

    bytes: int | None = None
    fraction: float | None = None

    def __post_init__(self) -> None:
        if (self.bytes is None) == (self.fraction is None):
            raise ValueError("a Budget is either bytes or a fraction of the plain peak")

    @classmethod
    def parse(cls, text: "str | float | int | Budget") -> "Budget":
        """'30%' or '0.3' -> a fraction; '512MiB' or '736128' -> bytes (parse_budget)."""
        if isinstance(text, Budget):
            return text
        kind, value = parse_budget(str(text))
        return cls(bytes=int(value)) if kind == "bytes" else cls(fraction=value)

    def resolve(self, plain_peak_bytes: int) -> int:
        """Bytes; a fraction rounds up, as the published benchmarks define it."""
        if self.bytes is not None:
            return self.bytes
        return math.ceil(self.fraction * plain_peak_bytes)

    def __str__(self) -> str:
        return f"{self.fraction:.4g} of the plain peak" if self.bytes is None else \
            fmt_bytes(self.bytes)


def parse_multiplier(text: str, option: str = "") -> float:
    """'1.3' or '1.3x' -> 1.3 (a deadline, as a multiple of the plain schedule's time); the
    messages name `option` (e.g. --deadline) where given."""
    s = str(text).strip().lower().rstrip("x×")
    named = f"{option} {text!r}" if option else repr(text)
    try:
        value = float(s)
    except ValueError:
        raise UnitError(f"cannot read {named}: use a multiple such as 1.3 or 1.3x") from None
    if not math.isfinite(value) or value <= 0:
        raise UnitError(f"{named} must be a positive finite multiple such as 1.3")
    return value


def round_up(value: float, digits: int = 4) -> float:
    """`value` rounded up to `digits` significant digits: a least multiple printed this way
    (a deadline that can be met) still holds when passed back."""
    shown = float(f"{value:.{digits}g}")
    if shown >= value or not math.isfinite(value) or value <= 0:
        return shown
    last_digit = 10.0 ** (math.floor(math.log10(shown)) - digits + 1)
    return float(f"{shown + last_digit:.{digits}g}")


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def fmt_duration(seconds: float) -> str:
    """2m05s, or 40s under a minute (how long a job or a build stage has been at it)."""
    whole = int(seconds)
    return f"{whole // 60}m{whole % 60:02d}s" if whole >= 60 else f"{whole}s"


def budget_against_plain(budget_bytes: int, plain_bytes: int) -> str:
    """'budget B (N% of plain P)'; above plain PyTorch's peak, which the plain schedule already
    fits, 'budget B, above the plain peak of P: no recomputation needed' (a share over 100%
    read as if something were planned)."""
    budget, plain = fmt_bytes(budget_bytes), fmt_bytes(plain_bytes)
    if budget_bytes > plain_bytes:
        return f"budget {budget}, above the plain peak of {plain}: no recomputation needed"
    return f"budget {budget} ({budget_bytes / plain_bytes:.0%} of plain {plain})"
