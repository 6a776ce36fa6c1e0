"""The board's roofline, measured: its matmul rate, its copy bandwidth, one tiny op's cost.

    rates, method = measure_compute_rates()   # formats.ComputeRates, and how it was measured

The planner costs a node the profile did not time by rescaling the capture's estimate (a
roofline at generic rates, capture/estimate.py) to this board's (costs.board_roofline). A
modelled profile takes the rates from published figures; a measured one measures them here, in
a few MiB, so that a board which cannot hold a plain step of the graph (and so cannot time its
nodes) still gets its own times rather than the estimate's.
"""

from __future__ import annotations

import time

import torch

from ..formats.profile import ComputeRates

MATMUL_SIZE = 256  # 3 x 256 KiB fp32: in any board's cache-and-RAM, 33.6 MFLOP a call
COPY_BYTES = 32 * 2**20  # past a last-level cache (a Pi 4: 1 MiB; a server: tens): DRAM's rate
TINY_CALLS = 2000


def _rate(work_per_call: float, call, window_s: float) -> float:
    """Work per second over the best of 3 windows of repeated calls (the first call warms up)."""
    call()
    best = 0.0
    for _ in range(3):
        calls = 0
        started = time.perf_counter()
        deadline = started + window_s
        while True:
            call()
            calls += 1
            now = time.perf_counter()
            if now >= deadline:
                break
        best = max(best, calls * work_per_call / (now - started))
    return best


def measure_compute_rates(window_s: float = 0.1) -> tuple[ComputeRates, str]:
    """(rates, method), on torch's threads as the executor runs: fp32 matmul FLOP/s, bytes
    copied per second (read + write, as the estimate counts an op's moved bytes), and the
    seconds one op on one-element tensors takes (the dispatcher's cost)."""
    n = MATMUL_SIZE
    a, b, out = torch.randn(n, n), torch.randn(n, n), torch.empty(n, n)
    flops_per_s = _rate(2.0 * n ** 3, lambda: torch.mm(a, b, out=out), window_s)
    elements = COPY_BYTES // 4
    source, target = torch.ones(elements), torch.empty(elements)
    bytes_per_s = _rate(2.0 * COPY_BYTES, lambda: target.copy_(source), window_s)
    x, y, z = torch.ones(1), torch.ones(1), torch.empty(1)

    def tiny_ops() -> None:
        for _ in range(TINY_CALLS):
            torch.add(x, y, out=z)
    op_overhead_s = 1.0 / _rate(TINY_CALLS, tiny_ops, window_s)
    threads = torch.get_num_threads()
    method = (f"best of 3 windows of {window_s:g} s each on {threads} "
              f"thread{'s' if threads != 1 else ''}: "
              f"torch.mm of {n}x{n} fp32 (2n^3 FLOPs a call), copy_ of {COPY_BYTES // 2**20} "
              "MiB fp32 (read + write), torch.add of one-element tensors")
    return ComputeRates(flops_per_s, bytes_per_s, op_overhead_s), method
