"""A tier's capacity (a board's free room for pages) bounds the planner's paging: a heuristic's
plan that pages past it does not fit, as RAM past the budget does, and planning goes on to
plans that recompute instead. QA: a flash tier of 10 MB stopped `plan` with "invalid plan at
stage 2 ... over its capacity", though a plan without paging existed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from edge_remat.cli import app
from edge_remat.planner.baselines import belady_paging
from edge_remat.planner.build import build_problem
from edge_remat.planner.evaluate import evaluate
from edge_remat_agent.formats import load_graph
from edge_remat_agent.simulate import PlanError, simulate

REPO = Path(__file__).resolve().parents[1]
GRAPH = REPO / "examples" / "graphs" / "tiny_cnn_train.json"
CAPACITY = 10_000_000  # below the 16 MiB Belady's plan pages out at 80%


@pytest.fixture
def small_flash(tmp_path):
    profile = json.loads((REPO / "profiles" / "rpi4.json").read_text())
    profile["tiers"]["flash"]["capacity_bytes"] = CAPACITY
    path = tmp_path / "small-flash.json"
    path.write_text(json.dumps(profile))
    return path


def cli(*args):
    result = CliRunner().invoke(app, [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr


def test_a_paging_plan_past_the_capacity_does_not_fit_and_says_by_how_much(small_flash):
    from edge_remat_agent.formats import load_profile
    p = build_problem(load_graph(GRAPH), "80%", load_profile(small_flash), paging="flash")
    decisions = belady_paging(p)
    evaluation = evaluate(p, decisions)
    assert not evaluation.feasible and evaluation.sim.peak_bytes <= p.budget_bytes
    # its one page-out is conv2's 16 MiB
    assert evaluation.sim.tier_overflow_bytes == 16 * 2**20 - CAPACITY
    # a plan given to run is still refused where it pages past the capacity
    with pytest.raises(PlanError, match="over its capacity"):
        simulate(p.graph, p.costs, evaluation.stages, p.budget_bytes)


@pytest.mark.parametrize("solver", ["auto", "milp"])
def test_plan_recomputes_where_the_tier_is_too_small_and_the_plan_runs(small_flash, tmp_path,
                                                                       solver):
    out = tmp_path / "plan.json"
    code, stdout, stderr = cli("plan", "--graph", GRAPH, "--profile", small_flash, "--budget",
                               "80%", "--paging", "flash", "--time-limit", 5, "--solver",
                               solver, "-o", out, "--json")
    assert code == 0, (stdout, stderr)
    plan = json.loads(out.read_text())
    assert plan["predicted"]["recomputed"] > 0
    code, stdout, stderr = cli("simulate", out, "--graph", GRAPH, "--profile", small_flash)
    assert code == 0 and "Traceback" not in stdout + stderr, (stdout, stderr)


def test_the_paging_heuristic_asked_for_names_the_capacity(small_flash, tmp_path):
    code, stdout, stderr = cli("plan", "--graph", GRAPH, "--profile", small_flash, "--budget",
                               "80%", "--paging", "flash", "--time-limit", 3, "--solver",
                               "heuristic:paging", "-o", tmp_path / "plan.json")
    assert code == 2, (stdout, stderr)
    assert "more than a tier's capacity holds" in stdout + stderr
    assert "invalid plan" not in stdout + stderr and "Traceback" not in stdout + stderr
