"""The budget a no-plan error names is one that plans, not the least: the message says that the
least lies between the floor and it (it said only "try --budget N", and a smaller one planned)."""

from __future__ import annotations

import re
import time

import pytest

from edge_remat.planner.build import build_problem
from edge_remat.planner.evaluate import evaluate
from edge_remat.planner.problem import InfeasibleBudget
from edge_remat.planner.solve import _budget_found_hint, solve
from edge_remat.synthetic import published_w, random_layered


def test_the_named_budget_is_given_as_an_upper_end_with_the_floor_below():
    p = build_problem(random_layered(60, seed=1), "0.8", order="given")
    hint = _budget_found_hint(p, time.perf_counter() + 5).text
    named = int(re.search(r"try --budget (\d+)", hint).group(1))
    # the asked budget, below the named one, plans too: the named one is not the least
    assert named > p.budget_bytes
    assert evaluate(p, solve(p, "auto", time_limit=5).decisions).fits_budget
    floor = re.search(r"lies between the floor, (\d+) bytes \(a proven lower bound\), "
                      rf"and {named}: try --budget {named}", hint)
    assert floor is not None, hint
    assert int(floor.group(1)) == p.smallest_budget()[0] <= p.budget_bytes


def test_the_floor_named_is_the_one_a_smaller_budget_is_refused_at():
    """rl60 seed 1: a node's inputs + output need 21840 bytes, the pebbling floor 24350. The
    hint named 21840 as 'the floor', while `plan --budget 21840` .. 24349 was refused as too
    small, needing at least 24350: the same command gave two floors for one graph."""
    graph = random_layered(60, seed=1)
    p = build_problem(graph, "0.8", order="given")
    hint = _budget_found_hint(p, time.perf_counter() + 5).text
    floor = int(re.search(r"lies between the floor, (\d+) bytes", hint).group(1))
    build_problem(graph, str(floor), order="given").check_budget()  # not refused
    try:
        build_problem(graph, str(floor - 1), order="given").check_budget()
    except InfeasibleBudget as refused:
        assert refused.smallest_bytes == floor, (refused.smallest_bytes, floor)
    else:
        raise AssertionError(f"a budget below the floor the hint names ({floor}) is accepted")


def test_a_short_time_limit_names_the_budget_the_feasibility_phase_got_to():
    """`plan --time-limit 2` on a 500-node random layered graph at 0.6 found no plan, and its
    hint named the plain peak (the ladder of larger budgets had no time left to try one),
    though the feasibility phase had got the peak well below it: that budget is named now,
    and it plans."""
    from dataclasses import replace

    from edge_remat.planner.solve import NoPlan, plain_peak_in_order
    p = build_problem(random_layered(500, seed=0, w=published_w(500)), "0.6", order="given")
    with pytest.raises(NoPlan) as no_plan:
        solve(p, "auto", time_limit=2)
    message = str(no_plan.value)
    named = int(re.search(r"try --budget (\d+)", message).group(1))
    assert "the feasibility phase got the peak down to" in message, message
    assert p.budget_bytes < named < plain_peak_in_order(p)
    # the budgets the words name are fields too, for --json (QA: only in the words)
    from edge_remat.errors import classify
    floor = int(re.search(r"lies between the floor, (\d+) bytes", message).group(1))
    assert no_plan.value.hint.try_bytes == named and no_plan.value.hint.floor_bytes == floor
    assert classify(no_plan.value)[2] == {"budget_floor_bytes": floor,
                                          "budget_to_try_bytes": named}
    assert evaluate(p, solve(replace(p, budget_bytes=named), "auto", 10).decisions).sim \
        .peak_bytes <= named


def test_with_no_time_to_try_a_budget_the_hint_says_more_time_is_needed():
    """Where the feasibility phase left no schedule below the plain peak and the ladder had no
    time, the hint said 'the feasibility phase found no smaller budget in time', as if it had
    looked: it says plainly that a larger --time-limit would find one."""
    from edge_remat.planner.solve import plain_peak_in_order
    p = build_problem(random_layered(60, seed=1), "0.8", order="given")
    hint = _budget_found_hint(p, time.perf_counter()).text  # no time left
    assert f"try --budget {plain_peak_in_order(p)}, or give a larger --time-limit" in hint
    assert "tried no smaller budget" in hint and "found no smaller budget" not in hint
