"""Choose and run solvers; every answer is validated by the simulator and becomes a Plan."""

from __future__ import annotations

import importlib.util
import math
import time as clock
from dataclasses import dataclass, field, replace
from typing import Callable

from edge_remat_agent.accumulated_step import accumulated_step
from edge_remat_agent.accumulation import micro_batches_of
from edge_remat_agent.formats import Plan

from ..units import round_up
from . import isolated
from .baselines import BASELINES
from .bounds import SCOPE as BOUND_SCOPE, plain_objective, stage_lower_bound, with_io_timeline
from .cover_bound import SCOPE as COVER_SCOPE
from .evaluate import OBJECTIVE_TIE, Evaluation, evaluate, with_page_outs_delayed
from .interrupt import PlanInterrupted, SearchInterrupted
from .order_portfolio import (RESCUE_TRY_SHARE, OrdersAhead, cheaper_order,
                              first_order_that_plans)
from .overlap import hoisting_until
from .problem import InfeasibleBudget, InfeasibleDeadline, Problem, ProblemError
from .stages import StageDecision, is_plain
from .status_line import announce

# Above this many nodes the stage x node MILP (O(n^2) binaries) is not worth starting.
MILP_MAX_NODES = 300
FEASIBILITY_SHARE = 0.6  # of the time limit, for the baselines and the feasibility phase
# Each baseline but the feasibility phase stops at this share of the time limit, so that on a
# large graph a hopeless greedy (DTR evicting for minutes) cannot starve the one that scales.
# Belady paging, which runs first (baselines.BASELINES), may run on to ALWAYS_FITS_SHARE
# whatever the others get: it is the plan that always fits (5000 nodes of random layered at
# 0.8: 2-3 s alone, but on a host loaded by other orders' children it overran a 12 s share,
# and the plan said "no plan").
OTHER_BASELINE_SHARE, FEASIBILITY_PHASE, ALWAYS_FITS, ALWAYS_FITS_SHARE = \
    0.1, "peak-search", "paging", 0.5
# From this many nodes auto improves the best heuristic plan by window LNS (lns.py) for this
# share of the time limit before CP-SAT starts from it (or instead of it, from LNS_ONLY_NODES).
LNS_MIN_NODES, LNS_SHARE = 300, 0.25
# From this many nodes auto does not start CP-SAT: once a heuristic plan exists the LNS gets
# all the time left (at 500 nodes 60 s of CP-SAT from a 4.19% TDI plan reached 4.14%, its model
# taking 17 s to load the hint, where 15 s of LNS reached 3.38%), and where none exists CP-SAT
# from scratch finds none either (1000 nodes at 0.8, seeds 2 and 3), so the time left goes to
# finding a larger budget that plans (_budget_found_hint). The plan carries the combinatorial
# bound. LNS_RESERVE of the time limit is left to validate and report (the covering bound,
# below, takes up to half of it), and at least _report_reserve: the report's own work
# (delaying page-outs, the stage and covering bounds, the covering bound's child process where
# OR-Tools is loaded) took 0.4-0.5 s on 1000 nodes and 0.75-1.2 s on 2000, where 0.24 s was
# left for it, and a 4 s plan of 2000 nodes took 4.5-4.8 s here and 5.9 s under CI's load
# (2026-12-06).
LNS_ONLY_NODES, LNS_RESERVE = 450, 0.06
# What the report's bounds take (REPORT_S, the covering bound's child start, and
# BOUNDS_S_PER_NODE), and with an overlapped plan's delayed page-outs DELAY_S_PER_NODE more.
REPORT_S, BOUNDS_S_PER_NODE, DELAY_S_PER_NODE = 0.45, 1e-4, 2e-4
# Seeds of the LNS run side by side where cores are spare (each in a child process but the
# first), the cheapest plan taken; every stream stops when the first does, so a child starts
# only where the LNS has more than CHILD_START_S (an interpreter and OR-Tools to load), and is
# given up STREAM_GRACE_S after the first stream ends.
LNS_STREAMS, CHILD_START_S, STREAM_GRACE_S = 4, 1.5, 5.0
# From LNS_ONLY_NODES, where the order is free, auto tries other seeds of the memory-aware
# order for this share of the time limit and plans on in the one whose start is cheapest
# (order_portfolio.py).
PORTFOLIO_SHARE = 0.25
# Where the feasibility phase found no plan in the problem's order, auto tries it in other
# seeds of the order until this share of the time limit (first_order_that_plans); the rest is
# the budget ladder's, which names a budget that plans where no order did.
RESCUE_END = 0.85
# There the first order's feasibility phase stops at this share instead of FEASIBILITY_SHARE:
# it plans in seconds or not at all (5000 nodes: 6 s where it plans, nothing in 40 s where it
# does not), so the time is worth more in other orders and, once one plans, in the LNS.
FIRST_ORDER_SHARE = 0.3
SOLVERS = ("auto", "cpsat", "milp")
# From this many nodes (where the exact solvers' bounds are weak or absent) the plan's bound is
# also sought from the idle-gap covering problem (cover_bound.py), by HiGHS for COVER_SHARE of
# the time limit (at most COVER_MAX_S); as an integer program up to COVER_INTEGER_NODES nodes
# (500 nodes: 1 s, 2.02% TDI against the LP's 1.88%), its LP above (5000 nodes: 0.5 s).
COVER_MIN_NODES, COVER_SHARE, COVER_MAX_S, COVER_INTEGER_NODES = 300, 0.03, 5.0, 1500
# The exact solver is started only with this much of the time limit left (OR-Tools takes about
# that to load and build a 200-node model, measured with `plan --model resnet18 --time-limit`);
# with less, the best heuristic's plan is returned as it is, so that a small --time-limit is kept
# (0.1 s took 0.8 s when CP-SAT had a floor of 1 s). Where no heuristic plan exists, the exact
# solver gets at least this much.
EXACT_MIN_S = 0.25
# The MILP re-solves with a tighter budget where the simulator rejects its plan by a hair, if
# at least this much of the time limit is left; otherwise the best heuristic's plan stands.
MILP_RETRY_MIN_S = 1.0

