"""What the benchmarks that time a few ways of moving the same bytes share (weight_reads.py,
page_reads.py, page_writes.py): a timed call, and a table row of each way's median and rate
at one size."""

from __future__ import annotations

import statistics
import time
from typing import Callable

MiB = 2**20


def timed(action: Callable[[], object]) -> float:
    begin = time.perf_counter()
    action()
    return time.perf_counter() - begin


def median_row(times: dict[tuple[str, int], list[float]], ways: tuple[str, ...], nbytes: int
               ) -> tuple[dict[str, float], str]:
    """Each way's median seconds at `nbytes`, and the row's cells: "ms (MB/s)" a way."""
    medians = {way: statistics.median(times[way, nbytes]) for way in ways}
    cells = " ".join(f"{medians[w] * 1e3:9.1f} ms ({nbytes / medians[w] / 1e6:5.0f})"
                     for w in ways)
    return medians, cells
