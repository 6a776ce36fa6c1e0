"""What a page tier's IO costs compute that runs beside it: the tier's `compute_share`.

    share = measure_compute_share(store)      # -> ComputeShare; share.share in [0, 1]

The executor pages on an IO thread while the step computes. That thread needs CPU (encoding,
the CRC, the syscalls, the GIL), and where no core is spare, torch's threads plus the machine's
other load, that CPU comes out of compute. So: a fixed compute loop (small torch ops on this
process's torch thread count, Python between them, as the executor runs a step) is timed
alone, then with an IO thread doing the tier's put/get/discard of a page continuously, in
short alternating pairs (the load drifts). The share is pooled over the pairs: their total
slowdown over their total overlapping IO time (pooled_share), clipped to [0, 1] (0: a spare
core, the IO is free; 1: IO stops compute).

Why pooled, not a median of each pair's ratio: a pair whose IO overlapped little divides its
noise by a small time, and on a loaded host (load 5-8 on 2 cores, 2026-12-07) the ratios ran
from -45 to 1.1 and their median clipped to 0, "flash IO is free", which alone made the
planner page 14 tensors a step. Noise still reaches the pooled figure, so it comes with a
bootstrap interval; pairs are added (up to ROUNDS, within max_s) until that interval is
narrow, and where it stays wide the share measured is not used: the share is then the IO
thread's own CPU seconds per second of IO (io_cpu_per_io_s, measured in the same run), what
the IO takes where every CPU second it uses would have been compute's (and where no IO could
be timed at all, 1: the solvers' own stop-the-world model, never 0). `source` and `note` say
which was used and why; the profile keeps them (TierMeasurement.to_dict), and `profile`,
`plan` and `run` say so (formats/profile.py share_notes).
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import asdict, dataclass, field

import torch

from ..pages import PageStore

PAGE_BYTES = 2**20  # a page of the size the executor moves for small models
ROUNDS = 40  # pairs at most; fewer where the interval is narrow sooner
MIN_ROUNDS = 10  # pairs before the interval is judged (a bootstrap of fewer says little)
WINDOW_S = 0.04  # the compute loop's length alone, per pair
MAX_S = 4.0  # no more pairs after this long (a loaded machine's thread pool can stall for seconds)
TRUSTED_WIDTH = 0.3  # the widest 90% interval a measured share is used with


@dataclass
class ComputeShare:
    share: float | None  # the figure the planner uses, in [0, 1]: `source` says which
    rounds: list[float] = field(default_factory=list)  # each pair's ratio, unclipped (pairs
    # where the IO thread ran under a quarter of the window are left out), for the record
    io_cpu_per_io_s: float | None = None  # the IO thread's CPU seconds per second of IO
    page_bytes: int = PAGE_BYTES
    threads: int = 1  # torch's intra-op threads the compute loop ran on
    method: str = ""
    # Profiles before 2026-12-07 have none of these (their share: the median of `rounds`).
    pairs: list[list[float]] = field(default_factory=list)  # [alone_s, beside_s, busy_s]
    measured: float | None = None  # the pooled share, unclipped
    interval: list[float] | None = None  # its 90% bootstrap interval, unclipped
    source: str = "measured"  # "measured" (pooled), or a fallback: "io_cpu" (io_cpu_per_io_s)
    # or "stop_the_world" (1: nothing measured)
    note: str = ""  # why the fallback, in words

    def to_dict(self) -> dict:
        return asdict(self)


def pooled_share(pairs: list[list[float]] | list[tuple[float, float, float]]) -> float | None:
    """Total slowdown over total overlapping IO: sum(beside - alone) / sum(busy). Each pair
    weighs by its IO time, so a pair with little overlap cannot swing it as its ratio would (a
    stall of a second in one pair still can: share_interval then says so)."""
    busy = sum(p[2] for p in pairs)
    return sum(p[1] - p[0] for p in pairs) / busy if busy > 0 else None


def share_interval(pairs, draws: int = 400, level: float = 0.9) -> tuple[float, float] | None:
    """pooled_share's bootstrap interval (pairs resampled; seeded, so the same pairs give the
    same interval): how far the pairs' noise could have moved it."""
    if len(pairs) < 3:
        return None
    rng = random.Random(0)
    estimates = sorted(pooled_share(rng.choices(pairs, k=len(pairs))) or 0.0
                       for _ in range(draws))
    tail = int(draws * (1 - level) / 2)
    return estimates[tail], estimates[draws - 1 - tail]


