"""Other memory-aware orders of a graph whose order is free: plan on the one whose first plan
recomputes least.

The memory-aware order (ordering.py) is chosen by a proxy, the plain schedule's RAM above the
budget. What the budget then forces out, and what the searches can bring back cheaply, varies
from one such order to the next as much as with the searches' own choices, and the window LNS
does not make up for the order it starts in. On random layered graphs at 0.8 of the given
order's plain peak, 1000 nodes seed 3, the order's seeds 0-5 gave a feasibility-phase plan at
6.00 / 3.06 / 5.21 / 3.78 / none / 5.28% TDI, and 50 s of LNS from each 4.68 / 3.02 / 4.05 /
3.25 / - / 3.30% (a throwaway script). So `auto` tries further seeds of the order for a share of
its time, runs the large-graph starters on each, and goes on (LNS, bound, plan) in the order
whose start is cheapest. Where the feasibility phase found no plan at all in the first order,
`first_order_that_plans` tries the others until one plans. Where the host has cores to spare,
the first few other orders are tried in child processes while this one searches the first
(`OrdersAhead`).
"""

from __future__ import annotations

import math
import time as clock
from dataclasses import dataclass, replace

from . import isolated
from .baselines import BASELINES
from .evaluate import Evaluation, evaluate
from .ordering import memory_order
from .problem import Problem
from .stages import StageDecision, is_plain

# The starters run on each other order: the two that scale (solve.py's feasibility phase, and
# budget descent, the better one from 400 nodes).
STARTERS = ("peak-search", "descent")
# Seeds of the order tried after the first (seed 0, the problem's own), while time lasts.
MAX_SEEDS = 8
# One order's search and starters get at most this share of the time limit; an order is not
# begun with less than MIN_TRY_SHARE of it left (a search that fails is slow).
TRY_SHARE, MIN_TRY_SHARE = 0.1, 0.03
# Where no order has a plan yet, one order's try may take this share instead: the feasibility
# phase needs its order's search and its own few seconds (5000 nodes: 3 + 6 s).
RESCUE_TRY_SHARE = 0.2
# Orders stop after this many in a row give no cheaper start: the time is the LNS's, which is
# where the gain lies on such graphs (1000 nodes seed 4: five orders' starts at 2.73-3.22% TDI,
# 50 s of LNS from each 1.60-1.79%; with 22 s of orders before it, its plan 1.73% against
# 1.44% without).
PATIENCE = 2
# Other orders tried ahead, each in a child process on a core the first order's search leaves
# idle (at most this many; none on one core): a child costs its own copy of the problem
# (5000 nodes: ~150 MiB).
MAX_AHEAD = 3
# A try ahead that has not answered this long after its own time is given up.
AHEAD_GRACE_S = 10.0


@dataclass
class OrderStart:
    seed: int
    problem: Problem
    starter: str
    decisions: list[StageDecision]
    evaluation: Evaluation
    found_at: float


def in_memory_order(p: Problem, seed: int, time_limit_s: float) -> Problem | None:
    """The problem with its graph in the memory-aware order of `seed` (None where that order
    is the given one: no order leaves less above the budget)."""
    given = p.source_graph
    workspace = [p.workspace[p.graph.index[node.id]] for node in given.nodes]
    ordered, _, _ = memory_order(given, workspace, p.budget_bytes - p.fixed, seed=seed,
                                 time_limit_s=time_limit_s)
    if ordered is given:
        return None
    positions = [p.graph.index[node.id] for node in ordered.nodes]
    return replace(p, graph=ordered, costs=p.costs.in_order(positions), given_graph=given)


class OrdersAhead:
    """The tries of seeds 1 ... k of the order, started at once in child processes so that the
    cores left idle by the first order's search are not; `cheaper_order` and
    `first_order_that_plans` take them in seed order and try later seeds themselves. Each try
    gets `seconds` from its start (RESCUE_TRY_SHARE of the limit: it serves either)."""

    def __init__(self, p: Problem, count: int, seconds: float):
        self.seconds, self.started = seconds, clock.perf_counter()
        self.children = {seed: isolated.Child(_try_order_within, (p, seed, seconds),
                                              what=f"the try of order seed {seed}")
                         for seed in range(1, count + 1)}

    @staticmethod
    def count_for(workers: int | None) -> int:
        """How many orders to try ahead with `workers` cores (None: this process's cores)."""
        return isolated.spare_cores(workers, MAX_AHEAD)

    def take(self, seed: int, objective: float,
             until: float) -> tuple[OrderStart | None, dict] | None:
        """The try of `seed` (its start only where cheaper than `objective`), waiting for it
        until `until` (a perf_counter time: where the try made now would end); None where it
        was not tried ahead."""
        child = self.children.pop(seed, None)
        if child is None:
            return None
        wait = min(until, self.started + self.seconds + AHEAD_GRACE_S) - clock.perf_counter()
        try:
            start, record = child.result(timeout=max(1.0, wait))
        except (RuntimeError, TimeoutError) as exc:  # the try is lost, not the plan
            start, record = None, {"seed": seed, "objective": None, "error": str(exc)}
        finally:
            child.cancel()
        if start is not None:
            start.found_at = clock.perf_counter()  # the plan is this process's from now
            if start.evaluation.objective >= objective:
                start = None
        return start, record

    def close(self) -> None:
        for child in self.children.values():
            child.cancel()
        self.children.clear()


