"""A heuristic asked for by name (`--solver heuristic:NAME`): it runs alone, with the
feasibility phase's share of the time limit, and where it finds no plan the error tells a
time limit that ran out from a budget it cannot meet (QA: split at --time-limit 0.3 said "no
schedule within the budget; try --solver auto", where 1 s planned the same budget)."""

from __future__ import annotations

import pytest

from edge_remat.planner.build import build_problem
from edge_remat.planner.solve import NoPlan, run_baselines, solve
from edge_remat.synthetic import published_w, random_layered


def test_a_named_heuristic_runs_alone_and_its_plan_names_only_it():
    p = build_problem(random_layered(100, seed=0, w=published_w(100)), "0.9")
    report = solve(p, "heuristic:split", time_limit=20)
    assert report.evaluation.feasible
    assert report.plan.solver["name"] == "heuristic:split"
    assert set(report.plan.solver["baselines"]) == {"split"}


def test_a_named_heuristic_whose_time_ran_out_asks_for_more_time():
    # descent plans this budget in about 0.15 s here: a millisecond is too little
    p = build_problem(random_layered(500, seed=0, w=published_w(500)), "0.8")
    with pytest.raises(NoPlan) as caught:
        solve(p, "heuristic:descent", time_limit=0.001)
    said = str(caught.value)
    assert "its time ran out" in said and "larger --time-limit" in said
    assert "try --solver auto" not in said
    assert solve(p, "heuristic:descent", time_limit=30).evaluation.feasible


def test_a_named_heuristic_that_finished_without_a_plan_blames_the_budget():
    # 30 nodes at 0.7 in the memory-aware order: no baseline fits (test_cpsat.py)
    p = build_problem(random_layered(30, seed=0, w=published_w(30)), "0.7")
    ran_out: set = set()
    plan = run_baselines(p, 30, only="sqrt-n", ran_out=ran_out)["sqrt-n"]
    assert plan is None or not plan.evaluation.feasible
    assert not ran_out  # it finished, well within its 18 s
    with pytest.raises(NoPlan) as caught:
        solve(p, "heuristic:sqrt-n", time_limit=30)
    said = str(caught.value)
    assert "finds no schedule within the budget" in said and "time ran out" not in said
