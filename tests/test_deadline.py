"""A deadline no schedule meets: the smallest one that can be met is found, not guessed."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers.brute_force import brute_force
from helpers.small_graphs import training_chain
from helpers.exact_problems import problem

from edge_remat.planner.evaluate import evaluate
from edge_remat.planner.problem import InfeasibleDeadline
from edge_remat.planner.solve import deadline_free_problem, solve
from edge_remat.units import round_up

pytestmark = pytest.mark.slow


def smallest_deadline_by_brute_force(p) -> float:
    fastest = brute_force(deadline_free_problem(p))
    assert fastest is not None
    ev = evaluate(p, fastest[1])
    return p.deadline_time(ev.sim.compute_time_s, ev.sim.paging_time_s) / p.plain_time


@pytest.mark.parametrize("solver", ["cpsat", "milp"])
def test_smallest_deadline_is_the_fastest_schedule(solver):
    p = problem(training_chain(3, 1), 0.5, "energy", deadline=1.0, static_w=0.1)
    expected = smallest_deadline_by_brute_force(p)
    assert expected > 1.0  # the budget forces recomputation, which costs time
    with pytest.raises(InfeasibleDeadline) as caught:
        solve(p, solver, time_limit=30)
    assert caught.value.achieved == pytest.approx(expected, rel=1e-9)
    assert caught.value.smallest_deadline == round_up(expected)  # as printed
    assert "proven" in str(caught.value)
    # ... and it really is achievable: at that deadline there is a plan that meets it
    p.deadline = caught.value.achieved * (1 + 1e-9)
    assert solve(p, solver, time_limit=30).evaluation.feasible


def test_a_heuristic_that_misses_a_deadline_does_not_say_none_meets_it():
    """At 1.1x, a deadline CP-SAT meets (its proven smallest is 1.053x), heuristic:paging's
    fastest plan takes 1.1711x: its error said 'no schedule within 17 bytes meets the deadline',
    a claim only an exact search can make."""
    p = problem(training_chain(3, 1), 0.5, "energy", deadline=1.1, paging=True, static_w=0.1)
    assert solve(p, "cpsat", time_limit=30).evaluation.feasible
    with pytest.raises(InfeasibleDeadline) as caught:
        solve(p, "heuristic:paging", time_limit=30)
    message = str(caught.value)
    assert message.startswith("heuristic:paging found no schedule within"), message
    assert "at most 1.172x" in message and "proven" not in message  # 1.1711, rounded up


def test_paging_time_modes_have_their_own_smallest_deadline():
    """Paging that takes time (counted) needs a later deadline than POET's free paging."""
    smallest = {}
    for mode in ("counted", "free"):
        p = problem(training_chain(3, 1), 0.5, "energy", deadline=0.99, paging=True,
                    static_w=0.1, paging_time=mode)
        with pytest.raises(InfeasibleDeadline) as caught:
            solve(p, "cpsat", time_limit=30)
        smallest[mode] = caught.value.achieved
        p.deadline = smallest[mode] * (1 + 1e-9)
        assert solve(p, "cpsat", time_limit=30).evaluation.feasible
    assert smallest["free"] == pytest.approx(1.0)  # free paging replaces every recomputation
    assert smallest["counted"] > smallest["free"]


def test_cli_names_the_smallest_deadline_and_exits_2(tmp_path):
    graph = training_chain(3, 1)
    path = tmp_path / "chain.json"
    path.write_text(json.dumps(graph.to_dict()))
    budget = problem(graph, 0.5).budget_bytes  # raised to the smallest feasible budget
    assert budget >= 16  # bytes, not a fraction
    proc = subprocess.run([sys.executable, "-m", "edge_remat.cli", "plan", "--graph", str(path),
                           "--budget", str(budget), "--deadline", "1.0", "--objective", "energy",
                           "--json"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    out = json.loads(proc.stdout)
    assert out["status"] == "infeasible_deadline"
    assert out["smallest_feasible_deadline"] > 1.0
    # the chain has no node energies: a warning says so before the one error line
    lines = proc.stderr.strip().splitlines()
    assert [line for line in lines if not line.startswith("warning: ")] == lines[-1:]
    assert lines[-1].startswith("error:") and "smallest deadline" in lines[-1]
    assert "Traceback" not in proc.stderr


def test_the_json_deadline_is_the_printed_one_and_met_when_passed_back(tmp_path):
    """QA: --json gave the unrounded smallest deadline (1.1907211560840243); passed back, the
    plan on its edge came as 'feasible (cpsat, fallback from auto found no plan that meets the
    deadline; ...)'. Now --json names the figure the line prints, rounded up, and passed back
    it plans, and nothing says it was not met."""
    graph = training_chain(4, 1)
    path = tmp_path / "chain.json"
    path.write_text(json.dumps(graph.to_dict()))
    budget = problem(graph, 0.5).budget_bytes
    args = [sys.executable, "-m", "edge_remat.cli", "plan", "--graph", str(path), "--budget",
            str(budget), "--objective", "energy", "--json"]
    proc = subprocess.run(args + ["--deadline", "1.0"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr
    named = json.loads(proc.stdout)["smallest_feasible_deadline"]
    assert f"can be met is {named:g}x" in proc.stderr  # the figure the line gives
    again = subprocess.run(args + ["--deadline", repr(named)], capture_output=True, text=True,
                           timeout=120)
    assert again.returncode == 0, again.stderr
    plan = json.loads(again.stdout.splitlines()[-1])
    assert "found no plan that meets the deadline;" not in again.stdout + again.stderr
    assert plan["status"] in ("optimal", "feasible")
