"""The event model of a schedule: compute sets, the stays they imply, and RAM at each compute.

The state of peak splitting (splitting.py) and of the large-graph search (feasible.py):
which stages compute each node; each copy of a tensor stays in RAM from its compute
to its last use before the node's next copy, so memory is a function of the compute sets and
every choice of compute sets is a schedule. Memory is kept only at the compute events that exist
(n + recomputations), not on the n x (n + 1) slots a stage could hold, so a 5,000-node graph
costs megabytes, not gigabytes, and a change is scored exactly in O(events) numpy work.
"""

from __future__ import annotations

import bisect
import time as clock

import numpy as np

from .intervals import COMPUTE, Residency
from .problem import Problem


def node_costs(p: Problem) -> list[float]:
    """What one more compute of each node adds to the objective."""
    c = p.costs
    if p.objective == "time":
        return list(c.time_s)
    return [e + c.static_w * t for e, t in zip(c.energy_j, c.time_s)]


def recompute_cost(sched: "EventSchedule") -> float:
    """The cost of a schedule's recomputations (each node's computes beyond its first)."""
    return sum(sched.cost[v] * (len(stages) - 1) for v, stages in enumerate(sched.computes))


class EventSchedule:
    """Compute sets, the stays they imply, and RAM at each compute event."""

    def __init__(self, p: Problem, computes: list[list[int]] | None = None):
        self.p, self.width = p, p.n + 1
        self.cost = node_costs(p)
        self.computes: list[list[int]] = [list(c) for c in computes] if computes is not None \
            else [[v] for v in range(p.n)]
        self._uses: dict[int, list[int]] = {}  # use_keys, dropped when a user's computes change
        self.runs: list[list[tuple[int, int]]] = [self._derive(v) for v in range(p.n)]
        self.rebuild()

    def key(self, stage: int, v: int) -> int:
        """The slot of `intervals.Timeline`: decisions_from_intervals reads these."""
        return stage * self.width + 1 + v

    def use_keys(self, v: int) -> list[int]:
        uses = self._uses.get(v)
        if uses is None:
            width = self.width
            uses = self._uses[v] = sorted(t * width + 1 + k for k in self.p.users[v]
                                          for t in self.computes[k])
        return uses

    def _computes_changed(self, nodes) -> None:
        for v in nodes:
            for x in self.p.deps[v]:
                self._uses.pop(x, None)

    def _derive(self, v: int, computes: list[int] | None = None,
                user_computes: dict[int, list[int]] | None = None) -> list[tuple[int, int]]:
        """The stays of v: each copy from its compute to its last use before the next copy."""
        computes = self.computes[v] if computes is None else computes
        width = self.width
        if user_computes and any(k in user_computes for k in self.p.users[v]):
            uses = sorted(t * width + 1 + k for k in self.p.users[v]
                          for t in user_computes.get(k, self.computes[k]))
        else:
            uses = self.use_keys(v)
        starts = [t * width + 1 + v for t in computes]
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
        """RAM over `capacity`, summed over the events: what the searches drive to zero."""
        at = self.at if at is None else at
        return int(np.maximum(at - capacity, 0).sum())

    def resident_at(self, v: int, key: int) -> bool:
        for start, end in self.runs[v]:
            if start <= key <= end:
                return True
        return False

    def trial(self, move: list[tuple[int, int]]):
        """RAM at every event (old and new) if `move` (recomputations) were applied."""
        p = self.p
        # a runner-up scored before the best move may hold a compute that move has made since:
        # a node computes once per stage
        move = sorted({(v, t) for v, t in move if t not in self.computes[v]})
        touched = {v for v, _ in move} | {x for v, _ in move for x in p.deps[v]}
        computes = {v: list(self.computes[v]) for v, _ in move}
        for v, t in move:
            bisect.insort(computes[v], t)
        new_runs = {x: self._derive(x, computes.get(x), computes) for x in touched}
        _, at = self._after(computes, new_runs)
        return at, computes, new_runs

    def trial_changes(self, changes: dict[int, list[int]]):
        """As `trial`, for any new compute sets (`changes`: node -> its stages, ascending, its
        own stage among them): computes removed as well as added. (at, new runs)."""
        touched = set(changes) | {x for v in changes for x in self.p.deps[v]}
        new_runs = {x: self._derive(x, changes.get(x), changes) for x in touched}
        _, at = self._after(changes, new_runs)
        return at, new_runs

    def apply(self, computes: dict[int, list[int]], new_runs: dict[int, list]) -> None:
        """Take new compute sets (`computes`: node -> its stages; computes added, removed or
        both) with the stays they imply (`new_runs`: every node whose stays change), updating
        RAM by the touched stays alone, no rebuild (which a search's every step paid, half of
        the LNS's time at 1000 nodes)."""
        keys, at, through = self._after(computes, new_runs, through=True)
        self._computes_changed(computes)
        for v, c in computes.items():
            self.computes[v] = c
        for x, runs in new_runs.items():
            self.runs[x] = runs
        self.keys, self.at, self.through = keys, at, through

    def _after(self, computes: dict[int, list[int]], new_runs: dict[int, list],
               through: bool = False) -> list[np.ndarray]:
        """[event keys, RAM at each event, and with `through` RAM across each gap] were the
        compute sets `computes` (node -> its stages) and the stays `new_runs` they imply (every
        node whose stays change) to replace the present ones: O(events) numpy work on the
        touched stays alone."""
        p, width = self.p, self.width
        added, removed = [], []
        for v, stages in computes.items():
            old = set(self.computes[v])
            added += [t * width + 1 + v for t in stages if t not in old]
            removed += [t * width + 1 + v for t in old.difference(stages)]
        added.sort()
        added_keys = np.asarray(added, dtype=np.int64)
        positions = np.searchsorted(self.keys, added_keys)
        keys = np.insert(self.keys, positions, added_keys)
        # A new event, and the two gaps it splits one into, see the stays that spanned that
        # gap (none after the last event); the touched stays are then taken out as they were
        # and put in as they are, on the keys of both (every stay starts and ends at an event
        # of its own state).
        spanning = np.where(positions < len(self.at),
                            self.through[np.minimum(positions, max(len(self.at) - 1, 0))], 0)
        at_old, through_old = self._coverage(keys, *self._run_arrays(new_runs))
        at_new, through_new = self._coverage(keys, *self._run_arrays(new_runs, new_runs))
        at = np.insert(self.at, positions, spanning) - at_old + at_new
        at[positions + np.arange(len(positions))] += np.asarray(
            [p.workspace[(k - 1) % width] for k in added], dtype=np.int64)
        arrays = [keys, at]
        if through:
            arrays.append(np.insert(self.through, positions, spanning) - through_old + through_new)
        if removed:  # no stay of the new state starts or ends there: the gaps each side agree
            gone = np.searchsorted(keys, np.asarray(removed, dtype=np.int64))
            arrays = [np.delete(a, gone) for a in arrays]
        return arrays

    def try_drop(self, v: int, t: int, capacity: int) -> bool:
        """Drop the recomputation of v in stage t if RAM stays within `capacity` everywhere;
        O(events) numpy work on the touched stays, no rebuild."""
        touched = {v, *self.p.deps[v]}
        computes = {v: [s for s in self.computes[v] if s != t]}
        new_runs = {x: self._derive(x, computes.get(x), computes) for x in touched}
        at_old, through_old = self._coverage(self.keys, *self._run_arrays(touched))
        at_new, through_new = self._coverage(self.keys, *self._run_arrays(touched, new_runs))
        gone = int(np.searchsorted(self.keys, self.key(t, v)))
        at = np.delete(self.at - at_old + at_new, gone)
        if at.size and int(at.max()) > capacity:
            return False
        self._computes_changed([v])
        self.computes[v] = computes[v]
        for x, runs in new_runs.items():
            self.runs[x] = runs
        self.keys = np.delete(self.keys, gone)
        self.at = at
        self.through = np.delete(self.through - through_old + through_new, gone)
        return True

    def residencies(self) -> list[list[Residency]]:
        return [[Residency(s, e, COMPUTE) for s, e in runs] for runs in self.runs]


def drop_unneeded(sched: EventSchedule, added: list[list[tuple[int, int]]],
                  capacity: int, deadline: float | None = None) -> None:
    """Undo recomputations the budget turned out not to need, most expensive first (until the
    deadline, a perf_counter time, if one is given: every state on the way is a schedule)."""
    for v, t in sorted((m for move in added for m in move), key=lambda m: -sched.cost[m[0]]):
        if deadline is not None and clock.perf_counter() > deadline:
            return
        if t in sched.computes[v]:
            sched.try_drop(v, t, capacity)


def from_decisions(p: Problem, decisions) -> EventSchedule:
    """The event model of a schedule given as stage decisions (its computes only)."""
    computes: list[list[int]] = [[] for _ in range(p.n)]
    for t, d in enumerate(decisions):
        for v in d.compute:
            computes[v].append(t)
    return EventSchedule(p, computes)