Progress = Callable[[float, float, float], None]


@dataclass
class BudgetHint:
    """What a "no plan" error proposes: its words, the proven floor and a budget to try
    (one the feasibility phase planned at or got down to, else the plain schedule's peak)."""
    text: str
    floor_bytes: int
    try_bytes: int


class NoPlan(ValueError):
    """No schedule was found (or exists) for this problem; the message says which and why,
    and `hint`, where there is one, the budgets it names (for --json: QA found them only in
    the words)."""

    def __init__(self, message: str, hint: BudgetHint | None = None):
        super().__init__(message)
        self.hint = hint


@dataclass
class Candidate:
    solver: str
    evaluation: Evaluation
    decisions: list[StageDecision]
    # perf_counter when it was found (made): the first plan's time is the earliest of these
    found_at: float = field(default_factory=clock.perf_counter)


@dataclass
class SolveReport:
    plan: Plan
    evaluation: Evaluation
    baselines: dict[str, float | None] = field(default_factory=dict)
    decisions: list[StageDecision] | None = None  # a hint for a neighbouring problem
    order: tuple[str, ...] = ()  # the node ids in the order the decisions index

    def hint_for(self, p: Problem) -> list[StageDecision] | None:
        """The decisions as a start for `p`, a neighbouring problem, where they index its
        nodes: a problem at another budget may run in another memory-aware order."""
        return self.decisions if self.order == node_order(p) else None


def node_order(p: Problem) -> tuple[str, ...]:
    return tuple(p.ids)


class Incumbent:
    """The best plan within the budget found so far and the problem (order) it is for, and
    the problem planning goes on in: what Ctrl-C returns (interrupt.py)."""

    def __init__(self, started: float):
        self.started = started
        self.problem: Problem | None = None
        self.best: tuple[Problem, Candidate] | None = None
        self.first_at: float | None = None
        self.summary: dict[str, float | None] = {}
        self.details: dict = {}  # the report's details known so far (the orders tried)

    def offer(self, p: Problem, candidate: Candidate | None) -> None:
        """Planning goes on in p; `candidate`, a plan for p, is kept if it fits and is the
        best (a plan in another order replaces one in the last: the order was changed for it)."""
        self.problem = p
        if candidate is None or not candidate.evaluation.feasible:
            return
        self.first_at = min(self.first_at or candidate.found_at, candidate.found_at)
        if self.best is None or self.best[0] is not p or \
                candidate.evaluation.rank < self.best[1].evaluation.rank:
            self.best = (p, candidate)

    def report(self, stop: KeyboardInterrupt, time_limit: float) -> SolveReport | None:
        """The best plan so far, with the schedule an interrupted search held (if it is
        better), as a report of status "interrupted"; None if there is no plan yet."""
        if isinstance(stop, SearchInterrupted) and self.problem is not None:
            name = "cpsat" if stop.by == "cpsat" or self.best is None else \
                f"{self.best[1].solver}+{stop.by}"
            self.offer(self.problem, Candidate(name, evaluate(self.problem, stop.found),
                                               stop.found,
                                               stop.found_at or clock.perf_counter()))
        if self.best is None:
            return None
        p, chosen = self.best
        return _report(p, chosen, "interrupted", None, self.started, time_limit, self.summary,
                       timing={"first_plan_s": self.first_at - self.started,
                               "best_plan_s": chosen.found_at - self.started}, **self.details)


def run_baselines(p: Problem, time_limit: float | None = None,
                  share: float = FEASIBILITY_SHARE,
                  found: Callable[[Candidate], None] | None = None,
                  left_at: Callable | None = None,
                  stop_at_plain_cost: bool = False, only: str | None = None,
                  ran_out: set | None = None) -> dict[str, Candidate | None]:
    """Every baseline, all of them within `share` of the time limit (if one is given; Belady
    paging within ALWAYS_FITS_SHARE, if that is longer): one that runs out of time has no
    plan. `found` is told of each plan as it is made; `left_at`, of the schedule the
    feasibility phase got to where it found none. `stop_at_plain_cost`: the rest are not run
    once a plan costs what the plain schedule does (none costs less). `only`: that baseline
    alone, with the whole share (one asked for by name); `ran_out` gets the name of each that
    found no plan and used its time up."""
    out: dict[str, Candidate | None] = {}
    deadline = None if time_limit is None else clock.perf_counter() + share * time_limit
    names = [only] if only is not None else list(BASELINES)
    for name in names:
        baseline, own = BASELINES[name], deadline
        if deadline is not None and only is None and name not in (FEASIBILITY_PHASE,
                                                                  ALWAYS_FITS):
            own = min(deadline, clock.perf_counter() + OTHER_BASELINE_SHARE * time_limit)
        elif deadline is not None and name == ALWAYS_FITS:
            own = max(deadline, clock.perf_counter() + ALWAYS_FITS_SHARE * time_limit)
        decisions = baseline(p, own, left_at) if name == FEASIBILITY_PHASE and left_at \
            else baseline(p, own)
        if decisions is None:
            out[name] = None
        else:  # its overlap post-pass within its share too (see overlap.py)
            with hoisting_until(own):
                out[name] = Candidate(f"heuristic:{name}", evaluate(p, decisions), decisions)
        if found is not None and out[name] is not None:
            found(out[name])
        fits = out[name] is not None and out[name].evaluation.feasible
        if not fits and ran_out is not None and own is not None \
                and clock.perf_counter() >= own:
            ran_out.add(name)
        if stop_at_plain_cost and fits and _costs_plain(p, out[name].evaluation):
            break
    return {name: out.get(name) for name in names}


def have_cpsat() -> bool:
    return importlib.util.find_spec("ortools") is not None


def choose_solver(p: Problem) -> str:
    """auto: CP-SAT where OR-Tools is installed, below LNS_ONLY_NODES; else the MILP on graphs
    it can handle; else the best heuristic (improved by the LNS on large graphs)."""
    if have_cpsat() and p.n < LNS_ONLY_NODES:
        return "cpsat"
    return "milp" if p.n <= MILP_MAX_NODES else "heuristic"


