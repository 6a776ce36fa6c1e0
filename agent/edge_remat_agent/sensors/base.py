"""The power-sensor interface, its error type, sysfs helpers, and the EnergyMeter sampler.

Every sensor takes a `root` directory that is prefixed to the absolute sysfs/proc paths it
reads, so tests (and offline replays) can point it at a fixture tree instead of the real `/`.
"""

from __future__ import annotations

import abc
import glob
import os
import re
import threading
import time
from typing import Any, Callable


class SensorError(RuntimeError):
    """A sensor that cannot be used: the message says what was looked for and the remedy."""

    def __init__(self, what: str, remedy: str):
        self.what = what
        self.remedy = remedy
        super().__init__(f"{what}. Remedy: {remedy}")


def under_root(root: str | os.PathLike, absolute_path: str) -> str:
    """`absolute_path` (e.g. "/sys/class/...") as seen under `root` (e.g. a test's tmp dir)."""
    return os.path.join(os.fspath(root), absolute_path.lstrip("/"))


def glob_sorted(directory: str, pattern: str) -> list[str]:
    """Matches of `pattern` inside `directory`, in natural order (hwmon2 before hwmon10).

    The directory is escaped, so a fixture root containing [ ] or * is taken literally.
    """
    found = glob.glob(os.path.join(glob.escape(directory), pattern.lstrip("/")))
    return sorted(found, key=_natural_key)


def _natural_key(path: str) -> list:
    return [(0, int(part), "") if part.isdigit() else (1, 0, part)
            for part in re.split(r"(\d+)", path)]


def read_text(path: str) -> str:
    """Whole file, stripped. Lets OSError through: callers turn it into a SensorError."""
    with open(path, encoding="ascii", errors="replace") as handle:
        return handle.read().strip()


def read_number(path: str, read: Callable[[str], str] = read_text) -> float:
    """A sysfs value file holding one integer (or decimal) number."""
    text = read(path)
    try:
        return float(int(text))
    except ValueError:
        try:
            return float(text)
        except ValueError:
            raise SensorError(f"{path} holds {text!r}, not a number",
                              "check that the path is the sensor's value file") from None


class PowerSensor(abc.ABC):
    """One source of board power. Subclasses set `name` (the registry key)."""

    name: str = "abstract"

    def __init__(self, root: str | os.PathLike = "/"):
        self.root = os.fspath(root)

    def path(self, absolute_path: str) -> str:
        return under_root(self.root, absolute_path)

    @abc.abstractmethod
    def read_power_w(self) -> float:
        """Instantaneous total board (or package) power in watts."""

    def energy_counter_j(self) -> float | None:
        """A hardware energy counter in joules, monotonic after wrap handling; None if absent."""
        return None

    @abc.abstractmethod
    def describe(self) -> dict[str, Any]:
        """What is measured: kind, paths used, units, calibration (JSON-friendly)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(root={self.root!r})"


class EnergyMeter:
    """Measures the energy a block of code uses.

        with EnergyMeter(sensor, period_s=0.01) as m:
            train_step()
        m.energy_j, m.duration_s, m.samples, m.sampling_hz, m.method

    Power is sampled on a background thread; `samples` is a list of (time.monotonic(), watts).
    One sample is taken on entry and one on exit, and the block's energy is the samples' mean
    power (trapezoid) times its duration. If the sensor has a hardware energy counter, the energy is the counter difference
    instead (exact, no sampling error) and `method` says "counter".
    """

    def __init__(self, sensor: PowerSensor, period_s: float = 0.01):
        if period_s <= 0:
            raise ValueError(f"period_s must be > 0, got {period_s}")
        self.sensor = sensor
        self.period_s = period_s
        self.samples: list[tuple[float, float]] = []
        self.energy_j = 0.0
        self.duration_s = 0.0
        self.method = "integrated samples"
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_t = 0.0
        self._start_counter_j: float | None = None

    @property
    def sampling_hz(self) -> float:
        if len(self.samples) < 2:
            return 0.0
        span = self.samples[-1][0] - self.samples[0][0]
        return (len(self.samples) - 1) / span if span > 0 else 0.0

    @property
    def mean_power_w(self) -> float:
        return self.energy_j / self.duration_s if self.duration_s > 0 else 0.0

    def __enter__(self) -> EnergyMeter:
        self.samples = []
        self.error = None
        self._stop.clear()
        self._start_counter_j = self.sensor.energy_counter_j()
        self.method = "integrated samples" if self._start_counter_j is None else "counter"
        self._start_t = time.monotonic()
        self._sample()
        self._thread = threading.Thread(target=self._run, name="EnergyMeter", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        end_counter_j = self.sensor.energy_counter_j() if self._start_counter_j is not None else None
        end_t = time.monotonic()
        if self.error is None:
            self._sample()
        self.duration_s = end_t - self._start_t
        if self._start_counter_j is not None and end_counter_j is not None:
            self.energy_j = end_counter_j - self._start_counter_j
        else:
            self.energy_j = self.duration_s * sampled_mean_power_w(self.samples)
        if self.error is not None and exc_type is None:
            raise SensorError(f"power sampling failed during the measurement: {self.error}",
                              "check the sensor with sensor.read_power_w() before measuring") \
                from self.error

    def _sample(self) -> None:
        watts = self.sensor.read_power_w()
        self.samples.append((time.monotonic(), watts))

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self._sample()
                if self.method == "counter":
                    # Reading the counter at least once per period is what lets a sensor see
                    # every wrap-around of a short hardware counter.
                    self.sensor.energy_counter_j()
            except Exception as error:  # reported on exit, in the caller's thread
                self.error = error
                return

    def result(self) -> dict[str, Any]:
        return {"energy_j": self.energy_j, "duration_s": self.duration_s,
                "mean_power_w": self.mean_power_w, "samples": len(self.samples),
                "sampling_hz": self.sampling_hz, "method": self.method,
                "sensor": self.sensor.describe()}


def sampled_mean_power_w(samples: list[tuple[float, float]]) -> float:
    """Mean power over the samples' own span. The samples are timed when a read returns, so
    they span the block shifted by the read's latency (a utilisation model's first read waits
    50 ms); dividing their integral by the block's duration would bias it by that shift."""
    if len(samples) < 2:
        return samples[0][1] if samples else 0.0
    span = samples[-1][0] - samples[0][0]
    return trapezoid_energy_j(samples) / span if span > 0 else samples[-1][1]


def trapezoid_energy_j(samples: list[tuple[float, float]]) -> float:
    """Integral of power over time, trapezoid rule, for (time_s, watts) samples in time order."""
    total = 0.0
    for (t0, p0), (t1, p1) in zip(samples, samples[1:]):
        total += 0.5 * (p0 + p1) * (t1 - t0)
    return total
