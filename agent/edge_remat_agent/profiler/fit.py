"""Fit a transfer cost line, time = latency + bytes / bandwidth, to measured (size, time) points.

Weighted least squares on *relative* residuals: plain least squares would let the 64 MiB points
(seconds) drown the 4 KiB ones (microseconds), leaving the latency, which the small points
decide, to noise and often below zero. Writes and reads are fitted separately: with fsync a
flash write's latency is milliseconds while a read's is microseconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class LineFit:
    latency_s: float
    bytes_per_s: float
    max_relative_error: float  # worst |model - measured| / measured over the points


def fit_line(sizes: Sequence[int], times: Sequence[float]) -> LineFit:
    if not sizes or len(sizes) != len(times):
        raise ValueError("need the same, non-zero number of sizes and times")
    if min(times) <= 0 or min(sizes) <= 0:
        raise ValueError("sizes and times must be > 0")
    latency, inverse_bandwidth = _relative_least_squares(sizes, times)
    if latency < 0 or inverse_bandwidth <= 0:
        # One size, or too much noise for an intercept: a line through the origin (still
        # relative least squares), which at worst overstates small transfers.
        latency = 0.0
        inverse_bandwidth = sum(n / t for n, t in zip(sizes, times)) / \
            sum((n / t) ** 2 for n, t in zip(sizes, times))
    error = max(abs(latency + n * inverse_bandwidth - t) / t for n, t in zip(sizes, times))
    return LineFit(latency, 1.0 / inverse_bandwidth, error)


def _relative_least_squares(sizes: Sequence[int], times: Sequence[float]) -> tuple[float, float]:
    """(a, b) minimising sum(((a + b*n - t) / t)^2); (0, 0) when sizes do not vary."""
    if len(set(sizes)) < 2:
        return 0.0, 0.0
    scale = float(max(sizes))  # keeps the normal equations near 1 (sizes reach 1e8)
    s00 = s01 = s11 = r0 = r1 = 0.0
    for n, t in zip(sizes, times):
        x0, x1 = 1.0 / t, n / scale / t  # each row divided by t: the relative residual
        s00, s01, s11 = s00 + x0 * x0, s01 + x0 * x1, s11 + x1 * x1
        r0, r1 = r0 + x0, r1 + x1  # right-hand side: (t / t) times the row
    det = s00 * s11 - s01 * s01
    if det <= 0:
        return 0.0, 0.0
    return (r0 * s11 - r1 * s01) / det, (s00 * r1 - s01 * r0) / det / scale