def solve(p: Problem, solver: str = "auto", time_limit: float = 60.0, backend: str = "cbc",
          workers: int | None = None, hint: SolveReport | None = None,
          progress: Progress | None = None) -> SolveReport:
    """The best plan the chosen solver finds within the time limit, never worse than the best
    baseline (or than the plan of `hint`, a neighbouring problem's report, when it is in this
    problem's order and fits it).

    Where no plan meets the deadline, the fastest schedule that fits the budget is sought: if it
    meets the deadline it is returned, else InfeasibleDeadline names the deadline it does meet."""
    p.check_budget()
    if solver == "milp":  # asked for by name: auto only picks it where it is small
        from .milp import too_large
        if (why := too_large(p)) is not None:
            raise ProblemError(why)
    if solver == "heuristic:paging" and not p.tiers:  # it pages or plans nothing: said as
        # "finds no schedule within the budget" even at a budget the plain schedule fits
        raise ProblemError("heuristic:paging pages tensors out, and this plan may page to no "
                           "tier: give --paging flash, host or both (flash with a profile that "
                           "has it, or --flash-read-bw/--flash-write-bw)")
    # The time spent choosing the execution order (build_problem) is the plan's time too.
    started = clock.perf_counter() - p.order_s
    with hoisting_until(started + time_limit):  # the overlap pass of every plan evaluated
        try:
            return _solve(p, solver, time_limit, backend, workers,
                          hint.hint_for(p) if hint is not None else None, progress, started)
        except (InfeasibleBudget, NoPlan):
            if p.deadline is None:
                raise
            # The fastest schedule gets what the limit leaves, and where the search used it
            # all, a little more, as the budget ladder does (_hint_deadline): a plan that
            # meets the deadline after all, or a smaller deadline to name, is worth those
            # seconds (QA: resnet18 at 59% on flash, 12 s, deadline 1.22: the 1 s left named
            # "at most 1.463x", where 4 s find a plan at 1.19x); a second at least, but no
            # more than the limit itself
            left = max(min(1.0, time_limit),
                       min(time_limit, _hint_deadline(started, time_limit) - clock.perf_counter()))
            return _fastest_within_budget(p, solver, left, backend, workers, started,
                                          time_limit)


def _solve(p: Problem, solver: str, time_limit: float, backend: str, workers: int | None,
           hint: list[StageDecision] | None, progress: Progress | None,
           started: float) -> SolveReport:
    other_orders = solver == "auto" and p.given_graph is not None and p.n >= LNS_ONLY_NODES
    # other orders' tries start now on the cores this search leaves idle
    ahead = OrdersAhead(p, OrdersAhead.count_for(workers), RESCUE_TRY_SHARE * time_limit) \
        if other_orders else None
    incumbent = Incumbent(started)
    try:
        return _solve_with(p, solver, time_limit, backend, workers, hint, progress, started,
                           other_orders, ahead, incumbent)
    except KeyboardInterrupt as stop:
        kept = incumbent.report(stop, time_limit)
        if kept is None:
            raise
        raise PlanInterrupted(kept) from None
    finally:
        if ahead is not None:
            ahead.close()


