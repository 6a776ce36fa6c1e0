"""The fast feasibility phase: push the RAM peak under the budget by recomputation, on any DAG.

The same state as peak splitting (splitting.py): which stages compute each node; each copy of a
tensor stays in RAM from its compute to its last use before the node's next copy, so memory is a
function of the compute sets and every choice of compute sets is a schedule. What differs is the
timeline: memory is kept only at the compute events that exist (n + recomputations), not on the
n x (n + 1) slots a stage could hold, so a 5,000-node graph costs megabytes, not gigabytes, and
a move is scored exactly in O(events) numpy work.

A move takes a tensor that sits idle at the peak event out of RAM until just before its next
use, recomputing it there; its inputs are kept until then, or recomputed there too (recursively)
where they are gone. Each step scores the candidate moves at the highest events by the RAM over
the budget they remove (summed over events) per unit of recompute cost, and applies the best.
When no move helps, the search has failed (the caller falls back to an exact solver on small
graphs). Recomputations that the end result does not need are dropped, most expensive first.
"""

from __future__ import annotations

import bisect
import time as clock

import numpy as np

from .intervals import COMPUTE, Residency, decisions_from_intervals
from .problem import Problem
from .stages import StageDecision

# (cheapest-per-byte splits scored at one over-budget event, highest events tried): a step
# widens its search level by level only when the narrower one finds no split that helps
# and the most recomputations one split may chain (longer chains are rarely worth their cost
# and take long to build)
SEARCH_LEVELS = ((16, 4, 8), (64, 8, 16), (150, 30, 48), (100_000, 400, 48))
BATCH, BATCH_GAIN = 8, 0.5  # runners-up applied after a step's best, if nearly as good


def node_costs(p: Problem) -> list[float]:
    """What one more compute of each node adds to the objective."""
    c = p.costs
    if p.objective == "time":
        return list(c.time_s)
    return [e + c.static_w * t for e, t in zip(c.energy_j, c.time_s)]


class EventSchedule:
    """Compute sets, the stays they imply, and RAM at each compute event."""

    def __init__(self, p: Problem):
        self.p, self.width = p, p.n + 1
        self.cost = node_costs(p)
        self.computes: list[list[int]] = [[v] for v in range(p.n)]
        self.runs: list[list[tuple[int, int]]] = [self._derive(v) for v in range(p.n)]
        self.rebuild()

    def key(self, stage: int, v: int) -> int:
        """The slot of `intervals.Timeline`: decisions_from_intervals reads these."""
        return stage * self.width + 1 + v

    def use_keys(self, v: int) -> list[int]:
        return sorted(self.key(t, k) for k in self.p.users[v] for t in self.computes[k])

    def _derive(self, v: int, computes: list[int] | None = None,
                user_computes: dict[int, list[int]] | None = None) -> list[tuple[int, int]]:
        """The stays of v: each copy from its compute to its last use before the next copy."""
        computes = self.computes[v] if computes is None else computes
        uses = sorted(self.key(t, k) for k in self.p.users[v]
                      for t in (user_computes.get(k, self.computes[k]) if user_computes
                                else self.computes[k]))
        starts = [self.key(t, v) for t in computes]
        runs = []
        for i, start in enumerate(starts):
            limit = starts[i + 1] if i + 1 < len(starts) else 1 << 62
            lo, hi = bisect.bisect_right(uses, start), bisect.bisect_left(uses, limit)
            runs.append((start, uses[hi - 1] if hi > lo else start))
        return runs

    def rebuild(self) -> None:
        """RAM at each event (stays covering it + the computing node's workspace), and the RAM
        of the stays that span each gap between consecutive events."""
        p = self.p
        event_keys, event_ws = [], []
        for v in range(p.n):
            for t in self.computes[v]:
                event_keys.append(self.key(t, v))
                event_ws.append(p.workspace[v])
        order = np.argsort(event_keys, kind="stable")
        self.keys = np.asarray(event_keys, dtype=np.int64)[order]
        workspace = np.asarray(event_ws, dtype=np.int64)[order]
        starts, ends, sizes = self._run_arrays(range(p.n))
        self.at, self.through = self._coverage(self.keys, starts, ends, sizes)
        self.at += workspace

    def _run_arrays(self, nodes, runs=None):
        starts, ends, sizes = [], [], []
        for v in nodes:
            for s, e in (runs[v] if runs is not None else self.runs[v]):
                starts.append(s)
                ends.append(e)
                sizes.append(self.p.sizes[v])
        return (np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64),
                np.asarray(sizes, dtype=np.int64))

    @staticmethod
    def _coverage(keys, starts, ends, sizes):
        """Sum of sizes of stays [start, end] at each key, and across each gap (keys[g-1], keys[g])."""
        count = len(keys)
        si = np.searchsorted(keys, starts, side="left")
        ei = np.searchsorted(keys, ends, side="right") - 1
        at = np.zeros(count + 1, dtype=np.int64)
        np.add.at(at, si, sizes)
        np.add.at(at, ei + 1, -sizes)
        through = np.zeros(count + 1, dtype=np.int64)
        np.add.at(through, si + 1, sizes)
        np.add.at(through, ei + 1, -sizes)
        return np.cumsum(at)[:count], np.cumsum(through)[:count]

    def excess(self, capacity: int, at=None) -> int:
        at = self.at if at is None else at
        return int(np.maximum(at - capacity, 0).sum())

    def resident_at(self, v: int, key: int) -> bool:
        return any(s <= key <= e for s, e in self.runs[v])

    def trial(self, move: list[tuple[int, int]]):
        """RAM at every event (old and new) if `move` (recomputations) were applied."""
        p = self.p
        touched = {v for v, _ in move} | {x for v, _ in move for x in p.deps[v]}
        computes = {v: list(self.computes[v]) for v, _ in move}
        for v, t in move:
            bisect.insort(computes[v], t)
        new_runs = {x: self._derive(x, computes.get(x), computes) for x in touched}
        added = np.asarray(sorted(self.key(t, v) for v, t in move), dtype=np.int64)
        positions = np.searchsorted(self.keys, added)
        keys = np.insert(self.keys, positions, added)
        # a new event sees the stays spanning the gap it falls in (none after the last event)
        spanning = np.where(positions < len(self.at),
                            self.through[np.minimum(positions, max(len(self.at) - 1, 0))], 0)
        base = np.insert(self.at, positions, spanning)
        old = self._run_arrays(touched)
        new = self._run_arrays(touched, new_runs)
        at_old, _ = self._coverage(keys, *old)
        at_new, _ = self._coverage(keys, *new)
        at = base - at_old + at_new
        ws = np.asarray([p.workspace[v] for v, t in sorted(move, key=lambda m: self.key(m[1], m[0]))],
                        dtype=np.int64)
        at[positions + np.arange(len(positions))] += ws
        return at, computes, new_runs

    def apply(self, computes: dict[int, list[int]], new_runs: dict[int, list]) -> None:
        for v, c in computes.items():
            self.computes[v] = c
        for x, runs in new_runs.items():
            self.runs[x] = runs
        self.rebuild()

    def drop(self, v: int, t: int) -> None:
        self.computes[v].remove(t)
        for x in {v, *self.p.deps[v]}:
            self.runs[x] = self._derive(x)
        self.rebuild()

    def residencies(self) -> list[list[Residency]]:
        return [[Residency(s, e, COMPUTE) for s, e in runs] for runs in self.runs]