def cheaper_order(p: Problem, objective: float, deadline: float, time_limit: float,
                  ahead: OrdersAhead | None = None) -> tuple[OrderStart | None, list[dict]]:
    """The cheapest start (a starter's plan in another seed of the memory-aware order) whose
    objective is below `objective`, found before `deadline` (a perf_counter time), or None;
    and one record per order tried (`ahead`: tries already started)."""
    best, tried, misses = None, [], 0
    for seed in range(1, MAX_SEEDS + 1):
        now = clock.perf_counter()
        if deadline - now < MIN_TRY_SHARE * time_limit or misses >= PATIENCE \
                or (best is not None and is_plain(best.decisions)):
            break
        misses += 1
        below = best.evaluation.objective if best else objective
        start, record = _taken_or_tried(ahead, p, seed,
                                        min(deadline, now + TRY_SHARE * time_limit), below)
        tried.append(record)
        if start is not None:
            best, misses = start, 0
    return best, tried


def first_order_that_plans(p: Problem, deadline: float, time_limit: float,
                           ahead: OrdersAhead | None = None
                           ) -> tuple[OrderStart | None, list[dict]]:
    """Where the feasibility phase found nothing in the problem's order: the first other seed
    of the memory-aware order in which a starter plans (its cheapest start there), tried one
    after another until `deadline`; and one record per order tried. The searches get stuck
    on an order's own peaks, so another order often plans at once: at 0.8, 5000 nodes (w
    0.31, seed 0), order seed 0 found nothing in 40 s, seeds 1, 2 and 3 each planned within
    9 s of starting (order search included; a throwaway script). `ahead`: tries already
    started."""
    tried = []
    for seed in range(1, MAX_SEEDS + 1):
        now = clock.perf_counter()
        if deadline - now < MIN_TRY_SHARE * time_limit:
            break
        start, record = _taken_or_tried(
            ahead, p, seed, min(deadline, now + RESCUE_TRY_SHARE * time_limit), math.inf)
        tried.append(record)
        if start is not None:
            return start, tried
    return None, tried


def _taken_or_tried(ahead: OrdersAhead | None, p: Problem, seed: int, own: float,
                    objective: float) -> tuple[OrderStart | None, dict]:
    """The try of `seed` made ahead, if it was, else made now (until `own`)."""
    taken = ahead.take(seed, objective, own) if ahead is not None else None
    return taken if taken is not None else _try_order(p, seed, own, objective)


def _try_order_within(p: Problem, seed: int,
                      seconds: float) -> tuple[OrderStart | None, dict]:
    """_try_order with `seconds` from now and no objective to beat (a try ahead, in a child)."""
    return _try_order(p, seed, clock.perf_counter() + seconds, math.inf)


def _try_order(p: Problem, seed: int, own: float,
               objective: float) -> tuple[OrderStart | None, dict]:
    """The cheapest start below `objective` in the order of `seed`, found before `own` (a
    perf_counter time), or None; and the order's record (its best start, whichever it is)."""
    now = clock.perf_counter()
    q = in_memory_order(p, seed, max(0.1, 0.5 * (own - now)))
    record, best = {"seed": seed, "objective": None}, None
    if q is not None:
        for name in STARTERS:
            if clock.perf_counter() >= own:
                break
            decisions = BASELINES[name](q, own)
            if decisions is None:
                continue
            ev = evaluate(q, decisions)
            if not ev.feasible:
                continue
            if record["objective"] is None or ev.objective < record["objective"]:
                record.update(objective=ev.objective, starter=f"heuristic:{name}")
            if ev.objective < (best.evaluation.objective if best else objective):
                best = OrderStart(seed, q, name, decisions, ev, clock.perf_counter())
    record["s"] = round(clock.perf_counter() - now, 2)
    return best, record
