"""Linux RAPL (Running Average Power Limit) energy counters via the powercap sysfs class.

    /sys/class/powercap/intel-rapl:<N>/energy_uj            microjoules, wraps around
    /sys/class/powercap/intel-rapl:<N>/max_energy_range_uj  where it wraps
    /sys/class/powercap/intel-rapl:<N>/name                 "package-0", "psys", ...

Only top-level package domains are used: sub-domains (intel-rapl:0:0 "core", ...:1 "dram")
are parts of a package, and "psys" (platform) already contains the packages, so adding
either would count energy twice. AMD Zen CPUs expose the same files under the same names.

Since Linux 5.10 (Nov 2020, the PLATYPUS side channel, CVE-2020-8694) energy_uj is
readable by root only.
"""

from __future__ import annotations

import os
import re
import threading
import time
from typing import Any, Callable

from .base import PowerSensor, SensorError, glob_sorted, read_number, read_text

POWERCAP_DIR = "/sys/class/powercap"
PACKAGE_DOMAIN = re.compile(r"intel-rapl:\d+")
UNREADABLE_REMEDY = ("run as root, or let other users read the counters with "
                     "`sudo chmod o+r /sys/class/powercap/intel-rapl:*/energy_uj` "
                     "(root-only since a 2020 kernel change; the chmod lasts until reboot)")


class _Domain:
    """One package counter; turns the wrapping microjoule counter into monotonic joules."""

    def __init__(self, directory: str, read: Callable[[str], str]):
        self.directory = directory
        self.label = _domain_name(directory, read)
        self.energy_path = os.path.join(directory, "energy_uj")
        self.max_range_uj = read_number(os.path.join(directory, "max_energy_range_uj"), read)
        self._read = read
        self._last_raw_uj = self._read_raw_uj()
        self.total_uj = 0.0
        self.wraps = 0

    def _read_raw_uj(self) -> float:
        try:
            return read_number(self.energy_path, self._read)
        except PermissionError as error:
            raise SensorError(f"RAPL counter {self.energy_path} exists but is not readable "
                              f"({error.strerror or error})", UNREADABLE_REMEDY) from error

    def update(self) -> float:
        raw = self._read_raw_uj()
        delta = raw - self._last_raw_uj
        if delta < 0:
            # The counter passed max_energy_range_uj and restarted from 0. A counter read
            # less often than once per wrap period (tens of minutes at full load) loses
            # whole wraps; EnergyMeter reads it every sampling period.
            delta += self.max_range_uj
            self.wraps += 1
        self._last_raw_uj = raw
        self.total_uj += delta
        return self.total_uj


class RaplSensor(PowerSensor):
    name = "rapl"

    def __init__(self, root: str | os.PathLike = "/", min_interval_s: float = 0.01,
                 max_age_s: float = 1.0, read_file: Callable[[str], str] = read_text,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        """`read_file`, `clock` and `sleep` are injectable so tests need no real hardware."""
        super().__init__(root)
        self.min_interval_s = min_interval_s
        self.max_age_s = max_age_s
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        directories = [d for d in glob_sorted(self.path(POWERCAP_DIR), "intel-rapl:*")
                       if PACKAGE_DOMAIN.fullmatch(os.path.basename(d))
                       and os.path.exists(os.path.join(d, "energy_uj"))]
        if not directories:
            raise SensorError(
                f"no RAPL package domain (intel-rapl:<N>/energy_uj) under {self.path(POWERCAP_DIR)}",
                "use an x86 Linux machine with the intel_rapl_msr module loaded "
                "(`sudo modprobe intel_rapl_msr`); ARM boards have no RAPL")
        try:
            domains = [_Domain(d, read_file) for d in directories]
        except OSError as error:
            raise SensorError(f"cannot read RAPL files: {error}", UNREADABLE_REMEDY) from error
        packages = [d for d in domains if d.label.startswith("package")]
        self.domains = packages or domains
        self.skipped = [d.label for d in domains if d not in self.domains]
        self._last = (self._clock(), 0.0)  # (time, total joules) of the last counter read

    def _total_j(self) -> tuple[float, float]:
        with self._lock:
            total_uj = sum(d.update() for d in self.domains)
            return self._clock(), total_uj / 1e6

    def energy_counter_j(self) -> float:
        now = self._total_j()
        self._last = now
        return now[1]

    def read_power_w(self) -> float:
        """Energy difference over time between this counter read and the previous one.

        The previous read is reused when it is recent; otherwise (first call, or a stale one)
        the counter is read twice `min_interval_s` apart, so the value is never an average
        over a long idle gap.
        """
        last_t, _ = self._last
        age = self._clock() - last_t
        if age > self.max_age_s:
            self._last = self._total_j()
            age = 0.0
        if age < self.min_interval_s:
            self._sleep(self.min_interval_s - age)
        (t0, e0), (t1, e1) = self._last, self._total_j()
        self._last = (t1, e1)
        if t1 <= t0:
            raise SensorError("RAPL counter read twice at the same clock time",
                              "use a monotonic clock with sub-millisecond resolution")
        return (e1 - e0) / (t1 - t0)

    def describe(self) -> dict[str, Any]:
        return {"kind": self.name, "domains": [d.label for d in self.domains],
                "skipped_domains": self.skipped,
                "paths": [d.energy_path for d in self.domains],
                "units": {"energy_uj": "uJ", "max_energy_range_uj": "uJ"},
                "max_energy_range_uj": [d.max_range_uj for d in self.domains],
                "wraps_seen": sum(d.wraps for d in self.domains),
                "calibration": "none (counter in microjoules); power = delta energy / delta time",
                "scope": "CPU package(s) only, not the whole board"}


def _domain_name(directory: str, read: Callable[[str], str]) -> str:
    try:
        return read(os.path.join(directory, "name"))
    except OSError:
        return os.path.basename(directory)
