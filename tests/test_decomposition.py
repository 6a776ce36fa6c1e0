"""The decomposed solve against the monolithic one, on a graph small enough for both.

`auto` decomposes from 300 nodes: window LNS (ruin and recreate over windows of stages) before
CP-SAT starts from its plan. The issue's check: in the same time, the decomposed plan is never
worse than the monolithic CP-SAT plan by more than the gap it states, and the bounds that both
state are true bounds (below every plan found)."""

import pytest

from edge_remat.planner.build import build_problem
from edge_remat.planner.solve import have_cpsat, solve
from edge_remat.synthetic import random_layered

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not have_cpsat(), reason="OR-Tools is not installed")]

TIME_LIMIT = 12.0


@pytest.mark.parametrize("seed", [2, 3])
def test_decomposed_is_within_its_stated_gap_of_the_monolithic_solve(seed):
    p = build_problem(random_layered(300, seed=seed), "0.8", order="given")
    decomposed = solve(p, "auto", time_limit=TIME_LIMIT, workers=1)
    monolithic = solve(p, "cpsat", time_limit=TIME_LIMIT, workers=1)
    for report in (decomposed, monolithic):
        assert report.evaluation.fits_budget
        bound = report.plan.solver["lower_bound"]
        assert bound <= min(decomposed.evaluation.value, monolithic.evaluation.value) + 1e-6
    value, gap = decomposed.evaluation.value, decomposed.plan.solver["gap"]
    assert value - monolithic.evaluation.value <= gap * value + 1e-6
