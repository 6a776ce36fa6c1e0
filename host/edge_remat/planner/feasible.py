"""The fast feasibility phase: push the RAM peak under the budget by recomputation, on any DAG.

The state of peak splitting (splitting.py) on the event model of events.py: memory is kept only
at the compute events that exist, so a 5,000-node graph costs megabytes, and a move is scored
exactly in O(events) numpy work.

Rounds of many splits at once, ranked over the whole over-budget stretch (batch.py), open the
search; then a move takes a tensor that sits idle at the peak event out of RAM until just
before its next use, recomputing it there; its inputs are kept until then, or recomputed there
too (recursively) where they are gone. Each step scores the candidate moves at the highest
events by the RAM over the budget they remove (summed over events) per unit of recompute cost,
and applies the best. When no move helps, repair (repair.py) widens the moves; when none of
those helps either, ruin and recreate around the events still over the budget (escape.py, from
ESCAPE_MIN_NODES) takes over until the deadline; if RAM is still over, the search has failed
(the caller falls back to an exact solver on small graphs). Recomputations that the end result
does not need are dropped, most expensive first.
"""

from __future__ import annotations

import bisect
import time as clock
from typing import Callable

import numpy as np

from .batch import batch_splits
from .events import EventSchedule, drop_unneeded
from .intervals import decisions_from_intervals
from .problem import Problem
from .repair import repair
from .stages import StageDecision

# (cheapest-per-byte splits scored at one over-budget event, highest events tried): a step
# widens its search level by level only when the narrower one finds no split that helps
# and the most recomputations one split may chain (longer chains are rarely worth their cost
# and take long to build)
SEARCH_LEVELS = ((16, 4, 8), (64, 8, 16), (150, 30, 48), (100_000, 400, 48))
BATCH, BATCH_GAIN = 48, 0.2  # runners-up applied after a step's best while they keep a fifth of its gain
# (an over-budget event often needs dozens of tensors out: rescoring a runner-up is cheap, finding it is not)

# Below this many nodes ruin and recreate (escape.py) is not tried: the exact solvers that
# follow the feasibility phase settle such graphs, and need the time its rounds would take.
ESCAPE_MIN_NODES = 300


class Deadline(Exception):
    """The time limit ran out mid-search."""


def feasible_schedule(p: Problem, time_limit: float = 60.0,
                      left_at: Callable[[EventSchedule], None] | None = None,
                      ) -> list[StageDecision] | None:
    """A schedule within the budget, or None when the search finds none in time. `left_at`,
    where the search fails, is told the schedule it got to (over the budget, but a schedule:
    its peak is a budget that plans, which the no-plan error may name)."""
    deadline = clock.perf_counter() + time_limit
    capacity = p.budget_bytes - p.fixed
    sched, added = EventSchedule(p), []
    try:
        if batch_splits(sched, capacity, added, deadline) > 0 and \
                not peak_search(sched, capacity, added, deadline) and \
                not repair(sched, capacity, added, deadline):
            if p.n < ESCAPE_MIN_NODES:
                return _left(sched, left_at)
            from .escape import reach_budget  # it builds on this module's searches
            reached = reach_budget(sched, capacity, deadline)
            if reached is None:
                return _left(sched, left_at)
            sched = reached
            added = [[(v, t)] for v, stages in enumerate(sched.computes) for t in stages
                     if t != v]
    except Deadline:
        return _left(sched, left_at)
    drop_unneeded(sched, added, capacity, deadline)
    return decisions_from_intervals(p, sched.residencies())


def _left(sched: EventSchedule, left_at: Callable[[EventSchedule], None] | None) -> None:
    if left_at is not None:
        left_at(sched)
    return None


