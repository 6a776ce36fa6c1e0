"""Large-neighbourhood search over windows of the execution order (ruin and recreate).

Starting from a schedule within the budget (the event model of events.py), repeat until the
deadline: take a window of stages (or a few recomputed nodes), remove every recomputation
placed in it (of them), bring RAM back under the budget with the peak search (only where
something was removed can RAM be over it, so the search stays local), drop what the result
does not need, and go on from the new schedule if its recompute cost is lower or barely higher
(ACCEPT_WORSE); the cheapest one seen is returned. Ruins are drawn from a seeded generator, so
a run is deterministic for a seed and a number of rounds; every state is a schedule within the
budget, and the best so far is the anytime incumbent.
"""

from __future__ import annotations

import random
import time as clock
from typing import Callable

from ..errors import import_extension
from .events import EventSchedule, drop_unneeded, from_decisions, recompute_cost
from .feasible import Deadline, peak_search
from .interrupt import SearchInterrupted
from .intervals import decisions_from_intervals
from .problem import Problem
from .stages import StageDecision


# A round ruins a window of stages (its size drawn from MIN_WINDOW ... n / WINDOW_DIVISOR:
# measured on 500 nodes, windows of 12-30 stages improve 4x more often than n / 8 = 62) or,
# every other round on average, the recomputations of a random NODE_SHARE of the nodes that
# have any (the recreate then chooses anew which tensors leave RAM there).
MIN_WINDOW, WINDOW_DIVISOR, NODE_SHARE = 8, 16, 1 / 8
# A new state is taken when it costs at most this much more than the current one (the best is
# kept apart): crossing such small rises finds cheaper schedules than strict descent.
ACCEPT_WORSE = 0.003
# Exact rounds (window.py: CP-SAT on a window of EXACT_WINDOW stages, the rest fixed), once the
# greedy rounds have not improved the best for EXACT_STALL rounds, then every EXACT_EVERY-th
# round while that lasts; each solve gets EXACT_DTIME of CP-SAT's deterministic time (1-2 s at
# 500 nodes on a shared 2-core host; the wall-clock cap EXACT_MAX_S only guards a slow machine).
EXACT_WINDOW, EXACT_STALL, EXACT_EVERY, EXACT_DTIME, EXACT_MAX_S = 20, 60, 20, 0.25, 4.0
# No exact round starts with less than this left: building a window's model alone took 0.3-1 s
# on 1000 nodes, and one begun near the deadline ended 0.45 s past it.
EXACT_MIN_S = 0.5


