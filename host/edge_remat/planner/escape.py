"""Ruin and recreate on the RAM over the budget: where the feasibility phase's greedy is stuck.

The peak search and repair stop at a schedule whose remaining over-budget events no single move
helps. Their earlier choices are what blocks them: recomputations placed nearby that keep inputs
resident, or that chose the wrong tensors to take out. So, until RAM fits or the deadline passes:
pick an event still over the budget at random, remove every recomputation placed in a small
window of stages around it (lns.without_window), and bring RAM back down with the same searches
(batch splits, the cheap levels of the peak search, repair); keep the result when it leaves no
more RAM over the budget (summed over events) than before, so plateaus are crossed, and give up
after STALL_ROUNDS rounds in a row that lower nothing. On random
layered graphs of 1000 nodes at 0.8 of the plain peak (seed 0), where the greedy stops 151 KB
over at 17 events, five rounds reach a schedule within the budget (7.6 s in all).
"""

from __future__ import annotations

import random
import time as clock

import numpy as np

from .batch import batch_splits
from .events import EventSchedule
from .feasible import SEARCH_LEVELS, Deadline, peak_search
from .lns import without_window
from .repair import repair

# Stages ruined around the chosen event; the peak search's levels a round may use (the wider
# ones cost seconds before they give up, and a round is cheap to retry); a round's own time cap.
MIN_WINDOW, MAX_WINDOW, ROUND_LEVELS, ROUND_S = 2, 10, 2, 5.0
# Rounds in a row that lower nothing before giving up (where no schedule fits, or none is
# near, the caller's fallbacks get the time instead).
STALL_ROUNDS = 25


def reach_budget(sched: EventSchedule, capacity: int, deadline: float,
                 seed: int = 0) -> EventSchedule | None:
    """A schedule within `capacity` found from `sched` (over it) before the deadline and
    before STALL_ROUNDS rounds in a row lower nothing; else None."""
    rng, excess, stalled = random.Random(seed), sched.excess(capacity), 0
    while excess > 0:
        if clock.perf_counter() > deadline or stalled >= STALL_ROUNDS:
            return None
        over = np.flatnonzero(sched.at > capacity)
        stage = int(sched.keys[int(rng.choice(over))]) // sched.width
        window = rng.randint(MIN_WINDOW, MAX_WINDOW)
        first = max(0, stage - rng.randint(0, window))
        trial = EventSchedule(sched.p, without_window(sched, first, window))
        own = min(deadline, clock.perf_counter() + ROUND_S)
        try:
            _recreate(trial, capacity, own)
        except Deadline:
            pass  # the round's own cap: its schedule is still one, judged like the others
        after = trial.excess(capacity)
        stalled = 0 if after < excess else stalled + 1
        if after <= excess:
            sched, excess = trial, after
    return sched


def _recreate(sched: EventSchedule, capacity: int, deadline: float) -> None:
    added: list[list[tuple[int, int]]] = []
    batch_splits(sched, capacity, added, deadline)
    if sched.excess(capacity) > 0 and \
            not peak_search(sched, capacity, added, deadline, SEARCH_LEVELS[:ROUND_LEVELS]):
        repair(sched, capacity, added, deadline)
