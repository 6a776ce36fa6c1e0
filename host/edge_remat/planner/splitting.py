"""Peak splitting: a rematerialization heuristic that works on the whole step at once.

The state is which stages compute each node (every node in its own stage, plus recomputations).
Given that, each copy of a tensor stays in RAM from its compute to its last use before the next
recompute of the same node, so memory is a function of the compute sets alone, and every choice
of compute sets is a valid schedule (a recomputation's inputs simply stay until it has run).

Starting from the plain schedule, repeat: find the slot where RAM peaks, and split the stay of a
tensor that sits there idle by recomputing it just before its next use (recomputing its own
inputs too where keeping them would cover the peak instead), choosing the split that frees the
peak for the least recompute cost. Then drop recomputations that the final budget does not need.
Unlike the stage-by-stage greedy baselines it never paints itself into a corner, because the
peak it attacks is the real one; it is the CP-SAT planner's starting point on hard graphs.
"""

from __future__ import annotations

import bisect
import time as clock

import numpy as np

from .intervals import COMPUTE, Residency, Timeline, decisions_from_intervals
from .problem import Problem
from .stages import StageDecision

MAX_MOVES_TRIED = 24  # cheapest-per-byte splits whose effect is measured, per step
MAX_PEAKS_TRIED = 8  # over-budget stages tried, highest first, when no split helps at the peak


class _State:
    def __init__(self, p: Problem):
        self.p, self.line = p, Timeline(p.n)
        self.computes: list[list[int]] = [[v] for v in range(p.n)]  # sorted stages
        self.usage = np.zeros(self.line.horizon + 1, dtype=np.int64)
        self.runs: list[list[tuple[int, int]]] = [[] for _ in range(p.n)]
        for v in range(p.n):
            self._set_runs(v, self._derive(v), +1)
            self._workspace(v, v, +1)

    def use_slots(self, v: int) -> list[int]:
        line = self.line
        return sorted(line.compute(t, k) for k in self.p.users[v] for t in self.computes[k])

    def _derive(self, v: int) -> list[tuple[int, int]]:
        """The stays of v: each copy from its compute to its last use before the next copy."""
        line, uses = self.line, self.use_slots(v)
        starts = [line.compute(t, v) for t in self.computes[v]]
        runs = []
        for i, start in enumerate(starts):
            limit = starts[i + 1] if i + 1 < len(starts) else line.horizon
            lo, hi = bisect.bisect_right(uses, start), bisect.bisect_left(uses, limit)
            runs.append((start, uses[hi - 1] if hi > lo else start))
        return runs

    def _set_runs(self, v: int, runs: list[tuple[int, int]], sign: int) -> None:
        size = self.p.sizes[v]
        if sign < 0:
            runs = self.runs[v]
        for start, end in runs:
            self.usage[start:end + 1] += sign * size
        self.runs[v] = runs if sign > 0 else []

    def _workspace(self, v: int, t: int, sign: int) -> None:
        if self.p.workspace[v]:
            self.usage[self.line.compute(t, v)] += sign * self.p.workspace[v]

    def apply(self, additions: list[tuple[int, int]], sign: int = +1) -> None:
        """Add (sign=+1) or remove (sign=-1) recomputations, and re-derive the affected stays."""
        touched = {v for v, _ in additions} | {x for v, _ in additions for x in self.p.deps[v]}
        for v in touched:
            self._set_runs(v, [], -1)
        for v, t in additions:
            if sign > 0:
                bisect.insort(self.computes[v], t)
            else:
                self.computes[v].remove(t)
            self._workspace(v, t, sign)
        for v in touched:
            self._set_runs(v, self._derive(v), +1)

    def excess(self, capacity: int) -> int:
        """RAM over the capacity, summed over slots: what the splits drive to zero."""
        return int(np.maximum(self.usage - capacity, 0).sum())

    def resident_at(self, v: int, slot: int) -> bool:
        return any(start <= slot <= end for start, end in self.runs[v])

    def residencies(self) -> list[list[Residency]]:
        return [[Residency(s, e, COMPUTE) for s, e in runs] for runs in self.runs]


