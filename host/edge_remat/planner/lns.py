"""Large-neighbourhood search over windows of the execution order (ruin and recreate).

Starting from a schedule within the budget (the event model of events.py), repeat until the
deadline: take a window of stages, remove every recomputation placed in it, bring RAM back under
the budget with the peak search (only the window's events can be over it, so the search stays
local), drop what the result does not need, and keep the new schedule if its recompute cost is
lower. Windows are drawn from a seeded generator, so a run is deterministic for a seed and a
number of rounds; every state kept is a schedule within the budget (the anytime incumbent).
"""

from __future__ import annotations

import random
import time as clock

from .events import EventSchedule, drop_unneeded
from .feasible import Deadline, peak_search
from .intervals import decisions_from_intervals
from .problem import Problem
from .stages import StageDecision


def recompute_cost(sched: EventSchedule) -> float:
    return sum(sched.cost[v] * (len(stages) - 1) for v, stages in enumerate(sched.computes))


def improve(sched: EventSchedule, capacity: int, deadline: float, seed: int = 0,
            window: int | None = None, rounds: int | None = None) -> tuple[EventSchedule, dict]:
    """The best schedule found from `sched` (itself within `capacity`) before the deadline, or
    after `rounds` windows; and what the search did."""
    p, rng = sched.p, random.Random(seed)
    window = window or max(8, p.n // 8)
    best, best_cost = sched, recompute_cost(sched)
    tried = accepted = 0
    while clock.perf_counter() < deadline and (rounds is None or tried < rounds):
        first = rng.randrange(0, max(1, p.n - window + 1))
        last = first + window
        computes = [[t for t in stages if t == v or not first <= t < last]
                    for v, stages in enumerate(best.computes)]
        removed = sum(len(a) - len(b) for a, b in zip(best.computes, computes))
        tried += 1
        if not removed:
            continue
        trial = EventSchedule(p, computes)
        added: list[list[tuple[int, int]]] = []
        try:
            if not peak_search(trial, capacity, added, deadline):
                continue
        except Deadline:
            break
        drop_unneeded(trial, added, capacity, deadline)
        cost = recompute_cost(trial)
        if cost < best_cost * (1 - 1e-12):
            best, best_cost = trial, cost
            accepted += 1
    return best, {"windows_tried": tried, "windows_improved": accepted, "window_stages": window,
                  "seed": seed}


def improve_decisions(p: Problem, decisions: list[StageDecision], time_limit: float,
                      seed: int = 0) -> tuple[list[StageDecision], dict]:
    """`improve` on a schedule given as stage decisions (recomputations only: a schedule that
    pages is returned as it is)."""
    if any(d.page_in or d.page_out for d in decisions):
        return decisions, {"windows_tried": 0, "skipped": "the schedule pages"}
    computes: list[list[int]] = [[] for _ in range(p.n)]
    for t, d in enumerate(decisions):
        for v in d.compute:
            computes[v].append(t)
    start = EventSchedule(p, computes)
    capacity = p.budget_bytes - p.fixed
    if start.excess(capacity) > 0:  # the event model is stricter than the stage lowering
        return decisions, {"windows_tried": 0, "skipped": "not within the event model"}
    best, info = improve(start, capacity, clock.perf_counter() + time_limit, seed)
    if best is start:
        return decisions, info
    return decisions_from_intervals(p, best.residencies()), info
