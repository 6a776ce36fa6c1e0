"""A schedule whose arena fits the budget, not only its tensors (Coop, NeurIPS 2023: a plan
that ignores how its tensors pack loses part of its savings to fragmentation).

The solvers bound the plan's tensor peak; the arena that holds those tensors at fixed offsets
(arena.py) is larger wherever lifetimes leave gaps that no later block fits. Where the arena
and fixed memory pass the budget, the schedule is solved again at a budget the overshoot below
its peak (below the last budget would not do: the last schedule already fits that, and comes
back with the same arena): a schedule slightly dearer in time whose tensors pack into a smaller
arena. The first schedule whose arena fits is kept (each retry is dearer: its budget is
lower); where none fits within FIT_TRIES solves, the first schedule, and its layout says by how
much it is over.
"""

from __future__ import annotations

from typing import Callable

from edge_remat_agent.formats import Graph, Plan
from edge_remat_agent.formats.arena import ArenaLayout

from .arena import fixed_bytes
from .problem import InfeasibleBudget
from .solve import NoPlan, SolveReport

FIT_TRIES = 3  # solves in all, the first one included
RETRY_TIME_SHARE = 0.5  # of the caller's time limit, for each solve after the first


def fit_arena(graph: Graph, budget_bytes: int, report: SolveReport, layout: ArenaLayout,
              solve_at: Callable[[int], SolveReport],
              lay_out: Callable[[Plan], ArenaLayout]) -> tuple[SolveReport, ArenaLayout]:
    """(the solve and layout to keep). `solve_at(budget)` solves the same problem at
    another budget (raising InfeasibleBudget or NoPlan where none fits), `lay_out(plan)`
    lays a plan out; the kept layout's details carry `fit` (what was tried)."""
    def footprint_bytes(plan: Plan, layout: ArenaLayout) -> int:  # what the board pays
        return layout.size_bytes + fixed_bytes(graph, plan)

    def tried(budget: int, report: SolveReport, layout: ArenaLayout) -> dict:
        return {"budget_bytes": budget, "footprint_bytes": footprint_bytes(report.plan, layout),
                "time_s": report.plan.predicted.get("time_s")}

    tries = [tried(budget_bytes, report, layout)]
    kept, last = (report, layout), report
    over = footprint_bytes(report.plan, layout) - budget_bytes
    while over > 0 and len(tries) < FIT_TRIES:
        target = last.plan.predicted["peak_bytes"] - over  # a schedule other than the last
        try:
            retry = solve_at(target)
        except (InfeasibleBudget, NoPlan) as error:
            tries.append({"budget_bytes": target, "no_plan": str(error).splitlines()[0]})
            break
        retry_layout, last = lay_out(retry.plan), retry
        tries.append(tried(target, retry, retry_layout))
        over = footprint_bytes(retry.plan, retry_layout) - budget_bytes
        if over <= 0:
            kept = (retry, retry_layout)
    report, layout = kept
    footprint = footprint_bytes(report.plan, layout)
    layout.details["fit"] = {
        "budget_bytes": budget_bytes, "planned_at_bytes": report.plan.budget_bytes,
        "fits": footprint <= budget_bytes, "footprint_bytes": footprint, "tries": tries}
    return kept
