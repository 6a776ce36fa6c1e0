"""Choose and run solvers; every answer is validated by the simulator and becomes a Plan."""

from __future__ import annotations

import math
import time as clock
from dataclasses import dataclass, field

from edge_remat_agent.formats import Plan

from .baselines import BASELINES
from .evaluate import Evaluation, evaluate
from .problem import InfeasibleBudget, Problem
from .stages import StageDecision

# Above this many nodes the stage x node MILP (O(n^2) binaries) is not worth starting.
MILP_MAX_NODES = 300


class NoPlan(ValueError):
    """No schedule was found (or exists) for this problem; the message says which and why."""


@dataclass
class Candidate:
    solver: str
    evaluation: Evaluation
    decisions: list[StageDecision]


@dataclass
class SolveReport:
    plan: Plan
    evaluation: Evaluation
    baselines: dict[str, float | None] = field(default_factory=dict)


def run_baselines(p: Problem) -> dict[str, Candidate | None]:
    out: dict[str, Candidate | None] = {}
    for name, baseline in BASELINES.items():
        decisions = baseline(p)
        out[name] = None if decisions is None else Candidate(
            f"heuristic:{name}", evaluate(p, decisions), decisions)
    return out


def solve(p: Problem, solver: str = "auto", time_limit: float = 60.0, backend: str = "cbc",
          threads: int | None = None) -> SolveReport:
    p.check_budget()
    started = clock.perf_counter()
    baselines = run_baselines(p)
    feasible = [c for c in baselines.values() if c is not None and c.evaluation.feasible]
    best_baseline = min(feasible, key=lambda c: c.evaluation.objective, default=None)
    summary = {name: (c.evaluation.value if c and c.evaluation.feasible else None)
               for name, c in baselines.items()}

    if solver.startswith("heuristic:"):
        name = solver.split(":", 1)[1]
        if name not in BASELINES:
            raise NoPlan(f"unknown heuristic {name!r} (known: {', '.join(BASELINES)})")
        chosen = baselines[name]
        if chosen is None or not chosen.evaluation.feasible:
            raise NoPlan(f"heuristic {name!r} finds no schedule within the budget"
                         + (" and deadline" if p.deadline else "")
                         + "; try --solver milp")
        return _report(p, chosen, "feasible", None, started, time_limit, summary)

    if solver not in ("auto", "milp"):
        raise NoPlan(f"unknown solver {solver!r} (use auto, milp or heuristic:NAME)")
    if solver == "auto" and p.n > MILP_MAX_NODES:
        if best_baseline is None:
            raise NoPlan(f"no baseline fits and the graph ({p.n} nodes) is too large for the MILP")
        return _report(p, best_baseline, "feasible", None, started, time_limit, summary)

    from .milp import solve_milp
    remaining = max(1.0, time_limit - (clock.perf_counter() - started))
    margin, outcome, milp_best = 0, None, None
    for _attempt in range(3):
        outcome = solve_milp(p, remaining, backend, best_baseline.decisions if best_baseline
                             else None, threads, budget_margin_bytes=margin)
        if outcome.decisions is None:
            break
        evaluation = evaluate(p, outcome.decisions)
        if evaluation.feasible:
            milp_best = Candidate(f"milp:{backend}", evaluation, outcome.decisions)
            break
        # The solver's tolerance let memory or time creep over by a hair: tighten and re-solve.
        margin += max(1, evaluation.sim.peak_bytes - p.budget_bytes) * 2
    bound = outcome.bound if outcome else None
    if milp_best is not None and (best_baseline is None or milp_best.evaluation.objective
                                  <= best_baseline.evaluation.objective * (1 + 1e-9)):
        return _report(p, milp_best, outcome.status, bound, started, time_limit, summary)
    if best_baseline is not None:
        status = "timeout" if outcome.status != "optimal" else "optimal"
        return _report(p, best_baseline, status, bound, started, time_limit, summary,
                       fallback=f"milp:{backend} {outcome.status}")
    if outcome.status == "infeasible":
        smallest, _ = p.smallest_budget()
        raise InfeasibleBudget(
            f"no schedule fits {p.budget_bytes} bytes"
            + (f" within the deadline ({p.deadline:g}x the plain time)" if p.deadline else "")
            + f" (proven by the MILP); every node's inputs and output alone need {smallest} "
            "bytes, and recomputation or the deadline needs more", smallest)
    raise NoPlan(f"no schedule found within {time_limit:g} s (no baseline fits and the MILP "
                 f"found none in time); try a larger --time-limit or budget")


def _report(p: Problem, chosen: Candidate, status: str, bound: float | None, started: float,
            time_limit: float, summary: dict[str, float | None],
            fallback: str | None = None) -> SolveReport:
    ev = chosen.evaluation
    value = ev.value
    gap = None
    if bound is not None and math.isfinite(bound):
        gap = 0.0 if value <= 0 else max(0.0, (value - bound) / abs(value))
    solver = {"name": chosen.solver, "status": status, "lower_bound": bound, "gap": gap,
              "solve_time_s": clock.perf_counter() - started, "time_limit_s": time_limit,
              "baselines": summary}
    if fallback:
        solver["fallback_from"] = fallback
    predicted = ev.sim.summary()
    predicted["objective_value"] = value
    problem = {"objective": p.objective, "deadline": p.deadline, "paging": list(p.tiers),
               "paging_time": p.paging_time, "profile": p.profile_name,
               "costs": p.costs.describe(), "graph": p.graph.name, "nodes": p.n,
               "fixed_bytes": p.fixed}
    plan = Plan(stages=ev.stages, graph_fingerprint=p.graph.fingerprint(),
                budget_bytes=p.budget_bytes, objective=p.objective, solver=solver,
                predicted=predicted, problem=problem, fingerprint=p.fingerprint())
    return SolveReport(plan, ev, summary)