def _solve_with(p: Problem, solver: str, time_limit: float, backend: str, workers: int | None,
                hint: list[StageDecision] | None, progress: Progress | None, started: float,
                other_orders: bool, ahead: OrdersAhead | None,
                incumbent: Incumbent) -> SolveReport:
    # Where other orders are tried ahead, the first gets the same share as each of them: they
    # run side by side, and the first plan is whichever comes first.
    share = FEASIBILITY_SHARE if not other_orders else \
        RESCUE_TRY_SHARE if ahead is not None and ahead.children else FIRST_ORDER_SHARE
    asked = solver.split(":", 1)[1] if solver.startswith("heuristic:") else None

    def keep(candidate: Candidate) -> None:  # one heuristic asked for: only its plan is kept
        if asked is None or candidate.solver == f"heuristic:{asked}":
            incumbent.offer(p, candidate)

    announce(progress, "heuristics (feasibility phase)")
    left_at: list = []  # where the feasibility phase stopped, if it found no plan
    if asked is not None and asked not in BASELINES:
        raise NoPlan(f"unknown heuristic {asked!r} (known: {', '.join(BASELINES)})")
    ran_out: set = set()  # baselines that found no plan in the time they had
    baselines = run_baselines(p, time_limit, share, keep, left_at.append,
                              stop_at_plain_cost=asked is None, only=asked, ran_out=ran_out)
    summary = {name: (c.evaluation.value if c and c.evaluation.feasible else None)
               for name, c in baselines.items()}
    incumbent.summary = summary
    candidates = [c for c in baselines.values() if c is not None and c.evaluation.feasible]
    if hint is not None and len(hint) == p.n:
        given = Candidate("hint", evaluate(p, hint), hint, started)
        if given.evaluation.feasible:
            candidates.append(given)
            keep(given)
    best_known = min(candidates, key=lambda c: c.evaluation.rank, default=None)
    # The first plan existed when the first baseline that fits finished, not when all did.
    first_plan = min(c.found_at for c in candidates) - started if candidates else None
    best_at = best_known.found_at - started if best_known else None
    if asked is None and best_known is not None and (
            is_plain(best_known.decisions) or _costs_plain(p, best_known.evaluation)):
        # Each node computed once and nothing paged (or its paging wholly hidden behind
        # compute): no schedule costs less, in any order (the stage bound's base); the exact
        # solvers once spent their whole limit proving it, and other orders 13 s on 5000 nodes.
        return _report(p, best_known, "optimal", None, started, time_limit, summary,
                       timing={"first_plan_s": first_plan, "best_plan_s": best_at},
                       progress=progress,
                       proven_optimal_by="its cost: each node computed once, nothing paged"
                       if is_plain(best_known.decisions) else
                       "its cost: each node computed once, its paging hidden behind compute")
    order_details = {}
    if other_orders and (best_known is None or not is_plain(best_known.decisions)):
        announce(progress, "other execution orders")
        if best_known is None:
            start, tried = first_order_that_plans(p, started + RESCUE_END * time_limit,
                                                  time_limit, ahead)
            first = {"seed": 0, "objective": None}
        else:
            start, tried = cheaper_order(p, best_known.evaluation.objective,
                                         clock.perf_counter() + PORTFOLIO_SHARE * time_limit,
                                         time_limit, ahead)
            first = {"seed": 0, "objective": best_known.evaluation.objective,
                     "starter": best_known.solver}
        order_details = {"orders_tried": [first] + tried, "order_seed": 0}
        if start is not None:  # plan on in that order: the plan names node ids, as before
            p = start.problem
            best_known = Candidate(f"heuristic:{start.starter}", start.evaluation,
                                   start.decisions, start.found_at)
            best_at = start.found_at - started
            if first_plan is None:
                first_plan = best_at
            order_details["order_seed"] = start.seed
            incumbent.offer(p, best_known)
        incumbent.details = order_details
    if ahead is not None:
        ahead.close()  # tries not taken: their cores are the LNS's now
    if solver == "auto" and best_known is not None and p.n >= LNS_MIN_NODES:
        left = time_limit - (clock.perf_counter() - started)
        share = left - max(LNS_RESERVE * time_limit, _report_reserve(p)) \
            if p.n >= LNS_ONLY_NODES else LNS_SHARE * time_limit
        announce(progress, "window LNS")
        improved = _improve_by_lns(p, best_known, max(0.0, min(share, left)), workers,
                                   progress=_since(started, progress))
        if improved is not None:
            candidates.append(improved)
            best_known, best_at = improved, improved.found_at - started
            incumbent.offer(p, improved)

    if asked is not None:
        chosen = baselines[asked]
        if chosen is None or not chosen.evaluation.feasible:
            over = chosen.evaluation.sim.tier_overflow_bytes if chosen is not None else 0
            if asked in ran_out:  # (QA: 0.3 s said "no schedule within the budget", where
                # 1 s planned it: the budget was blamed for the time limit)
                took = clock.perf_counter() - started
                raise NoPlan(f"heuristic {asked!r} found no schedule within the budget in the "
                             f"{took:.2g} s it had of --time-limit {time_limit:g}: its time ran "
                             "out; give a larger --time-limit")
            raise NoPlan(f"heuristic {asked!r} finds no schedule within the budget"
                         + (" and deadline" if p.deadline else "")
                         + (f" (its schedule pages {over} bytes more than a tier's capacity "
                            "holds)" if over else "")
                         # auto runs the exact solvers where the graph is small enough
                         # for them, and else names a budget that plans
                         + "; try --solver auto")
        found = chosen.found_at - started  # the plan asked for: when that heuristic had it
        return _report(p, chosen, "feasible", None, started, time_limit, summary,
                       timing={"first_plan_s": found, "best_plan_s": found})
    if solver not in SOLVERS:
        raise NoPlan(f"unknown solver {solver!r} (use {', '.join(SOLVERS)} or heuristic:NAME)")
    if solver == "auto":
        solver = choose_solver(p)
    if solver == "heuristic":
        if best_known is None:
            orders = len(order_details.get("orders_tried", ()))
            spent = clock.perf_counter() - started
            # the searches may give up (no move lowers the RAM over the budget) long before
            # the limit: then more time would not help, and the line must not say it did
            gave_up = spent < GAVE_UP_SHARE * time_limit
            announce(progress, "no plan: looking for a budget that plans")
            hint = _budget_found_hint(p, started + time_limit, more_time_helps=not gave_up,
                                      stopped_at=left_at[0] if left_at else None)
            raise NoPlan((f"no heuristic fits: they gave up after {spent:.0f} s of the "
                          f"{time_limit:g} s allowed, no move lowering the RAM over the budget"
                          if gave_up else f"no heuristic fits within {time_limit:g} s")
                         + (f" in any of {orders} memory-aware orders" if orders > 1 else "")
                         + ", and on a graph this large "
                         f"({p.n} nodes) the exact solvers find none from scratch; "
                         + hint.text, hint)
        return _report(p, best_known, "feasible", None, started, time_limit, summary,
                       timing={"first_plan_s": first_plan, "best_plan_s": best_at},
                       progress=progress, **order_details)
    remaining = time_limit - (clock.perf_counter() - started)
    if best_known is not None and remaining < EXACT_MIN_S:
        return _report(p, best_known, "timeout", None, started, time_limit, summary,
                       timing={"first_plan_s": first_plan, "best_plan_s": best_at},
                       progress=progress, **order_details,
                       fallback=f"{solver}, not started: {max(0.0, remaining):.2f} s of the "
                       "time limit was left")
    remaining = max(EXACT_MIN_S, remaining)
    announce(progress, "CP-SAT" if solver == "cpsat" else "MILP")
    if solver == "cpsat":
        return _solve_cpsat(p, remaining, workers, best_known, first_plan, started, time_limit,
                            summary, progress, best_at)
    return _solve_milp(p, remaining, backend, workers, best_known, first_plan, started,
                       time_limit, summary)


# Budgets above the asked one (x the room it leaves for tensors) that the feasibility phase
# tries when the asked one has no plan in time: the user learns a budget that works instead of
# only "none found". A search succeeds fast and fails slowly (a failing one on a large graph runs
# to the deadline), so the ladder steps down from the peak of the schedule without
# recomputation, which always plans, and stops at its first miss.
LADDER_STEPS = (1.5, 1.4, 1.3, 1.25, 1.2, 1.15, 1.1, 1.075, 1.05, 1.025)
HINT_EXTRA, HINT_EXTRA_MAX_S = 0.25, 5.0
# the searches ended before this share of the limit: they gave up, and more time would
# not have helped
GAVE_UP_SHARE = 0.8
# of the time the hint has, what the floor it names may take (the pebbling floor's search,
# at most its 2 s), before the ladder
FLOOR_SHARE = 0.25


