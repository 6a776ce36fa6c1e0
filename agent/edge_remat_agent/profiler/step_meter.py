"""What the executor records for each training step: wall time, the process's CPU time and
minor page faults (getrusage: on a shared machine wall time swings with the load, CPU time
much less), the peak of live tensor bytes
(its own ledger), the process's resident peak (measured independently), and energy where a
sensor exists.

    ledger = LiveTensorLedger()
    for step in range(steps):
        with StepMeter(ledger, sensor) as meter:
            run_step()                      # registers / unregisters tensors in `ledger`
        report.append(meter.result.to_dict())
"""

from __future__ import annotations

import resource
import time
from dataclasses import asdict, dataclass
from typing import Any

from ..sensors import EnergyMeter, PowerSensor
from .memory import LiveTensorLedger, PeakRssSampler


@dataclass
class StepMeasurement:
    wall_s: float
    ledger_peak_bytes: int  # what the plan's memory model predicts
    rss_peak_bytes: int  # what the process really held (sampled and kernel peak, the larger)
    rss_start_bytes: int
    rss_peak_kernel_bytes: int | None
    energy_j: float | None  # None: no sensor
    energy_method: str | None
    sensor: str | None
    cpu_s: float | None = None  # the process's user + system time in the step (all threads)
    minor_faults: int | None = None  # the process's minor page faults in the step

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class StepMeter:
    def __init__(self, ledger: LiveTensorLedger, sensor: PowerSensor | None = None,
                 rss_period_s: float = 0.002, energy_period_s: float = 0.01):
        self.ledger = ledger
        self.sensor = sensor
        # The kernel's high-water mark where it can be reset, a sampling thread elsewhere.
        self._rss = PeakRssSampler(period_s=rss_period_s, always_sample=False)
        self._energy = EnergyMeter(sensor, energy_period_s) if sensor is not None else None
        self._start = 0.0
        self.result: StepMeasurement | None = None

    def __enter__(self) -> StepMeter:
        self.result = None
        self.ledger.reset_peak()  # the peak of this step, from what is live when it starts
        self._rss.__enter__()
        if self._energy is not None:
            self._energy.__enter__()
        self._usage = resource.getrusage(resource.RUSAGE_SELF)
        self._start = time.perf_counter()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        wall_s = time.perf_counter() - self._start
        usage, before = resource.getrusage(resource.RUSAGE_SELF), self._usage
        try:
            if self._energy is not None:
                self._energy.__exit__(exc_type, exc, tb)
        finally:
            self._rss.__exit__(exc_type, exc, tb)
        energy = self._energy
        self.result = StepMeasurement(
            wall_s=wall_s, ledger_peak_bytes=self.ledger.peak_bytes,
            rss_peak_bytes=self._rss.peak_bytes, rss_start_bytes=self._rss.start_bytes,
            rss_peak_kernel_bytes=self._rss.peak_kernel_bytes,
            energy_j=energy.energy_j if energy is not None else None,
            energy_method=energy.method if energy is not None else None,
            sensor=self.sensor.name if self.sensor is not None else None,
            cpu_s=usage.ru_utime + usage.ru_stime - before.ru_utime - before.ru_stime,
            minor_faults=usage.ru_minflt - before.ru_minflt)
