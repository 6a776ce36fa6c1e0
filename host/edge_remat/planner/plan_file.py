"""One budget's plan as `edge-remat plan` writes it: build the problem and solve (the plan
carries the figures of the tiers it pages to). The `plan` command and each fleet task call
this, so that a fleet's plan file is the plan the command gives for the same inputs."""

from __future__ import annotations

from edge_remat_agent.costs import CostModel
from edge_remat_agent.formats import Graph, Profile, Tier

from ..units import Budget
from .build import build_problem
from .interrupt import PlanInterrupted
from .ordering import ORDER_SHARE
from .solve import Progress, SolveReport, solve
from .status_line import announce


def make_plan(graph: Graph, budget: "Budget | str | float", profile: Profile | None = None,
              objective: str = "time", deadline: float | None = None,
              paging: str | None = None, tiers: dict[str, Tier] | None = None,
              paging_time: str = "counted", solver: str = "auto", time_limit: float = 60.0,
              backend: str = "cbc", workers: int | None = None,
              progress: Progress | None = None, plain_peak: int | None = None,
              io: str = "overlap", arena: str = "best-fit",
              arena_time_limit: float = 10.0, order: str = "auto",
              arena_fit: bool = False,
              costs: CostModel | None = None) -> "tuple[dict, SolveReport]":
    """(the plan as written, the solver's report). Raises InfeasibleBudget,
    InfeasibleDeadline or NoPlan where no plan can be had. `plain_peak`: a fraction's
    reference when the caller has it already. `arena`: the address layout the plan carries
    (planner/arena.py: best-fit | cpsat | none); `arena_fit`: where the arena and fixed
    memory pass the budget, solve again lower until they fit (planner/arena_fit.py). Ctrl-C
    once a plan exists raises PlanInterrupted with the best plan so far (arena laid out
    best-fit, not fitted; during the fitting, the plan at the budget asked). `costs`: the
    graph's cost model where the caller has built it (build_problem's `costs`)."""
    def problem_at(budget, seconds: float, plain: int | None = None):
        return build_problem(graph, budget, profile, objective, deadline, paging, tiers,
                             paging_time, plain, io, order, order_time_s=ORDER_SHARE * seconds,
                             costs=costs)

    announce(progress, "preparing the problem")
    problem = problem_at(budget, time_limit, plain_peak)

    def lay_out(plan, method: str = arena):
        from .arena import plan_arena
        return plan_arena(problem.graph, plan, problem.costs, method, arena_time_limit, workers)

    try:
        report = solve(problem, solver, time_limit, backend, workers, progress=progress)
    except PlanInterrupted as stop:  # the best plan so far, laid out fast (best-fit)
        if arena != "none":
            stop.report.plan.arena = lay_out(stop.report.plan, "best-fit")
        raise
    if arena != "none":
        announce(progress, "laying out the arena")
        layout = lay_out(report.plan)
        if arena_fit:
            from .arena_fit import RETRY_TIME_SHARE, fit_arena

            def solve_at(budget_bytes: int) -> SolveReport:
                seconds = RETRY_TIME_SHARE * time_limit
                return solve(problem_at(f"{budget_bytes}B", seconds), solver, seconds, backend,
                             workers)

            try:
                report, layout = fit_arena(problem.graph, problem.budget_bytes, report,
                                           layout, solve_at, lay_out)
            except KeyboardInterrupt:  # the plan at the budget asked stands, its arena unfitted
                layout.details["fit"] = {"budget_bytes": problem.budget_bytes,
                                         "interrupted": True}
                report.plan.arena = layout
                report.plan.solver["status"] = "interrupted"
                raise PlanInterrupted(report) from None
        report.plan.arena = layout
    return report.plan.to_dict(), report