def peak_split(p: Problem, deadline: float | None = None) -> list[StageDecision] | None:
    """A schedule within the budget, or None (no split helps, or `deadline`, a perf_counter
    time, passed)."""
    state = _State(p)
    capacity = p.budget_bytes - p.fixed
    added: list[list[tuple[int, int]]] = []
    excess = state.excess(capacity)
    while excess > 0:
        if deadline is not None and clock.perf_counter() > deadline:
            return None
        best = _best_split(state, capacity, excess, deadline)
        if best is None:
            return None
        state.apply(best[1])
        added.append(best[1])
        excess = best[2]
    # Undo recomputations the budget turned out not to need, most expensive first.
    for move in sorted(added, key=lambda m: -_cost(p, m)):
        state.apply(move, -1)
        if int(state.usage.max()) > capacity:
            state.apply(move)
    return decisions_from_intervals(p, state.residencies())


def _best_split(state: _State, capacity: int, excess: int, deadline: float | None):
    """(gain, move, excess after) of the split that removes the most excess per unit of
    recompute cost at the highest slot where any split helps; None if none does anywhere.
    The cheapest MAX_MOVES_TRIED moves at the peak are scored first; only when none of them
    helps (each raises other slots more than it frees) are all moves, then lower slots, tried."""
    usage, p = state.usage, state.p
    over = np.flatnonzero(usage > capacity)
    peaks = over[np.argsort(-usage[over], kind="stable")]
    seen_stages: set[int] = set()
    for level, q in enumerate(peaks):
        stage = state.line.stage(int(q))
        if level and stage in seen_stages:
            continue  # one slot per stage: its neighbours share the same idle tensors
        seen_stages.add(stage)
        if len(seen_stages) > MAX_PEAKS_TRIED or (deadline is not None and level
                                                  and clock.perf_counter() > deadline):
            return None
        moves = _candidate_moves(state, int(q))
        for tried in (moves[:MAX_MOVES_TRIED], moves[MAX_MOVES_TRIED:]) if level == 0 \
                else (moves,):
            best = None
            for move in tried:
                state.apply(move)
                after = state.excess(capacity)
                state.apply(move, -1)
                if after < excess:
                    gain = (excess - after) / (_cost(p, move) + 1e-12)
                    if best is None or gain > best[0]:
                        best = (gain, move, after)
            if best is not None:
                return best
    return None


def _cost(p: Problem, move: list[tuple[int, int]]) -> float:
    return sum(p.costs.time_s[v] for v, _ in move)


def _candidate_moves(state: _State, q: int) -> list[list[tuple[int, int]]]:
    """Splits that take an idle tensor out of RAM at slot q, cheapest per byte first."""
    p, line = state.p, state.line
    scored = []
    for u in range(p.n):
        for start, end in state.runs[u]:
            if not start < q < end:
                continue
            uses = state.use_slots(u)
            if q in uses:
                break  # u is read at q: it must stay
            after = uses[bisect.bisect_right(uses, q)]
            stage = line.stage(after)
            if line.compute(stage, u) <= q:
                break  # the next use is in the peak's own stage, before which u cannot be made
            for keep_inputs in (False, True):
                move = _with_inputs(state, u, stage, q, keep_inputs)
                scored.append((_cost(p, move) / max(p.sizes[u], 1), len(move), move))
            break
    scored.sort(key=lambda item: (item[0], item[1]))
    return [move for _, _, move in scored]


def _with_inputs(state: _State, u: int, stage: int, q: int,
                 keep_inputs: bool) -> list[tuple[int, int]]:
    """Recompute u in `stage`; its missing inputs are kept until then (keep_inputs), or else
    recomputed there too where keeping them would cover the peak."""
    p, line = state.p, state.line
    move, pending, seen = [], [u], {u}
    while pending:
        v = pending.pop()
        if stage in state.computes[v]:
            continue
        move.append((v, stage))
        at = line.compute(stage, v)
        for x in p.deps[v]:
            if keep_inputs or x in seen or state.resident_at(x, at) or state.resident_at(x, q):
                continue  # available there, or its stay already covers the peak anyway
            if line.compute(stage, x) <= q:
                continue  # cannot be made after the peak: keep it instead
            seen.add(x)
            pending.append(x)
    return move