def improve(sched: EventSchedule, capacity: int, deadline: float, seed: int = 0,
            window: int | None = None, rounds: int | None = None, exact: bool = False,
            progress: Callable[[float], None] | None = None) -> tuple[EventSchedule, dict]:
    """The best schedule found from `sched` (itself within `capacity`) before the deadline, or
    after `rounds` ruins; and what the search did. `window` fixes the window size; `exact`
    adds the exact rounds (it imports OR-Tools: never in a process that holds highspy).
    Ctrl-C raises SearchInterrupted with the best schedule so far, as stage decisions.
    `progress(change)` is told of each new best: its recompute cost less the start's."""
    if exact:  # OR-Tools loaded now, not by the first exact round, which may be near the end
        import_extension("ortools.sat.python.cp_model")
    p, rng = sched.p, random.Random(seed)
    widest = max(MIN_WINDOW + 4, p.n // WINDOW_DIVISOR)
    current, current_cost = sched, recompute_cost(sched)
    best, best_cost = current, current_cost
    start_cost = current_cost
    tried = accepted = exact_tried = exact_improved = last_gain = 0
    best_at = None
    try:
        # A schedule without recomputations cannot get cheaper: stop there.
        while clock.perf_counter() < deadline and (rounds is None or tried < rounds) \
                and best_cost > 0:
            tried += 1
            stalled = tried - last_gain - EXACT_STALL
            by_exact = exact and stalled >= 0 and stalled % EXACT_EVERY == 0
            if by_exact:
                exact_tried += 1
                trial = _exact_round(current, capacity, rng, deadline)
                if trial is None:
                    continue
                cost = recompute_cost(trial)
            else:
                computes = _ruin(current, rng, window or rng.randint(MIN_WINDOW, widest))
                if computes is None:
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
                if cost > current_cost * (1 + ACCEPT_WORSE) or trial.computes == current.computes:
                    continue
            current, current_cost = trial, cost  # an exact round's schedule is always taken
            if cost < best_cost * (1 - 1e-12):
                best, best_cost, best_at, last_gain = trial, cost, clock.perf_counter(), tried
                if by_exact:
                    exact_improved += 1
                else:
                    accepted += 1
                if progress is not None:
                    progress(best_cost - start_cost)
    except KeyboardInterrupt:
        # `best` is only ever a finished schedule within the budget: it is what Ctrl-C keeps
        raise SearchInterrupted(decisions_from_intervals(p, best.residencies()), "lns",
                                best_at) from None
    info = {"windows_tried": tried, "windows_improved": accepted, "best_at": best_at,
            "best_cost": best_cost, "window_stages": window or f"{MIN_WINDOW}-{widest}",
            "seed": seed}
    if exact:
        info.update(exact_tried=exact_tried, exact_improved=exact_improved)
    return best, info


def _exact_round(sched: EventSchedule, capacity: int, rng: random.Random,
                 deadline: float) -> EventSchedule | None:
    """The schedule with a window's recomputations re-chosen by CP-SAT, if that is cheaper;
    the window covers a stage drawn by the recompute cost placed in it."""
    from .window import solve_window
    p = sched.p
    placed = [0.0] * p.n
    for v, stages in enumerate(sched.computes):
        for t in stages:
            if t != v:
                placed[t] += sched.cost[v]
    if not any(placed):
        return None
    stage = rng.choices(range(p.n), weights=placed)[0]
    first = max(0, min(p.n - EXACT_WINDOW, stage - rng.randrange(EXACT_WINDOW)))
    seconds = min(EXACT_MAX_S, deadline - clock.perf_counter())
    if seconds < EXACT_MIN_S:
        return None
    result = solve_window(sched, capacity, first, EXACT_WINDOW, seconds, EXACT_DTIME,
                          seed=rng.randrange(1 << 30))
    if result.computes is None:
        return None
    trial = EventSchedule(p, result.computes)
    if trial.excess(capacity) > 0:  # the model over-counts RAM, never under: a bug if reached
        raise RuntimeError(f"the exact window at stage {first} returned a schedule over the "
                           "budget")
    return trial


def _ruin(sched: EventSchedule, rng: random.Random, window: int) -> list[list[int]] | None:
    """The compute sets without the recomputations of a window of stages or of a random set
    of nodes; None if that removes none."""
    p = sched.p
    if rng.random() < 0.5:
        computes = without_window(sched, rng.randrange(0, max(1, p.n - window + 1)), window)
    else:
        recomputed = [v for v, stages in enumerate(sched.computes) if len(stages) > 1]
        if not recomputed:
            return None
        chosen = set(rng.sample(recomputed, max(1, round(NODE_SHARE * len(recomputed)))))
        computes = [[v] if v in chosen else list(stages)
                    for v, stages in enumerate(sched.computes)]
    if all(len(a) == len(b) for a, b in zip(sched.computes, computes)):
        return None
    return computes


def without_window(sched: EventSchedule, first: int, window: int) -> list[list[int]]:
    """The compute sets less every recomputation placed in stages first .. first+window-1."""
    return [[t for t in stages if t == v or not first <= t < first + window]
            for v, stages in enumerate(sched.computes)]


def improve_decisions(p: Problem, decisions: list[StageDecision], time_limit: float,
                      seed: int = 0, exact: bool = False, rounds: int | None = None,
                      progress: Callable[[float], None] | None = None,
                      until: float | None = None) -> tuple[list[StageDecision], dict]:
    """`improve` on a schedule given as stage decisions (recomputations only: a schedule that
    pages is returned as it is), with exact rounds if `exact` (call it through
    isolated.call("ortools", ...) from a process that may hold highspy); `rounds` ends it
    after that many rounds (reproducible runs) if the time limit does not first. `until`, a
    perf_counter time (the caller's: the clock is the system's monotonic one), ends it sooner
    than the time limit counted from its start, which in a child process comes after the
    interpreter's start (0.3-0.5 s on 1000 nodes)."""
    if any(d.page_in or d.page_out for d in decisions):
        return decisions, {"windows_tried": 0, "skipped": "the schedule pages"}
    start = from_decisions(p, decisions)
    capacity = p.budget_bytes - p.fixed
    if start.excess(capacity) > 0:  # the event model is stricter than the stage lowering
        return decisions, {"windows_tried": 0, "skipped": "not within the event model"}
    deadline = clock.perf_counter() + time_limit
    if until is not None:
        deadline = min(deadline, until)
    best, info = improve(start, capacity, deadline, seed, rounds=rounds, exact=exact,
                         progress=progress)
    if best is start:
        return decisions, info
    return decisions_from_intervals(p, best.residencies()), info