def feasibility_plans_at(p: Problem, budget_bytes: int, deadline: float) -> bool:
    """Whether the feasibility phase finds a plan within `budget_bytes` for the problem's graph
    and costs before the deadline (a perf_counter time)."""
    wider = replace(p, budget_bytes=budget_bytes)
    decisions = BASELINES[FEASIBILITY_PHASE](wider, deadline)
    # replayed, not taken on the heuristic's word: lowering may keep a parameter reader's
    # value past its update (stages.py), which the heuristic did not count
    return decisions is not None and evaluate(wider, decisions).fits_budget


def _ladder_budget(p: Problem, factor: float) -> int:
    """The budget that leaves `factor` x this one's room for tensors (beyond fixed memory): a
    ladder on the whole budget would step by megabytes of weights where activations are few."""
    return p.fixed + int((p.budget_bytes - p.fixed) * factor)


def plain_peak_in_order(p: Problem) -> int:
    """RAM peak of the schedule that computes every node once in the problem's order and pages
    nothing (fixed memory included): a budget that always plans."""
    from .events import EventSchedule  # local: needs numpy, like the feasibility phase
    return int(EventSchedule(p).at.max()) + p.fixed


def _hint_deadline(started: float, time_limit: float) -> float:
    """Where an exact solver used the time and found nothing, the budget ladder still gets a
    little (HINT_EXTRA of the time limit, at most HINT_EXTRA_MAX_S) past the limit: an error
    that names a budget that plans is worth those seconds."""
    return max(started + time_limit,
               clock.perf_counter() + min(HINT_EXTRA_MAX_S, HINT_EXTRA * time_limit))


def _costs_plain(p: Problem, evaluation: Evaluation) -> bool:
    """Whether a schedule costs what the plain schedule does (to rounding): its paging, if
    any, wholly hidden behind compute."""
    return evaluation.objective <= plain_objective(p) * (1 + 1e-9)


def _budget_found_hint(p: Problem, deadline: float, more_time_helps: bool = True,
                       stopped_at=None) -> BudgetHint:
    """What to try next: a budget that plans (_smallest_budget_hint), and, where the plan may
    page to no tier, paging, which fits any budget from the floor up (Belady's evictor): on
    random layered graphs of 5000 nodes at 0.8, where recomputation alone found no plan on
    9 of 10 seeds, every seed plans with a flash tier (docs/planner.md)."""
    hint = _smallest_budget_hint(p, deadline, more_time_helps, stopped_at)
    if p.tiers:
        return hint
    return replace(hint, text=hint.text + ", or let the plan page what recomputation cannot "
                   "free (--paging flash or host, with a profile that measured it; for flash, "
                   "--flash-read-bw and --flash-write-bw also do): paging fits any budget "
                   "that holds each node with its inputs")


def _smallest_budget_hint(p: Problem, deadline: float, more_time_helps: bool = True,
                          stopped_at=None) -> BudgetHint:
    """What to try next: the smallest budget of LADDER_STEPS (x the room for tensors), from the
    top down, for which the feasibility phase finds a plan before the deadline (a perf_counter
    time), else the peak of the schedule the feasibility phase stopped at (`stopped_at`, an
    EventSchedule), else the plain schedule's peak in this order; and a larger time limit, where
    the search used it all. Where no rung could be tried in the time left (a time limit under
    about 4 s), it says so rather than that none plans."""
    more_time = ", or a larger --time-limit" if more_time_helps else ""
    left = deadline - clock.perf_counter()
    floor, _ = p.smallest_budget(max(0.1, min(2.0, FLOOR_SHARE * left)))
    plain = plain_peak_in_order(p)
    reached = _peak_that_plans(p, stopped_at, plain)
    smallest, found, tried = min(plain, reached or plain), None, False
    for step in LADDER_STEPS:
        budget = _ladder_budget(p, step)
        if budget >= smallest:
            continue
        if deadline - clock.perf_counter() <= 1.0:
            break
        tried = True
        if not feasibility_plans_at(p, budget, deadline):
            break
        smallest, found = budget, step
    # a budget that plans, not the least: a budget between the floor and it may plan too
    # (with more time, or in a step the ladder does not try), and the error says so. The floor
    # is the one a smaller budget is refused at (without paging the pebbling floor, above a
    # node's inputs + output; searched before the ladder, which may run to the deadline)
    between = (f"; the least budget that plans lies between the floor, "
               f"{floor} bytes (a proven lower bound), and {{}}")
    # in bytes above the asked budget: the ladder's factor applies to the room beyond fixed
    # memory, which a ratio beside two budgets did not say
    above = smallest - p.budget_bytes
    above_this = f"({above} bytes, {above / p.budget_bytes:.1%}, above this budget)"
    if found is not None:
        return BudgetHint(f"the feasibility phase finds a plan at {smallest} bytes {above_this}"
                          + between.format(smallest) + f": try --budget {smallest}"
                          + more_time, floor, smallest)
    if smallest != plain:
        return BudgetHint(f"the feasibility phase got the peak down to {smallest} bytes "
                          f"{above_this} before it stopped" + between.format(smallest)
                          + f": try --budget {smallest}" + more_time, floor, smallest)
    without = (f"the schedule without recomputation in this order fits {plain} bytes "
               f"({plain / p.budget_bytes:.3g}x this budget)")
    if not tried:  # the ladder had no time: a smaller budget may well plan
        return BudgetHint(f"{without}, and the time left tried no smaller budget"
                          + between.format(plain) + f": try --budget {plain}, or give a "
                          "larger --time-limit (4 s or more) to learn a smaller budget that "
                          "plans", floor, plain)
    return BudgetHint(f"{without} and the feasibility phase found no smaller budget in time"
                      + between.format(plain) + f": try --budget {plain}{more_time}",
                      floor, plain)


