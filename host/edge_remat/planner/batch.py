"""Many splits per round, ranked over the whole over-budget stretch: the peak search's opening.

A split takes a tensor out of RAM over an idle gap between two of its uses and recomputes it
before the later one; the inputs the recomputation finds missing (at most MAX_KEPT) stay in RAM
until then. Such splits are scored together, for every tensor and every idle gap between two of its uses, by the RAM over the
budget they would remove per unit of recompute cost, and chosen greedily (lazily re-scored against
the excess that the splits already chosen leave), so one round applies hundreds of them with one
rebuild of the event model. A round never picks a split together with a split of one of its
inputs (that would take the input away from the recomputation). Rounds repeat while they help;
the peak search (feasible.py) finishes with the splits that need inputs kept or recomputed.
"""

from __future__ import annotations

import bisect
import heapq
import time as clock

import numpy as np

from .events import EventSchedule

# rounds stop when one removes less than this share of the excess left
MIN_ROUND_GAIN = 0.02
MAX_KEPT = 32  # inputs a split may keep in RAM longer for its recomputation


def batch_splits(sched: EventSchedule, capacity: int, added: list[list[tuple[int, int]]],
                 deadline: float, max_rounds: int = 500) -> int:
    """Apply rounds of free splits (appending them to `added`); the excess left."""
    excess = sched.excess(capacity)
    for _ in range(max_rounds):
        if excess <= 0 or clock.perf_counter() > deadline:
            break
        moves = _choose_round(sched, capacity, deadline)
        if not moves:
            break
        computes = {u: sorted([*sched.computes[u], stage]) for u, stage in moves}
        touched = set(computes) | {x for u in computes for x in sched.p.deps[u]}
        runs = {x: sched._derive(x, computes.get(x), computes) for x in touched}
        sched.apply(computes, runs)
        added.extend([move] for move in moves)
        after = sched.excess(capacity)
        if after > excess - MIN_ROUND_GAIN * excess:
            excess = after
            break
        excess = after
    return excess


def _choose_round(sched: EventSchedule, capacity: int, deadline: float) -> list[tuple[int, int]]:
    """Splits chosen greedily by excess removed per unit of cost: (node, stage) pairs."""
    p, width, keys = sched.p, sched.width, sched.keys
    level = sched.at - capacity  # RAM over (> 0) or under the budget at each event
    over_count = np.concatenate(([0], np.cumsum(level > 0)))
    # the new compute event is an event too: RAM of the stays across its gap (u's new copy
    # among them, and the inputs kept for it) plus u's workspace
    across = np.append(sched.through, 0) - capacity
    heap = []
    for u in range(p.n):
        if clock.perf_counter() > deadline:
            return []
        uses = sched.use_keys(u)
        for start, end in sched.runs[u]:
            a = start
            for b in uses[bisect.bisect_right(uses, start):bisect.bisect_right(uses, end)]:
                stage = b // width
                recompute = stage * width + 1 + u
                if recompute > a:
                    lo = int(np.searchsorted(keys, a, side="right"))
                    hi = int(np.searchsorted(keys, recompute, side="left"))
                    if over_count[hi] > over_count[lo] and stage not in sched.computes[u]:
                        split = _split(sched, u, lo, hi, recompute, across, level)
                        if split is not None and split[0] > 0:
                            heap.append((-split[0] / (sched.cost[u] + 1e-9), u, stage, split[1]))
                a = b
    heapq.heapify(heap)
    chosen, taken, blocked = [], set(), set()
    while heap:
        score, u, stage, changes = heapq.heappop(heap)
        if u in taken or u in blocked:
            continue
        value = _value(level, changes)
        if value <= 0:
            continue
        fresh = -value / (sched.cost[u] + 1e-9)
        if heap and fresh > heap[0][0]:  # worse than it was: rank it again
            heapq.heappush(heap, (fresh, u, stage, changes))
            continue
        chosen.append((u, stage))
        taken.add(u)
        blocked.update(p.deps[u])  # its inputs must stay where it reads them
        blocked.update(p.users[u])  # its users' recomputations may read it in this gap
        for lo, end, delta in changes:
            if end >= 0:
                level[lo:end] += delta
    return chosen


def _split(sched: EventSchedule, u: int, lo: int, hi: int, recompute: int, across, level):
    """(excess removed, changes) of recomputing u at key `recompute`, out of RAM over events
    lo..hi-1 and with its missing inputs kept until then; None if more than MAX_KEPT are missing.
    changes: (first event, end event, bytes added) ranges; a change at event `hi` with end -1
    stands for the new compute event."""
    p, keys = sched.p, sched.keys
    changes = [(lo, hi, -p.sizes[u])]
    new_event = int(across[hi]) + p.workspace[u]
    for x in p.deps[u]:
        if sched.resident_at(x, recompute):
            continue
        if len(changes) > MAX_KEPT:
            return None
        end = max(e for s, e in sched.runs[x] if s < recompute)
        changes.append((int(np.searchsorted(keys, end, side="right")), hi, p.sizes[x]))
        new_event += p.sizes[x]
    changes.append((hi, -1, new_event))
    return _value(level, changes), changes


def _value(level: np.ndarray, changes) -> int:
    """Excess removed by `changes` against `level`: ranges may overlap, so sum them first."""
    first = min(lo for lo, end, _ in changes if end >= 0)
    last = max(end for _, end, _ in changes)
    removed = 0
    if last > first:
        window = level[first:last]
        after = window.copy()
        for lo, end, delta in changes:
            if end >= 0:
                after[lo - first:end - first] += delta
        removed = int(np.maximum(window, 0).sum() - np.maximum(after, 0).sum())
    return removed - max(0, changes[-1][2])
