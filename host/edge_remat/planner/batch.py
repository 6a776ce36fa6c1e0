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

MAX_KEPT = 32  # inputs a split may keep in RAM longer for its recomputation
REMAKE_DEPTH, MAX_CHAIN = 2, 24  # how deep and how long a chain of recomputations may be


def batch_splits(sched: EventSchedule, capacity: int, added: list[list[tuple[int, int]]],
                 deadline: float, max_rounds: int = 500) -> int:
    """Apply rounds of splits (appending them to `added`) while they help; the excess left."""
    excess = sched.excess(capacity)
    for _ in range(max_rounds):
        if excess <= 0 or clock.perf_counter() > deadline:
            break
        moves = _choose_round(sched, capacity, deadline)
        if not moves:
            break
        computes = {v: sorted([*sched.computes[v], stage]) for move in moves for v, stage in move}
        touched = set(computes) | {x for v in computes for x in sched.p.deps[v]}
        runs = {x: sched._derive(x, computes.get(x), computes) for x in touched}
        undo = ({v: sched.computes[v] for v in computes}, {x: sched.runs[x] for x in touched})
        sched.apply(computes, runs)
        after = sched.excess(capacity)
        if after < excess:
            added.extend(moves)
            excess = after
            continue
        # the round's estimates missed how its splits interact: undo it, and take its splits
        # one at a time, each scored exactly on the schedule as it is
        sched.apply(*undo)
        progress = False
        for move in moves:
            at, computes, runs = sched.trial(move)
            after = sched.excess(capacity, at)
            if after < excess:
                sched.apply(computes, runs)
                added.append(move)
                excess, progress = after, True
        if not progress:
            break
    return excess


def _choose_round(sched: EventSchedule, capacity: int,
                  deadline: float) -> list[list[tuple[int, int]]]:
    """Splits chosen greedily by excess removed per unit of cost: moves, (node, stage) pairs."""
    p, width, keys = sched.p, sched.width, sched.keys
    level = sched.at - capacity  # RAM over (> 0) or under the budget at each event
    over_count = np.concatenate(([0], np.cumsum(level > 0)))
    # the new compute event is an event too: RAM of the stays across its gap (u's new copy
    # among them, and the inputs kept for it) plus u's workspace
    across = np.append(sched.through, 0) - capacity
    # plain lists for the hundreds of thousands of scalar lookups below (numpy's per-call
    # overhead was most of a round's time at 5000 nodes)
    key_list, over_list, across_list = keys.tolist(), over_count.tolist(), across.tolist()
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
                    lo = bisect.bisect_right(key_list, a)
                    hi = bisect.bisect_left(key_list, recompute)
                    if over_list[hi] > over_list[lo] and stage not in sched.computes[u]:
                        missing = [x for x in p.deps[u] if not sched.resident_at(x, recompute)]
                        if len(missing) > MAX_KEPT:
                            a = b
                            continue
                        kept_from: dict[int, int] = {}  # shared by both variants
                        for remake in (False, True) if missing else (False,):
                            split = _split(sched, u, stage, lo, hi, missing, kept_from,
                                           key_list, across_list, level, remake)
                            if split is not None and split[0] > 0:
                                cost = sum(sched.cost[v] for v, _ in split[1]) + 1e-9
                                heap.append((-split[0] / cost, u, cost, split[1], split[2]))
                a = b
    heapq.heapify(heap)
    chosen, taken, blocked = [], set(), set()
    while heap:
        score, u, cost, move, changes = heapq.heappop(heap)
        nodes = [v for v, _ in move]
        if any(v in taken or v in blocked for v in nodes):
            continue
        value = _value(level, changes)
        if value <= 0:
            continue
        fresh = -value / cost
        if heap and fresh > heap[0][0]:  # worse than it was: rank it again
            heapq.heappush(heap, (fresh, u, cost, move, changes))
            continue
        chosen.append(move)
        taken.update(nodes)
        for v in nodes:
            blocked.update(p.deps[v])  # its inputs must stay where it reads them
        blocked.update(p.users[u])  # u's users' recomputations may read it in this gap
        for lo, end, delta in changes:
            if end >= 0:
                level[lo:end] += delta
    return chosen


def _split(sched: EventSchedule, u: int, stage: int, lo: int, hi: int, missing: list[int],
           kept_from: dict[int, int], keys: list[int], across: list[int], level, remake: bool):
    """(excess removed, move, changes) of recomputing u in `stage`, out of RAM over events
    lo..hi-1. Its `missing` inputs (not resident there) stay in RAM until then, or (`remake`)
    are recomputed just before it where their own inputs are in RAM; None where remaking
    recomputes none of them (the same split as keeping them). `kept_from`: a kept input's
    first event after its stay, filled in here. changes: (first event, end event, bytes added)
    ranges; (event, -1, RAM) stands for a new compute event placed before that event."""
    p, width = sched.p, sched.width
    recompute = stage * width + 1 + u
    move, changes = [(u, stage)], [(lo, hi, -p.sizes[u])]
    new_event = across[hi] + p.workspace[u]
    for x in missing:
        chain = _remake_chain(sched, x, stage, REMAKE_DEPTH, {v for v, _ in move}) \
            if remake else None
        if chain is not None and len(move) + len(chain) <= MAX_CHAIN:
            for w in chain:
                first = bisect.bisect_left(keys, stage * width + 1 + w)
                move.append((w, stage))
                changes.append((first, -1, across[first] + p.sizes[w] + p.workspace[w]))
                if w != x:
                    changes.append((first, hi, p.sizes[w]))
            first = bisect.bisect_left(keys, stage * width + 1 + x)
        else:
            first = kept_from.get(x)
            if first is None:
                end = max(e for s, e in sched.runs[x] if s < recompute)
                first = kept_from[x] = bisect.bisect_right(keys, end)
        changes.append((first, hi, p.sizes[x]))
        new_event += p.sizes[x]
    if remake and len(move) == 1:
        return None  # the same split as without remaking
    changes.append((hi, -1, new_event))
    return _value(level, changes), move, changes


def _remake_chain(sched: EventSchedule, x: int, stage: int, depth: int,
                  planned: set[int]) -> list[int] | None:
    """x and the missing inputs it needs recomputed in `stage` (to `depth` levels), or None.
    `planned`: the nodes already in the move; the chain's own are added to it (the caller
    builds it afresh for each chain)."""
    if stage in sched.computes[x]:
        return None
    if x in planned:
        return []
    at = stage * sched.width + 1 + x
    chain = [x]
    planned.add(x)
    for y in sched.p.deps[x]:
        if y in planned or sched.resident_at(y, at):
            continue
        if depth <= 0:
            return None
        sub = _remake_chain(sched, y, stage, depth - 1, planned)
        if sub is None:
            return None
        chain.extend(sub)
    return chain


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
    return removed - sum(max(0, delta) for _, end, delta in changes if end < 0)