def _peak_that_plans(p: Problem, sched, plain: int) -> int | None:
    """The peak of the schedule a failed feasibility phase got to, where it is below `plain`
    and replays within it (replayed, as feasibility_plans_at does); else None."""
    if sched is None or int(sched.at.max()) + p.fixed >= plain:
        return None
    from .intervals import decisions_from_intervals
    decisions = decisions_from_intervals(p, sched.residencies())
    peak = evaluate(replace(p, budget_bytes=plain), decisions).sim.peak_bytes
    if peak >= plain or not evaluate(replace(p, budget_bytes=peak), decisions).fits_budget:
        return None
    return int(peak)


def _since(started: float, progress: Progress | None) -> Progress | None:
    """`progress` told the seconds since planning started (a solver counts from its own
    start)."""
    if progress is None:
        return None
    offset = clock.perf_counter() - started
    return lambda seconds, objective, bound: progress(offset + seconds, objective, bound)


def _improve_by_lns(p: Problem, start: Candidate, seconds: float, workers: int | None = None,
                    rounds: int | None = None,
                    progress: Progress | None = None) -> Candidate | None:
    """The window LNS's plan from `start`, if it is better (None otherwise), found when the
    LNS found it. Where cores are spare, other seeds of the LNS run beside it in child
    processes (LNS_STREAMS in all at most) and the cheapest plan of them all is taken.
    `rounds`: each stream's (reproducible runs). `progress` is told each new best of the
    first stream, with the stage model's bound."""
    from .lns import improve_decisions
    if seconds <= 0:  # no time left for it: its set-up alone took 0.25 s on 2000 nodes
        return None
    if progress is not None:
        began, bound = clock.perf_counter(), stage_lower_bound(p)

        def told(change: float) -> None:  # the objective moves as the recompute cost does
            progress(clock.perf_counter() - began, start.evaluation.objective + change, bound)
    else:
        told = None
    exact = have_cpsat()  # exact rounds, in a child process if this one holds highspy
    until = clock.perf_counter() + seconds  # every stream stops then, a child's start counted
    streams = [isolated.Child(improve_decisions, (p, start.decisions, seconds),
                              {"seed": seed, "exact": exact, "rounds": rounds, "until": until},
                              what=f"LNS seed {seed}")
               for seed in range(1, 1 + isolated.spare_cores(workers, LNS_STREAMS - 1))
               if seconds > CHILD_START_S]  # else it would have no time once started
    try:
        results = [isolated.call("ortools", improve_decisions, p, start.decisions, seconds,
                                 exact=True, rounds=rounds, progress=told, until=until)
                   if exact else improve_decisions(p, start.decisions, seconds, rounds=rounds,
                                                   progress=told, until=until)]
        for child in streams:
            try:
                results.append(child.result(timeout=STREAM_GRACE_S))
            except (RuntimeError, TimeoutError):
                pass  # that stream's plan is lost, not this one's
    finally:
        for child in streams:
            child.cancel()
    # cheapest by the LNS's own count first: the simulator (seconds at 5000 nodes) then
    # usually runs once, as with one stream
    for decisions, info in sorted(results, key=lambda r: r[1].get("best_cost", math.inf)):
        if decisions == start.decisions:  # no change found (a child's is a copy)
            continue
        evaluation = evaluate(p, decisions)
        if evaluation.feasible and evaluation.objective < start.evaluation.objective:
            return Candidate(f"{start.solver}+lns", evaluation, decisions,
                             info.get("best_at") or clock.perf_counter())
    return None


def _solve_cpsat(p, remaining, workers, best_known, first_plan, started, time_limit, summary,
                 progress, known_at=None) -> SolveReport:
    from .cpsat import solve_cpsat_widening
    offset = clock.perf_counter() - started
    outcome = isolated.call("ortools", solve_cpsat_widening, p, remaining,
                            hint=best_known.decisions if best_known else None, workers=workers,
                            progress=_since(started, progress))
    details = {"workers": outcome.workers, "scaling": outcome.scaling,
               "bound_scope": "stage model" if outcome.exact_model else
               f"schedules with up to {outcome.residency_limit} residencies per node (more "
               "where the starting plan has them)"}
    found = None
    if outcome.decisions is not None:
        evaluation = evaluate(p, outcome.decisions)
        # the model forbids recomputing a parameter reader after its update, so lowering
        # replays its plan as it is: where the simulator disagrees, a bug, never output
        if not evaluation.feasible:
            raise RuntimeError("CP-SAT returned a plan the simulator rejects "
                               f"(peak {evaluation.sim.peak_bytes} of {p.budget_bytes} bytes)")
        found = Candidate("cpsat", evaluation, outcome.decisions)
    if outcome.first_solution_s is not None:
        cp_first = offset + outcome.first_solution_s
        first_plan = cp_first if first_plan is None else min(first_plan, cp_first)
    if found is not None and (best_known is None or
                              found.evaluation.replaces(best_known.evaluation)):
        best_at = offset + (outcome.best_solution_s or 0.0)
        if best_known is not None and found.evaluation.objective >= \
                best_known.evaluation.objective * (1 - OBJECTIVE_TIE):
            best_at = known_at if known_at is not None else first_plan  # CP-SAT only
            # confirmed the plan known before it started
        return _report(p, found, outcome.status, outcome.bound, started, time_limit, summary,
                       timing={"first_plan_s": first_plan, "best_plan_s": best_at},
                       progress=progress, **details)
    if best_known is not None:
        return _report(p, best_known, "optimal" if outcome.status == "optimal" else "timeout",
                       outcome.bound, started, time_limit, summary,
                       timing={"first_plan_s": first_plan,
                               "best_plan_s": known_at if known_at is not None else first_plan},
                       progress=progress, **_kept_plan_note("cpsat", outcome.status), **details)
    if outcome.status == "infeasible":
        raise _infeasible(p, "CP-SAT")
    announce(progress, "no plan: looking for a budget that plans")
    hint = _budget_found_hint(p, _hint_deadline(started, time_limit))
    raise NoPlan(f"no schedule found within {time_limit:g} s (no heuristic fits and "
                 f"{_cpsat_none_why(outcome)}); " + hint.text, hint)


