"""What the allocator itself hands out while a piece of code runs: its peak above the start.

The live-tensor ledger (memory.py) sees the tensors a caller holds; an ATen kernel may also
allocate scratch inside itself and free it before returning (oneDNN's convolution backward on
the CPU: ~9 MiB at ResNet-18 batch 8 32x32), which no ledger outside the kernel can see. The
allocator sees it:

    with AllocatorPeak(device) as meter:
        run()
    meter.peak_bytes      # the most bytes allocated during the block and not yet freed
    meter.retained_bytes  # of those, still allocated when the block ended

CPU: torch.profiler with `profile_memory=True`. c10's CPU allocator reports every allocation and
free while it runs (pointer, size, running total; the same events benchmarks/end_to_end.py's
ActivationMeter reads over a whole step). The running total here is computed from the events
themselves, pairing each free with an allocation made in the window: c10's own running total is
process-wide and keeps bytes it saw allocated in an earlier window but not freed in one, and a
free of a block allocated before the window (which c10 reports only when an earlier window saw
that pointer, possibly with a stale size) is left out, so the peak can only err high. The
profiler costs time: measure in a run that is not timed.
CUDA: the caching allocator's own statistics (`max_memory_allocated` after a reset), the same
figure, with no profiler.
Other devices, or a CPU block inside someone else's torch.profiler window (profilers do not
nest): not measured (`measured` stays False).
"""

from __future__ import annotations

import contextlib
import os
import sys

import torch

from ..devices import allocated_peak, reset_peaks, synchronize


class AllocatorPeak:
    """Peak allocator bytes of a `with` block above what was allocated when it started."""

    def __init__(self, device: str | torch.device | None = None):
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.peak_bytes = 0
        self.retained_bytes = 0
        self.events = 0  # allocation and free events seen (CPU)
        self.allocations = 0  # of those, allocations, and the bytes they asked for (CPU)
        self.allocated_bytes = 0
        self.measured = False
        self._profile = None
        self._start = 0

    @staticmethod
    def supported(device: str | torch.device | None = None) -> bool:
        kind = torch.device(device).type if device is not None else "cpu"
        return kind == "cpu" or (kind == "cuda" and torch.cuda.is_available())

    def __enter__(self) -> AllocatorPeak:
        self.peak_bytes = self.retained_bytes = self.events = 0
        self.measured = False
        if self.device.type == "cpu":
            if _profiler_enabled():
                return self  # someone else's profiler is running: one at a time, not measured
            from torch.profiler import ProfilerActivity, profile
            self._profile = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
            with quiet_native_stderr():
                self._profile.__enter__()
        elif self.device.type == "cuda" and torch.cuda.is_available():
            synchronize(self.device)
            reset_peaks(self.device)
            self._start = torch.cuda.memory_allocated(self.device)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._profile is not None:
            profile, self._profile = self._profile, None
            with quiet_native_stderr():
                profile.__exit__(exc_type, exc, tb)
            if exc_type is None:
                self.peak_bytes, self.retained_bytes, self.events = cpu_peak(profile)
                sizes = [size for _, _, size, _ in allocation_events(profile) if size > 0]
                self.allocations, self.allocated_bytes = len(sizes), sum(sizes)
                self.measured = True
        elif self.device.type == "cuda" and torch.cuda.is_available() and exc_type is None:
            synchronize(self.device)
            self.peak_bytes = max(0, allocated_peak(self.device) - self._start)
            self.retained_bytes = max(0, torch.cuda.memory_allocated(self.device) - self._start)
            self.measured = True


@contextlib.contextmanager
def quiet_native_stderr():
    """Kineto writes a "profiler_start" / "profiler_stop" line to file descriptor 2 on every
    window, with no setting to silence it (KINETO_LOG_LEVEL leaves these): two lines per graph
    node in a profile's output. Only the start and stop calls run with fd 2 pointed at
    /dev/null; an error there still raises, and whatever runs between writes as ever."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _profiler_enabled() -> bool:
    enabled = getattr(torch._C._autograd, "_profiler_enabled", None)
    return bool(enabled()) if enabled is not None else bool(
        getattr(torch.autograd.profiler, "_is_profiler_enabled", False))


def cpu_peak(profile) -> tuple[int, int, int]:
    """(peak bytes, bytes still allocated at the end, events) of a finished torch.profiler
    window with profile_memory=True, CPU allocations only, counted from the window's start."""
    events = allocation_events(profile)
    live: dict[int, int] = {}  # ptr -> bytes, allocated in the window and not yet freed
    total = peak = 0
    for _, ptr, size, _ in events:
        if size > 0:
            total += size - live.get(ptr, 0)  # a pointer reused without a free seen: replaced
            live[ptr] = size
            peak = max(peak, total)
        elif ptr in live:
            total -= live.pop(ptr)
    return peak, total, len(events)


def allocation_events(profile) -> list[tuple[int, int, int, int]]:
    """The CPU allocator's events of a finished torch.profiler window (profile_memory=True),
    in time order: (time ns, pointer, +bytes allocated / -bytes freed, c10's running total)."""
    events: list[tuple[int, int, int, int]] = []

    def walk(event) -> None:
        extra = event.extra_fields
        if type(extra).__name__ == "_ExtraFields_Allocation" and extra.device.type == "cpu":
            events.append((event.start_time_ns, extra.ptr, extra.alloc_size,
                           extra.total_allocated))
        for child in event.children:
            walk(child)

    for root in profile.profiler.kineto_results.experimental_event_tree():
        walk(root)
    events.sort(key=lambda e: e[0])
    return events
