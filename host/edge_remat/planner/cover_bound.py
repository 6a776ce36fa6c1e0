"""A lower bound for the stage model from all stages at once: the idle-gap covering problem.

Between two consecutive uses of a tensor u (its compute, then each reading node's first compute
in the execution order), u is idle: it may leave RAM anywhere in that gap, and every gap it
leaves costs at least one way back (a recomputation, or a page-out and a page-in: the cheapest,
as in bounds.py), however many stages of the gap it stays out. At node t's first compute RAM
holds t's inputs, its output, its workspace and the fixed memory, plus every tensor idle over t
that has not left. So with z_g = 1 when u leaves in gap g:

    minimise  sum_g cost_u(g) z_g   such that, at every stage t over the budget,
              sum_{g idle over t} min(size_u(g), excess_t) z_g >= excess_t,   z_g in {0, 1}

is a relaxation of every schedule within the budget (it ignores what bringing u back needs in
RAM), so any lower bound of it bounds the schedule's cost. Unlike bounds.py's largest single
stage, it charges each gap once for all the stages it serves and sums over disjoint gaps. The
rows are the stages over the budget; a gap covers a contiguous run of them. Solved by HiGHS (its
MIP within a time limit: the dual bound it proves is valid whenever it stops; or the LP).
"""

from __future__ import annotations

import time as clock

import numpy as np

from .bounds import first_compute_needs, leave_costs, plain_objective
from .problem import Problem

SCOPE = "stage model (idle-gap covering, HiGHS)"


def covering_problem(p: Problem) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                          np.ndarray]:
    """(excess per over-budget stage, column costs, CSC starts, row indices, values) of the
    covering problem; columns are the idle gaps that cover at least one over-budget stage."""
    sizes = np.asarray(p.sizes, dtype=np.int64)
    cost = leave_costs(p)
    starts, ends, owners = [], [], []
    for u in range(p.n):
        points = [u, *sorted(set(p.users[u]))]
        for a, b in zip(points, points[1:]):
            if b - a > 1:
                starts.append(a + 1)
                ends.append(b)  # idle over stages a+1 .. b-1
                owners.append(u)
    starts_a, ends_a = np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64)
    owners_a = np.asarray(owners, dtype=np.int64)
    idle = np.zeros(p.n + 1, dtype=np.int64)  # bytes idle over each stage (a difference array)
    np.add.at(idle, starts_a, sizes[owners_a])
    np.add.at(idle, ends_a, -sizes[owners_a])
    idle = np.cumsum(idle)[:p.n]
    excess = first_compute_needs(p) + idle - p.budget_bytes
    over = np.flatnonzero(excess > 0)
    first = np.searchsorted(over, starts_a, side="left")
    last = np.searchsorted(over, ends_a, side="left")  # exclusive
    useful = last > first
    first, last, owners_a = first[useful], last[useful], owners_a[useful]
    counts = last - first
    col_starts = np.concatenate([[0], np.cumsum(counts)])
    rows = np.repeat(first - col_starts[:-1], counts) + np.arange(col_starts[-1])
    row_excess = excess[over].astype(float)
    values = np.minimum(np.repeat(sizes[owners_a], counts).astype(float), row_excess[rows])
    return row_excess, cost[owners_a], col_starts, rows, values


def cover_lower_bound(p: Problem, time_limit: float = 10.0, integer: bool = True) -> dict:
    """{"bound": a lower bound on the objective (None if HiGHS proved nothing in time),
    "status", "rows", "columns", "nonzeros", "solve_s"}. Imports highspy: call it through
    isolated.call("highspy", ...) from a process that may hold OR-Tools."""
    from .highs import quiet_highspy
    highspy = quiet_highspy()

    started = clock.perf_counter()
    base = plain_objective(p)
    excess, cost, col_starts, rows, values = covering_problem(p)
    info = {"rows": len(excess), "columns": len(cost), "nonzeros": len(values)}
    if len(excess) == 0:
        return {**info, "bound": base, "status": "optimal", "solve_s": 0.0}
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", max(0.1, time_limit))
    h.setOptionValue("threads", 1)
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = len(cost), len(excess)
    lp.col_cost_ = cost.astype(float)
    lp.col_lower_, lp.col_upper_ = np.zeros(len(cost)), np.ones(len(cost))
    lp.row_lower_, lp.row_upper_ = excess, np.full(len(excess), highspy.kHighsInf)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = col_starts.astype(np.int32)
    lp.a_matrix_.index_ = rows.astype(np.int32)
    lp.a_matrix_.value_ = values
    if integer:
        lp.integrality_ = [highspy.HighsVarType.kInteger] * len(cost)
    h.passModel(lp)
    h.run()
    status = h.getModelStatus()
    solved = status == highspy.HighsModelStatus.kOptimal
    if integer:
        proven = h.getInfo().mip_dual_bound
        bound = proven if np.isfinite(proven) else None
    else:
        bound = h.getInfo().objective_function_value if solved else None
    return {**info, "bound": None if bound is None else base + max(0.0, bound),
            "status": "optimal" if solved else h.modelStatusToString(status),
            "solve_s": clock.perf_counter() - started}