def _kept_plan_note(solver: str, status: str) -> dict:
    """How a plan found before the exact solver, and kept, is labelled. Where that solver
    proved optimality, the plan is optimal and the solver proved it ("fallback from cpsat
    optimal" read as a failure); otherwise the plan is what was left when it found none
    better."""
    if status == "optimal":
        return {"proven_optimal_by": solver}
    # "cpsat unknown" read as a riddle: say what the exact solver's status means here
    said = {"unknown": "found no plan in time", "feasible": "found none better in time",
            "timeout": "found none better in time",
            # the kept plan is valid, so the proof is of the solver's model alone (QA: a
            # deadline passed back as named, the plan exactly on it, read "cpsat infeasible")
            "infeasible": "proved that its own model has none (it rounds times and sizes up "
                          "and may limit recomputations), and this plan lies outside it"}
    return {"fallback": f"{solver}, which {said[status]}" if status in said
            else f"{solver} {status}"}


def _cpsat_none_why(outcome) -> str:
    """Why CP-SAT returned no plan, in words: what it proved, and with what limit."""
    if outcome.status == "build-timeout":
        return "CP-SAT's model took the time to build, so it was not solved"
    if outcome.proven_limit is None:
        return "CP-SAT found none in time"
    k = outcome.proven_limit
    proved = f"CP-SAT proved that none fits with up to {k} residenc{'y' if k == 1 else 'ies'} " \
        "per node"
    if outcome.status == "limited":  # the widest search it had time for proved it too
        return f"{proved}, so a schedule that recomputes a node more often may still exist"
    return f"{proved} and found none with more in time"


def _solve_milp(p, remaining, backend, workers, best_known, first_plan, started, time_limit,
                summary) -> SolveReport:
    from .milp import solve_milp, solver_files
    library = "highspy"  # PuLP imports highspy whichever backend it runs
    margin, outcome, milp_best = 0, None, None
    # every attempt shares the time left: a re-solve once had the whole of it again, and a
    # 10 s limit became 20 s
    deadline = clock.perf_counter() + remaining
    # made here, where Ctrl-C lands: leaving it kills CBC (even where the child process that
    # started it was killed) and removes PuLP's files
    with solver_files() as files:
        for attempt in range(3):
            left = deadline - clock.perf_counter()
            if attempt > 0 and left < MILP_RETRY_MIN_S:
                break
            outcome = isolated.call(library, solve_milp, p, max(left, EXACT_MIN_S),
                                    backend, best_known.decisions if best_known else None,
                                    workers, budget_margin_bytes=margin, files=files)
            if outcome.decisions is None:
                break
            evaluation = evaluate(p, outcome.decisions)
            if evaluation.feasible:
                milp_best = Candidate(f"milp:{backend}", evaluation, outcome.decisions)
                break
            # The solver's tolerance let memory or time creep over by a hair: tighten, re-solve.
            margin += max(1, evaluation.sim.peak_bytes - p.budget_bytes) * 2
    bound = outcome.bound if outcome else None
    done = clock.perf_counter() - started
    scope = {"bound_scope": "stage model"}  # the MILP is the stage model, its bound one of it
    if milp_best is not None and (best_known is None or
                                  milp_best.evaluation.replaces(best_known.evaluation)):
        return _report(p, milp_best, outcome.status, bound, started, time_limit, summary,
                       timing={"first_plan_s": first_plan if first_plan is not None else done,
                               "best_plan_s": done}, **scope)
    if best_known is not None:
        status = "timeout" if outcome.status != "optimal" else "optimal"
        return _report(p, best_known, status, bound, started, time_limit, summary,
                       timing={"first_plan_s": first_plan,
                               "best_plan_s": best_known.found_at - started},
                       **_kept_plan_note(f"milp:{backend}", outcome.status), **scope)
    if outcome.status == "infeasible":
        raise _infeasible(p, "MILP")
    why = {"failed": "the MILP solver failed",
           "build-timeout": "the MILP's model took the time to build, so it was not solved"}.get(
        outcome.status, "the MILP found none in time")
    hint = _budget_found_hint(p, _hint_deadline(started, time_limit))
    raise NoPlan(f"no schedule found within {time_limit:g} s (no heuristic fits and {why}); "
                 + hint.text, hint)


def _fastest_within_budget(p: Problem, solver: str, time_limit: float, backend: str,
                           workers: int | None, started: float,
                           total_limit: float) -> SolveReport:
    """The least deadline-counted time within the budget: a plan, or the smallest deadline."""
    fast = deadline_free_problem(p)
    try:
        report = _solve(fast, solver, time_limit, backend, workers, None, None,
                        clock.perf_counter())
    except PlanInterrupted:  # its plan is for the problem without the deadline: not kept
        raise KeyboardInterrupt from None
    ev = evaluate(p, report.decisions)  # the real costs and the real deadline
    achieved = p.deadline_time_of(ev.sim) / p.plain_time
    if ev.feasible:  # the deadline can be met after all: the fastest plan meets it
        chosen = Candidate(report.plan.solver["name"], ev, report.decisions)
        return _report(p, chosen, "feasible", None, started, total_limit, report.baselines,
                       fallback=f"{solver} found no plan that meets the deadline, and the "
                                "fastest plan within the budget meets it")
    proven = report.plan.solver["status"] == "optimal"
    smallest = round_up(achieved, 4)  # up, as printed: passed back, it is met
    # unproven, the search found none: a heuristic's miss is no proof that none exists
    found_none = (f"no schedule within {p.budget_bytes} bytes meets" if proven else
                  f"{solver} found no schedule within {p.budget_bytes} bytes that meets")
    raise InfeasibleDeadline(
        f"{found_none} the deadline of {p.deadline:g}x the "
        f"plain time; the smallest deadline that can be met is "
        + (f"{smallest:g}x (proven by {report.plan.solver['name']})" if proven else
           f"at most {smallest:g}x (the fastest plan {report.plan.solver['name']} found in "
           f"{time_limit:.0f} s)") + "; pass a --deadline at least that, or a larger --budget",
        smallest, achieved)  # --json says what the line says: the exact figure, passed
    # back, sits on the edge that CP-SAT's rounding of times puts out of its model's reach