def feasible_schedule(p: Problem, time_limit: float = 60.0) -> list[StageDecision] | None:
    """A schedule within the budget, or None when the search finds none in time."""
    started = clock.perf_counter()
    sched = EventSchedule(p)
    capacity = p.budget_bytes - p.fixed
    added: list[list[tuple[int, int]]] = []
    excess = sched.excess(capacity)
    while excess > 0:
        if clock.perf_counter() - started > time_limit:
            return None
        for level in SEARCH_LEVELS:
            helpful = _helpful_moves(sched, capacity, excess, *level)
            if helpful:
                break
        else:
            return None
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
    _drop_unneeded(sched, added, capacity)
    return decisions_from_intervals(p, sched.residencies())


def _helpful_moves(sched: EventSchedule, capacity: int, excess: int, candidates: int,
                   events: int, cascade: int) -> list:
    """(gain, move, computes, runs, excess after) of the splits that remove excess at the
    highest event where any does, best gain (excess removed per unit of cost) first."""
    for q in np.argsort(-sched.at, kind="stable")[:events]:
        if sched.at[q] <= capacity:
            break
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


def _drop_unneeded(sched: EventSchedule, added: list[list[tuple[int, int]]],
                   capacity: int) -> None:
    """Undo recomputations the budget turned out not to need, most expensive first."""
    for v, t in sorted((m for move in added for m in move), key=lambda m: -sched.cost[m[0]]):
        if t not in sched.computes[v]:
            continue
        saved = list(sched.computes[v]), {x: list(sched.runs[x]) for x in {v, *sched.p.deps[v]}}
        sched.drop(v, t)
        if int(sched.at.max(initial=0)) > capacity:
            sched.computes[v] = saved[0]
            for x, runs in saved[1].items():
                sched.runs[x] = runs
            sched.rebuild()


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
    p = sched.p
    move, pending, seen = [], [u], {u}
    while pending:
        v = pending.pop()
        if stage in sched.computes[v]:
            continue
        move.append((v, stage))
        if len(move) > cascade:
            return None
        at = sched.key(stage, v)
        for x in p.deps[v]:
            if mode == "keep" or x in seen or sched.resident_at(x, at):
                continue
            if mode == "cascade" and sched.resident_at(x, q):
                continue  # its stay already covers the peak: extending it is free there
            if sched.key(stage, x) <= q:
                continue  # cannot be made after the peak: keep it instead
            seen.add(x)
            pending.append(x)
    return move
