"""A labelled estimate for boards with no power sensor: a linear model of CPU utilisation.

    power = idle_w + utilisation * (active_w - idle_w)

Utilisation is the busy share of all CPU time between two reads of the first line of
/proc/stat ("cpu  user nice system idle iowait irq softirq steal guest guest_nice", in
clock ticks). idle and iowait count as idle; guest time is already inside user/nice, so it
is left out of the total. The idle_w / active_w defaults are placeholders: measure the
board once (idle, and all cores busy) with a USB meter and pass the real values.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable

from .base import PowerSensor, SensorError, read_text

PROC_STAT = "/proc/stat"


def cpu_times(stat_text: str) -> tuple[int, int]:
    """(busy ticks, total ticks) from /proc/stat text."""
    for line in stat_text.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            ticks = [int(f) for f in fields[1:9]]  # user .. steal; guest* are inside user/nice
            total = sum(ticks)
            idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
            return total - idle, total
    raise ValueError("no aggregate 'cpu ' line")


class ModelSensor(PowerSensor):
    name = "model"

    def __init__(self, root: str | os.PathLike = "/", idle_w: float = 2.0,
                 active_w: float = 10.0, min_interval_s: float = 0.05,
                 sleep: Callable[[float], None] = time.sleep):
        super().__init__(root)
        if not 0 <= idle_w <= active_w:
            raise ValueError(f"need 0 <= idle_w <= active_w, got {idle_w}, {active_w}")
        self.idle_w = idle_w
        self.active_w = active_w
        self.min_interval_s = min_interval_s
        self._sleep = sleep
        self.stat_path = self.path(PROC_STAT)
        self._last = self._snapshot()
        self.utilisation: float | None = None

    def _snapshot(self) -> tuple[int, int]:
        try:
            return cpu_times(read_text(self.stat_path))
        except (OSError, ValueError) as error:
            raise SensorError(f"cannot read CPU times from {self.stat_path}: {error}",
                              "run on Linux with /proc mounted") from error

    def read_power_w(self) -> float:
        """Estimate over the time since the previous read (or the sensor's creation)."""
        now = self._snapshot()
        if now[1] == self._last[1] and self.utilisation is None:
            # No tick has passed since the sensor was made: wait for some to accumulate.
            self._sleep(self.min_interval_s)
            now = self._snapshot()
        busy = now[0] - self._last[0]
        total = now[1] - self._last[1]
        if total > 0:
            self.utilisation = min(1.0, max(0.0, busy / total))
            self._last = now
        # total == 0: called again within one clock tick; keep the last estimate.
        utilisation = self.utilisation or 0.0
        return self.idle_w + utilisation * (self.active_w - self.idle_w)

    def describe(self) -> dict[str, Any]:
        return {"kind": self.name, "estimate": True, "paths": [self.stat_path],
                "units": {"power": "W (modelled)", "cpu_times": "clock ticks"},
                "calibration": {"idle_w": self.idle_w, "active_w": self.active_w},
                "formula": "idle_w + utilisation * (active_w - idle_w)",
                "utilisation": self.utilisation}