def peak_search(sched: EventSchedule, capacity: int, added: list[list[tuple[int, int]]],
                deadline: float, levels: tuple = SEARCH_LEVELS) -> bool:
    """Split stays at the highest events until RAM fits `capacity` everywhere (True) or no
    split helps (False); the moves applied are appended to `added`. `levels`: the search
    levels tried in turn (a prefix of SEARCH_LEVELS gives up sooner). Raises Deadline."""
    excess = sched.excess(capacity)
    while excess > 0:
        if clock.perf_counter() > deadline:
            raise Deadline()
        for level in levels:
            helpful = _helpful_moves(sched, capacity, excess, *level, deadline)
            if helpful:
                break
        else:
            return False
        best_gain, move, computes, runs, excess = helpful[0]
        sched.apply(computes, runs)
        added.append(move)
        # The runners-up at the same event usually still help: re-score each on the new state
        # (any set of recomputations is a schedule) and take it while it stays nearly as good.
        for _, move, _, _, _ in helpful[1:BATCH]:
            if excess <= 0:
                break
            at, computes, runs = sched.trial(move)
            after = sched.excess(capacity, at)
            gain = (excess - after) / (sum(sched.cost[v] for v, _ in move) + 1e-12)
            if after < excess and gain >= BATCH_GAIN * best_gain:
                sched.apply(computes, runs)
                added.append(move)
                excess = after
    return True


def _helpful_moves(sched: EventSchedule, capacity: int, excess: int, candidates: int,
                   events: int, cascade: int, deadline: float) -> list:
    """(gain, move, computes, runs, excess after) of the splits that remove excess at the
    highest event where any does, best gain (excess removed per unit of cost) first."""
    for q in np.argsort(-sched.at, kind="stable")[:events]:
        if sched.at[q] <= capacity:
            break
        if clock.perf_counter() > deadline:
            raise Deadline()
        helpful = []
        for move in _candidate_moves(sched, int(sched.keys[q]), candidates, cascade):
            at, computes, runs = sched.trial(move)
            after = sched.excess(capacity, at)
            if after < excess:
                gain = (excess - after) / (sum(sched.cost[v] for v, _ in move) + 1e-12)
                helpful.append((gain, move, computes, runs, after))
        if helpful:
            helpful.sort(key=lambda h: -h[0])
            return helpful
    return []


def _candidate_moves(sched: EventSchedule, q: int, limit: int,
                     cascade: int) -> list[list[tuple[int, int]]]:
    """Splits that take an idle tensor out of RAM at event key q: the `limit` cheapest-per-byte
    idle tensors, each with its inputs kept or recomputed."""
    p, width = sched.p, sched.width
    idle = []
    for u in range(p.n):
        for start, end in sched.runs[u]:
            if not start < q < end:
                continue
            uses = sched.use_keys(u)
            if q in uses:
                break  # u is read at q: it must stay
            stage = uses[bisect.bisect_right(uses, q)] // width
            if sched.key(stage, u) > q and stage not in sched.computes[u]:
                idle.append((sched.cost[u] / max(p.sizes[u], 1), u, stage))
            break  # else its next use is in the peak's own stage, before u could be made
    idle.sort()
    scored = []
    for _, u, stage in idle[:limit]:
        seen = set()
        for mode in ("keep", "cascade", "full"):
            move = _with_inputs(sched, u, stage, q, mode, cascade)
            if move is None or tuple(sorted(move)) in seen:
                continue
            seen.add(tuple(sorted(move)))
            cost = sum(sched.cost[v] for v, _ in move)
            scored.append((cost / max(p.sizes[u], 1), len(move), move))
    scored.sort(key=lambda item: (item[0], item[1]))
    return [move for _, _, move in scored]


def _with_inputs(sched: EventSchedule, u: int, stage: int, q: int,
                 mode: str, cascade: int) -> list[tuple[int, int]] | None:
    """Recompute u in `stage`. Its inputs missing there are kept until then ("keep"),
    recomputed there unless keeping them costs nothing at the peak ("cascade"), or recomputed
    there whenever they are not resident there already ("full"). None: a cascade longer than
    `cascade` recomputations."""
    p, runs, computes = sched.p, sched.runs, sched.computes
    base = stage * sched.width + 1

    def resident(x: int, key: int) -> bool:
        for start, end in runs[x]:
            if start <= key <= end:
                return True
        return False

    move, pending, seen = [], [u], {u}
    while pending:
        v = pending.pop()
        if stage in computes[v]:
            continue
        move.append((v, stage))
        if len(move) > cascade:
            return None
        if mode == "keep":
            continue
        at = base + v
        for x in p.deps[v]:
            if x in seen or resident(x, at):
                continue
            if mode == "cascade" and resident(x, q):
                continue  # its stay already covers the peak: extending it is free there
            if base + x <= q:
                continue  # cannot be made after the peak: keep it instead
            seen.add(x)
            pending.append(x)
    return move
