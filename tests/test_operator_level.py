"""Operator-level graphs (`edge-remat graph --operator-level`): one planner node per ATen op that
allocates. A small zoo model's op-level graph is captured through the CLI, planned under a tight
budget, replayed by `edge-remat simulate`, and run by the executor with gradients equal to eager
PyTorch's (the same run's check)."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from edge_remat.cli import app
from edge_remat.planner.build import build_problem, plain_peak_bytes
from edge_remat_agent.capture import capture_model, recapture
from edge_remat_agent.executor import run_plan
from edge_remat_agent.formats import load_graph, load_plan

pytestmark = pytest.mark.slow  # capture, a 5 s plan and two training steps: 8-16 s here

MODEL = ["--model", "digits-cnn", "--batch", "4"]


def invoke(*args: str) -> dict:
    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output.strip().splitlines()[-1])


def test_operator_level_graph_plans_tight_simulates_and_trains(tmp_path):
    graph_file, plan_file = tmp_path / "graph.json", tmp_path / "plan.json"
    captured = invoke("graph", *MODEL, "--operator-level", "--params-home", "flash",
                      "-o", str(graph_file))
    graph = load_graph(graph_file)
    # Every ATen node is in exactly one planner node, and each node runs at most one op that
    # allocates (with its getitems): finer than the default refinement gives.
    members = [m for n in graph.nodes for m in n.attrs.get("members", [])]
    assert len(members) == len(set(members)) == captured["captured_nodes"]
    ops = [n.attrs["ops"] for n in graph.nodes if n.attrs.get("members")]
    assert all(len([o for o in o_ if o != "getitem"]) <= 1 for o_ in ops), ops
    default = capture_model("digits-cnn", batch=4, params_home="flash").graph
    assert len(graph) > len(default)

    # A tight budget: a tenth of the way from the smallest feasible budget to the plain peak.
    smallest = build_problem(graph, "1000").smallest_budget()[0]
    plain = plain_peak_bytes(graph)
    budget = math.ceil(smallest + 0.1 * (plain - smallest))
    planned = invoke("plan", "--graph", str(graph_file), "--budget", str(budget),
                     "--time-limit", "5", "--paging", "none", "-o", str(plan_file))
    assert planned["peak_bytes"] <= budget < 0.6 * plain
    assert planned["recomputed"] > 0
    replayed = invoke("simulate", str(plan_file), "--graph", str(graph_file))
    assert replayed["valid"] and replayed["peak_bytes"] == planned["peak_bytes"]

    # The board rebuilds the same operator-level graph, and the plan trains like eager PyTorch.
    again = recapture(graph)
    assert again.graph.fingerprint() == graph.fingerprint()
    report = run_plan(graph, load_plan(plan_file), 2, str(tmp_path / "pages"), captured=again)
    assert report["grad_check"]["bitwise_equal"], report["grad_check"]
    assert report["recomputed"] > 0
