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


def test_operator_level_transformer_plan_recomputes_single_ops_and_trains_exactly(tmp_path):
    """What benchmarks/end_to_end.py runs with --granularity operator: a transformer captured
    with update="step", one node per ATen op, planned at half its plain activation peak. The plan
    recomputes single ops (a softmax, a gelu, a dropout's scaling), not whole layers, and the
    executor runs it within its budget with gradients and loss bit for bit eager's."""
    captured = capture_model("bert-tiny", batch=2, seq=16, update="step", operator_level=True)
    graph = captured.graph
    plain = plain_peak_bytes(graph)
    budget = graph.fixed_bytes + (plain - graph.fixed_bytes) // 2
    from edge_remat.planner.solve import solve
    plan = solve(build_problem(graph, f"{budget}B", None, "time", None, "none"), "auto",
                 time_limit=3).plan
    computes: dict = {}
    for stage in plan.stages:
        for ins in stage:
            if ins.op == "compute":
                computes[ins.node] = computes.get(ins.node, 0) + 1
    recomputed = [graph.node(n) for n, k in computes.items() if k > 1]
    assert recomputed and plan.predicted["peak_bytes"] <= budget
    # Recomputed at the granularity of single ops (a layer norm keeps the clones of its saved
    # statistics, a dropout its mask's two ops), pointwise ones among them: never a layer.
    assert all(len(n.attrs["ops"]) <= 3 for n in recomputed)
    assert {"gelu", "mul", "clone"} & {o for n in recomputed for o in n.attrs["ops"]}
    report = run_plan(graph, plan, 2, str(tmp_path / "pages"), captured=captured)
    assert report["grad_check"]["bitwise_equal"], report["grad_check"]
    assert report["recomputed"] >= len(recomputed)
    assert all(step["ledger_peak_bytes"] <= budget for step in report["steps"])