def clipped(value: float) -> float:
    return min(1.0, max(0.0, value))


def trusted(interval: tuple[float, float] | None, pairs: int) -> bool:
    """The pooled share is used where MIN_ROUNDS pairs or more give an interval at most
    TRUSTED_WIDTH wide (wider, and the noise rather than the IO decides the plan: paging or
    recomputing) and not wholly below 0 (compute faster beside IO: the pairs measured something
    else, a stalled thread pool). The interval is judged unclipped: -9.6 to 0.24 is noise, not
    "0 to 0.24"."""
    return pairs >= MIN_ROUNDS and interval is not None \
        and interval[1] - interval[0] <= TRUSTED_WIDTH and interval[1] >= 0


def judged(pairs, io_cpu_per_io_s: float | None) -> dict:
    """The share from recorded pairs: pooled where trusted, else the IO thread's CPU per IO
    second; ComputeShare's share, measured, interval, source and note."""
    measured, interval = pooled_share(pairs), share_interval(pairs)
    out = {"measured": measured, "interval": list(interval) if interval else None}
    if measured is not None and trusted(interval, len(pairs)):
        return {**out, "share": clipped(measured), "source": "measured", "note": ""}
    if len(pairs) < MIN_ROUNDS:
        why = (f"{len(pairs)} pairs beside compute"
               + (f" gave {measured:.2f}" if measured is not None else "")
               + f", fewer than {MIN_ROUNDS}: too few to judge")
    else:
        why = (f"{len(pairs)} pairs beside compute gave {measured:.2f}, 90% interval "
               f"{interval[0]:.2f} to {interval[1]:.2f} ("
               + ("wholly below 0" if interval[1] < 0 else f"wider than {TRUSTED_WIDTH}")
               + "): too noisy to plan with")
    if io_cpu_per_io_s is None:  # no IO timed at all (a host too loaded to start the pairs):
        # not 0, "free", which the old code planned with; 1 is the solvers' own model of paging
        return {**out, "share": 1.0, "source": "stop_the_world",
                "note": f"{why}, and no IO timed: IO counted as stopping compute"}
    return {**out, "share": clipped(io_cpu_per_io_s), "source": "io_cpu",
            "note": f"{why}, so the IO thread's own CPU per second of IO instead"}


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
    pairs = []
    try:
        for _ in range(rounds):  # short pairs, alone then beside: the machine's load drifts
            if time.perf_counter() - began > max_s or (
                    trusted(share_interval(pairs), len(pairs))):
                break  # out of time, or narrow enough: more pairs would not change the plan
            io.pause()
            alone = _timed(iterations, x)[0]
            io.running.set()
            beside, begin, end = _timed(iterations, x)
            busy = io.busy_within(begin, end)
            if busy > beside / 4:  # else the IO thread hardly ran (not yet scheduled): no pair
                pairs.append([alone, beside, busy])
        if not io.spans:  # no pair got to run the IO (a stalled calibration took the time):
            io.running.set()  # one round of it alone, for its CPU per IO second at least
            until = time.perf_counter() + max_s
            while not io.spans and io.error is None and time.perf_counter() < until:
                time.sleep(0.001)
        io.pause()
    finally:
        io.finish()
    store.discard("compute-share-probe")
    io_s = sum(e - s for s, e in io.spans)
    io_cpu = io.cpu_s / io_s if io_s > 0 else None
    return ComputeShare(
        rounds=[(b - a) / busy for a, b, busy in pairs], io_cpu_per_io_s=io_cpu,
        page_bytes=page_bytes, threads=torch.get_num_threads(), pairs=pairs,
        method=f"a compute loop of {iterations} 64x64 matmul+tanh ops timed alone, then beside "
               f"an IO thread doing put/get/discard of a {page_bytes}-byte page continuously, "
               f"{len(pairs)} alternating pairs; share = their total slowdown over their total "
               f"IO time overlapping it, clipped to [0, 1], where its 90% bootstrap interval "
               f"is at most {TRUSTED_WIDTH} wide, else the IO thread's CPU per IO second",
        **judged(pairs, io_cpu))

