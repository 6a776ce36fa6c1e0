"""Budget descent: the peak search of the feasibility phase, run from the plain schedule down a
ladder of capacities to the budget, keeping the cheapest of a few ladders.

Pushing straight to the budget makes the greedy's first splits at a peak far over it, where
the cheapest-per-byte split is often one the final schedule would not have needed; tightening
step by step makes each step's splits the cheapest for a peak just over the next capacity.
On random layered graphs of 500 nodes at 0.8 of the plain peak this starts the window LNS
from a plan 5-20% cheaper in recompute cost than peak splitting or the feasibility phase (whose
batch splits trade quality for speed on graphs of thousands of nodes), in about a second.
"""

from __future__ import annotations

import time as clock

from .events import EventSchedule, drop_unneeded
from .feasible import Deadline, peak_search
from .intervals import decisions_from_intervals
from .lns import recompute_cost
from .problem import Problem
from .stages import StageDecision

# Capacities, as multiples of the budget's (the budget less fixed memory), tried in this order.
LADDERS = ((1.125, 1.0625, 1.025, 1.0), (1.0,), (1.19, 1.125, 1.0625, 1.0), (1.0625, 1.025, 1.0))
# Above this many nodes the plain-schedule peak search is too slow to be worth a baseline's
# share of the time; the feasibility phase (batch splits first) is the starter there.
DESCENT_MAX_NODES = 1500


def descend(p: Problem, ladder: tuple[float, ...], deadline: float) -> EventSchedule | None:
    """The peak search's schedule after each capacity of `ladder` in turn, or None (a step
    found no split that helps). Raises feasible.Deadline."""
    capacity = p.budget_bytes - p.fixed
    sched, added = EventSchedule(p), []
    for factor in ladder:
        step = max(capacity, int(capacity * factor))
        if not peak_search(sched, step, added, deadline):
            return None
    drop_unneeded(sched, added, capacity, deadline)
    return sched


def descent_schedule(p: Problem, deadline: float | None = None) -> list[StageDecision] | None:
    """The cheapest schedule of the LADDERS within the budget, of those done by `deadline` (a
    perf_counter time); None if none is (or the graph is over DESCENT_MAX_NODES)."""
    if p.n > DESCENT_MAX_NODES:
        return None
    deadline = clock.perf_counter() + 60.0 if deadline is None else deadline
    best = None
    for ladder in LADDERS:
        try:
            sched = descend(p, ladder, deadline)
        except Deadline:
            break
        if sched is not None and (best is None or recompute_cost(sched) < recompute_cost(best)):
            best = sched
    return None if best is None else decisions_from_intervals(p, best.residencies())
