"""Idle and busy power of the board, through the sensors package.

Idle: the board sleeping for a window. Busy: matrix multiplies on every core for a window.
With no sensor, "auto" falls back to the labelled CPU-utilisation model (an estimate, and the
profile says so) or, when even that cannot run, to no figures at all, with the reasons kept.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from ..sensors import EnergyMeter, PowerSensor, SensorError, detect, open_sensor
from .identity import usable_cores

FALLBACKS = ("model", "none")


@dataclass
class PowerMeasurement:
    idle_w: float | None
    active_w: float | None
    sensor: str | None  # the sensor's registry name; None when nothing could measure
    estimate: bool  # True for the "model" sensor: not a measurement of this board
    reasons: list[str] = field(default_factory=list)  # why better sensors were passed over
    idle_s: float = 0.0
    busy_s: float = 0.0
    busy_threads: int = 0
    sensor_description: dict[str, Any] | None = None
    # where the busy window read below the idle one (noise: 9.84 W idle, 10.0 busy was seen
    # close to it): what it read, active_w being written as idle_w, and why
    busy_read_w: float | None = None
    note: str | None = None

    @property
    def measured(self) -> bool:
        return self.idle_w is not None and self.active_w is not None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def choose_sensor(sensor: str | PowerSensor = "auto", root: str | os.PathLike = "/",
                  fallback: str = "model") -> tuple[PowerSensor | None, list[str]]:
    """The sensor to use and why others were not. A sensor asked for by name must open."""
    if fallback not in FALLBACKS:
        raise ValueError(f"fallback must be one of {FALLBACKS}, got {fallback!r}")
    if isinstance(sensor, PowerSensor):
        return sensor, []
    if sensor == "none":
        return None, ["no power sensor asked for (--sensor none)"]
    if sensor != "auto":
        return open_sensor(sensor, root), []  # SensorError says what is missing and the remedy
    found: list[tuple[str, str]] = []
    chosen = detect(root, reasons=found)
    reasons = [f"{name}: {why}" for name, why in found]
    if chosen is not None:
        return chosen, reasons
    if fallback == "model":
        try:
            return open_sensor("model", root), reasons + [
                "no power sensor on this board: using the labelled CPU-utilisation model "
                "(an estimate; pass --sensor NAME when a meter is attached)"]
        except SensorError as error:
            reasons.append(f"model: {error}")
    return None, reasons + ["no power figures: no sensor could be opened"]


def busy_loop(seconds: float, threads: int, size: int = 256) -> int:
    """Matrix multiplies on `threads` threads for `seconds`; returns how many were done."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a = torch.randn(size, size)
        b = torch.randn(size, size)
        out = torch.empty(size, size)
        done = 0
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            torch.mm(a, b, out=out)
            done += 1
        return done
    finally:
        torch.set_num_threads(previous)


def measure_power(sensor: str | PowerSensor = "auto", *, root: str | os.PathLike = "/",
                  idle_s: float = 2.0, busy_s: float = 2.0, fallback: str = "model",
                  threads: int | None = None, period_s: float = 0.02) -> PowerMeasurement:
    chosen, reasons = choose_sensor(sensor, root, fallback)
    if chosen is None:
        return PowerMeasurement(None, None, None, False, reasons)
    threads = threads or usable_cores()
    with EnergyMeter(chosen, period_s) as idle:
        time.sleep(idle_s)
    with EnergyMeter(chosen, period_s) as busy:
        busy_loop(busy_s, threads)
    description = chosen.describe()
    return power_read(idle.mean_power_w, busy.mean_power_w, chosen.name,
                      bool(description.get("estimate", False)), reasons, idle.duration_s,
                      busy.duration_s, threads, description)


def power_read(idle_w: float, busy_w: float, *args: Any) -> PowerMeasurement:
    """The measurement from the two windows' mean power. A busy window below the idle one is
    noise (a busy board draws no less): active_w is written as idle_w, and the profile keeps
    what the busy window read and says so (`busy_read_w`, `note`), never a busy power below
    idle, which a profile is refused for beyond noise and would cost compute below 0 J."""
    measured = PowerMeasurement(idle_w, busy_w, *args)
    if busy_w is not None and idle_w is not None and busy_w < idle_w:
        measured.active_w, measured.busy_read_w = idle_w, busy_w
        measured.note = (f"the busy window read {busy_w:.3f} W, below the idle window's "
                         f"{idle_w:.3f} W (noise): active_w is written as idle_w, so compute "
                         "costs no energy above idle; measure again on a quiet board for a "
                         "busy figure")
    return measured
