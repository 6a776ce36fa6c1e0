"""Overlapped paging on two timelines: compute on one, the page tier's link/flash on the other.

The semantics the simulator, the planner's post-pass (host planner/overlap.py) and the executor
(executor/paging.py) share, instruction by instruction:

  page_in n   issued where the plan puts it: the read is queued on the IO timeline (one IO at a
              time, in plan order) and its bytes are in RAM from the issue on; compute goes on
              and waits for the read only at the first use of n (a compute that reads it, or a
              free or page_out of it). A page_in from "home" reads a param node's group from
              its parameters' home the same way, for the time computing that node takes.
  page_out n  the write is queued on the IO timeline (written behind) and compute goes on; n's
              bytes stay in RAM until the write completes. A node whose page is still on the
              tier from earlier in the step is not written again (the executor skips it too).
  memory      RAM at an instruction is the synchronous model's (the simulator's memory_trace,
              which at a page_out still holds the page) plus the writes still in flight. Before an instruction, the oldest writes are
              waited for while that sum is over the limit (the synchronous peak): overlapping
              never raises the peak, and the wait is part of the step time.
  IO's CPU    an IO needs CPU too (encoding, checksums, the syscalls, the GIL), which comes out of
              compute where no core is spare: each tier has a `compute_share` s in [0, 1]
              (measured by the profiler, profiler/contention.py). While that tier's IO runs,
              compute runs at 1 - s of its speed, so an IO of d seconds that runs wholly beside
              compute delays it by s x d (s = 1: IO stops compute; s = 0: a spare core, the IO
              is free). IO that compute waits for costs no more than the wait. The IO's own
              durations are the profile's (measured alone).
  step time   the makespan: compute time, plus the time compute waits for IO and the compute
              lost to IO's CPU, or the IO timeline's end if later (every write completes before
              the step ends). With every share <= 1 it is never above the synchronous model's
              compute + paging (each moment either computes at full speed or has IO running),
              so the solvers' stop-the-world paging cost stays an upper bound.
"""

from __future__ import annotations

import copy
from collections import deque
from dataclasses import dataclass

COMPUTE, FREE, PAGE_OUT, PAGE_IN = range(4)
OP_CODES = {"compute": COMPUTE, "free": FREE, "page_out": PAGE_OUT, "page_in": PAGE_IN}


@dataclass
class Timeline:
    step_time_s: float  # the makespan
    compute_time_s: float
    io_busy_s: float  # the IO timeline's busy time (reads and writes actually done)
    waited_s: float  # time compute waited on IO (page-ins not arrived, writes holding RAM)
    peak_bytes: int  # RAM at its worst, writes in flight included
    slowed_s: float = 0.0  # compute time lost to the IO's CPU (the tiers' compute_share)

    @property
    def exposed_io_s(self) -> float:
        """What paging adds to the step: waits, and compute lost to the IO's CPU."""
        return self.step_time_s - self.compute_time_s

    @property
    def hidden_share(self) -> float | None:
        """The share of IO time hidden behind compute, at no cost to it (None without IO)."""
        if self.io_busy_s <= 0:
            return None
        return max(0.0, min(1.0, 1.0 - self.exposed_io_s / self.io_busy_s))


def over_limit(ram_bytes: int, in_flight_bytes: int, limit_bytes: int) -> bool:
    """The one rule both sides apply: wait for the oldest write while RAM is over the limit."""
    return ram_bytes + in_flight_bytes > limit_bytes


class _IOBusy:
    """The IO timeline's busy spans (start, end, the tier's compute share), in issue order,
    for running compute at the speed that IO leaves it."""

    def __init__(self, spans=()) -> None:
        self.spans: deque[tuple[float, float, float]] = deque(spans)

    def add(self, start: float, end: float, share: float) -> None:
        if share > 0.0 and end > start:
            self.spans.append((start, end, share))

    def run(self, t: float, work: float) -> float:
        """When `work` seconds of compute started at `t` end: inside a span of share s it
        advances at 1 - s of its speed (not at all at s = 1)."""
        while work > 0.0:
            while self.spans and self.spans[0][1] <= t:
                self.spans.popleft()
            if not self.spans:
                return t + work
            start, end, share = self.spans[0]
            if start > t:  # free until the next span
                if work <= start - t:
                    return t + work
                work -= start - t
                t = start
                continue
            speed = 1.0 - share
            if speed > 0.0 and work <= (end - t) * speed:
                return t + work / speed
            work -= (end - t) * speed
            t = end
        return t


def first_writes(ops: list[tuple[int, int, str | None]]) -> list[bool]:
    """Which instructions write a page: a page_out of a node whose page is still on the tier
    from earlier in the step writes nothing (the executor skips it too)."""
    on_tier: set[tuple[str | None, int]] = set()
    writes = []
    for op, i, tier in ops:
        new = op == PAGE_OUT and (tier, i) not in on_tier
        if new:
            on_tier.add((tier, i))
        writes.append(new)
    return writes


