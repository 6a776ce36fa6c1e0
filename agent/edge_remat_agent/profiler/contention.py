"""What a page tier's IO costs compute that runs beside it: the tier's `compute_share`.

    share = measure_compute_share(store)      # -> ComputeShare; share.share in [0, 1]

The executor pages on an IO thread while the step computes. That thread needs CPU (encoding,
the CRC, the syscalls, the GIL), and where no core is spare, torch's threads plus the machine's
other load, that CPU comes out of compute. So: a fixed compute loop (small torch ops on this
process's torch thread count, Python between them, as the executor runs a step) is timed
alone, then with an IO thread doing the tier's put/get/discard of a page continuously, in
short alternating pairs; each pair's share is the compute loop's slowdown over the IO time that
overlapped it, and the tier's share is the median of the pairs, clipped to [0, 1] (0: a spare
core, the IO is free; 1: IO stops compute). The IO thread's own CPU time per second of IO is
kept beside it for the record.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import asdict, dataclass, field

import torch

from ..pages import PageStore

PAGE_BYTES = 2**20  # a page of the size the executor moves for small models
ROUNDS = 20
WINDOW_S = 0.04  # the compute loop's length alone, per pair
MAX_S = 4.0  # no more pairs after this long (a loaded machine's thread pool can stall for seconds)


@dataclass
class ComputeShare:
    share: float | None  # the median pair's slowdown per second of overlapping IO, clipped
    # (None: no pair could be measured in the time allowed)
    rounds: list[float] = field(default_factory=list)  # each pair's, unclipped (pairs where
    # the IO thread ran under a quarter of the window are left out)
    io_cpu_per_io_s: float | None = None  # the IO thread's CPU seconds per second of IO
    page_bytes: int = PAGE_BYTES
    threads: int = 1  # torch's intra-op threads the compute loop ran on
    method: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def compute_loop(iterations: int, x: torch.Tensor) -> None:
    """A fixed piece of compute: small matmuls and elementwise ops, interpreted op by op."""
    y = x
    for _ in range(iterations):
        y = torch.mm(y, x).tanh_()


class _IOThread(threading.Thread):
    """put, get, discard one page while `running` is set, parked (no CPU) while it is not;
    each IO's (start, end) and the thread's CPU time."""

    def __init__(self, store: PageStore, page: torch.Tensor):
        super().__init__(name="compute-share-io", daemon=True)
        self.store, self.page = store, page
        self.spans: list[tuple[float, float]] = []
        self.current: float | None = None  # when the IO under way started
        self.cpu_s = 0.0
        self.running = threading.Event()
        self.parked = threading.Event()
        self.done = False
        self.error: BaseException | None = None

    def run(self) -> None:
        key = "compute-share-probe"
        try:
            while True:
                self.parked.set()
                self.running.wait()
                self.parked.clear()
                if self.done:
                    return
                cpu = time.thread_time()
                while self.running.is_set():
                    for io in (lambda: self.store.put(key, self.page),
                               lambda: self.store.get(key)):
                        self.current = start = time.perf_counter()
                        io()
                        self.spans.append((start, time.perf_counter()))
                        self.current = None
                    self.store.discard(key)
                self.cpu_s += time.thread_time() - cpu
        except BaseException as error:  # re-raised in the measuring thread
            self.error = error
            self.parked.set()

    def pause(self) -> None:
        self.running.clear()
        self.parked.wait()
        if self.error is not None:
            raise self.error

    def finish(self) -> None:
        self.done = True
        self.running.set()
        self.join()

    def busy_within(self, begin: float, end: float) -> float:
        """IO time between begin and end (already past), the IO still under way included."""
        current = self.current
        spans = self.spans + ([(current, end)] if current is not None else [])
        return sum(max(0.0, min(e, end) - max(s, begin)) for s, e in spans)


def _timed(iterations: int, x: torch.Tensor) -> tuple[float, float, float]:
    start = time.perf_counter()
    compute_loop(iterations, x)
    end = time.perf_counter()
    return end - start, start, end


def measure_compute_share(store: PageStore, page_bytes: int = PAGE_BYTES, rounds: int = ROUNDS,
                          window_s: float = WINDOW_S, max_s: float = MAX_S) -> ComputeShare:
    """The store's compute share (module docstring); nothing is left in the store."""
    began = time.perf_counter()
    x = torch.rand(64, 64) / 64  # tanh keeps the values bounded, the loop's cost fixed
    compute_loop(16, x)  # warm-up: the first call starts torch's thread pool
    iterations = 16
    while (min(_timed(iterations, x)[0] for _ in range(2)) < window_s / 2
           and iterations < 1 << 24 and time.perf_counter() - began < max_s / 4):
        iterations *= 2  # calibrated alone: about window_s per timed loop
    page = torch.randint(0, 256, (page_bytes,), dtype=torch.uint8)
    io = _IOThread(store, page)
    io.start()
    shares = []
    try:
        for _ in range(rounds):  # short pairs, alone then beside: the machine's load drifts
            if time.perf_counter() - began > max_s:
                break
            io.pause()
            alone = _timed(iterations, x)[0]
            io.running.set()
            beside, begin, end = _timed(iterations, x)
            busy = io.busy_within(begin, end)
            if busy > beside / 4:  # else the IO thread hardly ran (not yet scheduled): no pair
                shares.append((beside - alone) / busy)
        io.pause()
    finally:
        io.finish()
    store.discard("compute-share-probe")
    io_s = sum(e - s for s, e in io.spans)
    share = min(1.0, max(0.0, statistics.median(shares))) if shares else None
    return ComputeShare(
        share=share, rounds=shares, io_cpu_per_io_s=io.cpu_s / io_s if io_s > 0 else None,
        page_bytes=page_bytes, threads=torch.get_num_threads(),
        method=f"a compute loop of {iterations} 64x64 matmul+tanh ops timed alone, then beside "
               f"an IO thread doing put/get/discard of a {page_bytes}-byte page continuously, "
               f"{len(shares)} alternating pairs; share = the median pair's slowdown over the IO "
               f"time overlapping it, clipped to [0, 1]")