def deadline_free_problem(p: Problem) -> Problem:
    """The same budget with the objective 'the time the deadline counts' and no deadline."""
    costs = p.costs
    if p.paging_time == "free":  # the deadline does not count paging: neither may this objective
        costs = replace(costs, tiers={
            name: replace(tier, in_time_s=[0.0] * p.n, out_time_s=[0.0] * p.n)
            for name, tier in costs.tiers.items()})
    return replace(p, costs=costs, objective="time", deadline=None)


def _infeasible(p: Problem, prover: str) -> InfeasibleBudget:
    smallest, _ = p.smallest_budget()
    return InfeasibleBudget(
        f"no schedule fits {p.budget_bytes} bytes"
        + (f" within the deadline ({p.deadline:g}x the plain time)" if p.deadline else "")
        + f" (proven by the {prover}); no schedule fits below {smallest} bytes in any case "
        "(a node's inputs and output, or without paging the pebbling floor), and recomputation "
        "or the deadline needs more", smallest)


def _cover_bound(p: Problem, seconds: float) -> dict:
    """The idle-gap covering bound (cover_bound.py), its integer program where it is small
    enough to gain on the LP within `seconds`; {"bound": None, "error": ...} if HiGHS fails."""
    from .cover_bound import cover_lower_bound
    try:
        return isolated.call("highspy", cover_lower_bound, p, max(0.5, seconds),
                             integer=p.n <= COVER_INTEGER_NODES)
    except Exception as exc:  # a bound is extra: the plan stands without it, the error said
        return {"bound": None, "error": str(exc)}


def _report_reserve(p: Problem, delaying: bool = True) -> float:
    """The seconds _report's own work is expected to take on `p` (with the delaying of
    page-outs, or only the bounds after it)."""
    per_node = BOUNDS_S_PER_NODE + (DELAY_S_PER_NODE if delaying and p.overlapped else 0.0)
    return (REPORT_S if p.n >= COVER_MIN_NODES else 0.0) + per_node * p.n


def _report(p: Problem, chosen: Candidate, status: str, bound: float | None, started: float,
            time_limit: float, summary: dict[str, float | None], timing: dict | None = None,
            fallback: str | None = None, progress: Progress | None = None,
            **details) -> SolveReport:
    if p.overlapped and status != "interrupted":  # Ctrl-C wants out now
        announce(progress, "delaying page-outs")
        with hoisting_until(started + time_limit - _report_reserve(p, delaying=False)):
            chosen = replace(chosen, evaluation=with_page_outs_delayed(p, chosen.evaluation))
    ev = chosen.evaluation
    value = ev.value
    # A bound always: the combinatorial stage-model bounds where they are stronger (they also
    # bound a solver's restricted model, whose schedules are stage-model schedules).
    stage_bound = stage_lower_bound(p)
    if p.overlapped and bound is not None:  # the solvers' models count paging stop-the-world:
        details["stop_the_world_bound"] = bound  # not a bound once paging overlaps compute
        bound = None
    if bound is None or not math.isfinite(bound) or stage_bound > bound:
        bound, details["bound_scope"] = stage_bound, BOUND_SCOPE
    details["stage_model_bound"] = stage_bound
    if p.n >= COVER_MIN_NODES and status != "interrupted":  # Ctrl-C wants out now
        announce(progress, "lower bound (covering problem)")
        cover = _cover_bound(p, min(COVER_MAX_S, COVER_SHARE * time_limit))
        details["cover_bound"] = cover
        if cover.get("bound") is not None and cover["bound"] > bound:
            bound, details["bound_scope"] = cover["bound"], COVER_SCOPE
    with_reads = with_io_timeline(p, bound)
    if with_reads > bound:
        bound = with_reads
        details["bound_scope"] += "; with the reads from home the IO timeline must carry"
    if p.given_graph is not None and details.get("bound_scope"):
        details["bound_scope"] += ", in the memory-aware order planned (not over all orders)"
    gap = None
    if bound is not None and math.isfinite(bound):
        gap = 0.0 if value <= 0 else max(0.0, (value - bound) / abs(value))
        if progress is not None:  # the final bound, known only now, while the arena is laid
            progress(clock.perf_counter() - started, value, bound)
    solver = {"name": chosen.solver, "status": status, "lower_bound": bound, "gap": gap,
              "solve_time_s": clock.perf_counter() - started, "time_limit_s": time_limit,
              "baselines": summary, **(timing or {}), **details}
    if fallback:
        solver["fallback_from"] = fallback
    predicted = ev.sim.summary()
    predicted["objective_value"] = value
    # the plan is one micro-pass; what a step of K of them costs, each pass its own work
    step = accumulated_step(p.graph, p.costs, ev.stages, ev.sim, micro_batches_of(p.source_graph))
    if step is not None:
        predicted["accumulated_step"] = step
    problem = {"objective": p.objective, "deadline": p.deadline, "paging": list(p.tiers),
               "paging_time": p.paging_time, "io": p.io, "profile": p.profile_name,
               "costs": p.costs.describe(), "graph": p.graph.name, "nodes": p.n,
               "fixed_bytes": p.fixed, "runtime_warm_bytes": p.costs.runtime_warm_bytes,
               "order": "given" if p.given_graph is None else "memory",
               # choosing the order took this long, counted in the plan's times
               **({"order_s": round(p.order_s, 3)} if p.given_graph is not None else {})}
    plan = Plan(stages=ev.stages, graph_fingerprint=p.source_graph.fingerprint(),
                budget_bytes=p.budget_bytes, objective=p.objective, solver=solver,
                predicted=predicted, problem=problem, fingerprint=p.fingerprint(),
                tiers={z: p.costs.tier_figures[z] for z in p.tiers if z in p.costs.tier_figures})
    return SolveReport(plan, ev, summary, chosen.decisions, node_order(p))