class TimelineRun:
    """The two timelines part-way through a step, to run on instruction by instruction, copy
    and compare: run_timeline runs a whole step in one; the planner's post-pass (host
    planner/overlap.py) runs trial orders on from the state where they part from a base."""

    def __init__(self, deps: list[list[int]], sizes: list[int], time_s: list[float],
                 in_time_s: dict[str, list[float]], out_time_s: dict[str, list[float]],
                 limit_bytes: int, compute_share: dict[str, float] | None = None) -> None:
        self.deps, self.sizes, self.time_s = deps, sizes, time_s
        self.in_time_s, self.out_time_s, self.limit = in_time_s, out_time_s, limit_bytes
        self.shares = compute_share or {}
        self.tc = self.tio = self.waited = self.busy = self.compute = 0.0
        self.arriving: dict[int, float] = {}  # node -> when its page-in completes
        self.writes: deque[tuple[float, int]] = deque()  # (completion, bytes) in issue order
        self.in_flight = self.peak = 0
        self.limit_waits = 0  # writes waited for at the limit so far
        self.io_spans = _IOBusy()

    def copy(self) -> "TimelineRun":
        new = copy.copy(self)  # the costs are shared; the state is not
        new.arriving, new.writes = dict(self.arriving), deque(self.writes)
        new.io_spans = _IOBusy(self.io_spans.spans)
        return new

    def run(self, ops: list[tuple[int, int, str | None]], sync_trace: list[int],
            writes: list[bool], start: int = 0, stop: int | None = None) -> None:
        """Run instructions ops[start:stop], with the synchronous model's RAM at each
        (`sync_trace`, fixed memory included) and which of them write (first_writes)."""
        deps, sizes, time_s, limit = self.deps, self.sizes, self.time_s, self.limit
        in_time_s, out_time_s, shares = self.in_time_s, self.out_time_s, self.shares
        arriving, pending, io_spans = self.arriving, self.writes, self.io_spans
        tc, tio, waited, busy, compute = self.tc, self.tio, self.waited, self.busy, self.compute
        in_flight, peak, limit_waits = self.in_flight, self.peak, self.limit_waits

        def wait_until(t: float) -> None:
            nonlocal tc, waited
            if t > tc:
                waited += t - tc
                tc = t

        for k in range(start, len(ops) if stop is None else stop):
            op, i, tier = ops[k]
            while pending and pending[0][0] <= tc:  # completed: their bytes have left RAM
                in_flight -= pending.popleft()[1]
            if i in arriving and op != COMPUTE and op != PAGE_IN:  # a free or page_out uses it
                wait_until(arriving.pop(i))
            # sync_trace[k] counts a page_out's own bytes (RAM just before it leaves), so the
            # rule runs before its write joins the writes in flight.
            while pending and over_limit(sync_trace[k], in_flight, limit):
                end, nbytes = pending.popleft()
                wait_until(end)
                in_flight -= nbytes
                limit_waits += 1
            peak = max(peak, sync_trace[k] + in_flight)
            if op == PAGE_OUT:
                if writes[k]:
                    start_io = max(tio, tc)
                    tio = start_io + out_time_s[tier][i]
                    busy += tio - start_io
                    io_spans.add(start_io, tio, shares.get(tier, 0.0))
                    pending.append((tio, sizes[i]))
                    in_flight += sizes[i]
            elif op == COMPUTE:
                for d in deps[i]:
                    if d in arriving:
                        wait_until(arriving.pop(d))
                tc = io_spans.run(tc, time_s[i])
                compute += time_s[i]
            elif op == PAGE_IN:
                start_io = max(tio, tc)
                tio = start_io + in_time_s[tier][i]
                busy += tio - start_io
                io_spans.add(start_io, tio, shares.get(tier, 0.0))
                arriving[i] = tio
        self.tc, self.tio, self.waited, self.busy, self.compute = tc, tio, waited, busy, compute
        self.in_flight, self.peak, self.limit_waits = in_flight, peak, limit_waits

    def finish(self) -> Timeline:
        """The step's figures: it ends when every IO has completed."""
        tc = max(self.tc, self.tio, *self.arriving.values())
        waited = self.waited + (tc - self.tc)
        return Timeline(tc, self.compute, self.busy, waited, self.peak,
                        max(0.0, tc - self.compute - waited))

    def lag_behind(self, base: "TimelineRun") -> float | None:
        """d if the rest of any step runs from this state exactly as from `base`'s, d seconds
        later (every time it holds that the rest reads is base's + d; within float rounding),
        else None. Same costs assumed, and the same limit, or none that the rest waits at;
        what is past (IO done, spans over) is ignored, and the totals so far (waited, busy,
        peak) are not compared."""
        tolerance = 1e-12 * max(1.0, abs(self.tc), abs(base.tc))

        def ahead(run: "TimelineRun"):  # what is still to come, relative to compute's time
            tc = run.tc
            return (sorted((i, t - tc) for i, t in run.arriving.items() if t - tc > tolerance),
                    [(end - tc, n) for end, n in run.writes if end - tc > tolerance],
                    [(max(0.0, s - tc), e - tc, share) for s, e, share in run.io_spans.spans
                     if e - tc > tolerance])

        if abs(max(0.0, self.tio - self.tc) - max(0.0, base.tio - base.tc)) > tolerance:
            return None
        for mine, theirs in zip(ahead(self), ahead(base)):
            if len(mine) != len(theirs):
                return None
            for a, b in zip(mine, theirs):
                for x, y in zip(a, b):  # node ids and byte counts exactly, times within rounding
                    if (x != y) if isinstance(x, int) else abs(x - y) > tolerance:
                        return None
        return self.tc - base.tc


def run_timeline(ops: list[tuple[int, int, str | None]], deps: list[list[int]],
                 sizes: list[int], time_s: list[float], in_time_s: dict[str, list[float]],
                 out_time_s: dict[str, list[float]], sync_trace: list[int],
                 limit_bytes: int | None = None,
                 compute_share: dict[str, float] | None = None) -> Timeline:
    """Two timelines over resolved instructions `ops` = (op code, node index, tier), with the
    synchronous model's RAM at each instruction (`sync_trace`, fixed memory included) and
    each tier's compute share (absent: 0)."""
    limit = max(sync_trace, default=0) if limit_bytes is None else limit_bytes
    run = TimelineRun(deps, sizes, time_s, in_time_s, out_time_s, limit, compute_share)
    run.run(ops, sync_trace, first_writes(ops))
    return run.finish()
