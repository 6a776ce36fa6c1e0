"""`plan --objective energy` builds the graph's cost model once: the check that the costs have
power figures (a warning where they have none) built it, and the problem built it again."""

from __future__ import annotations

from pathlib import Path

from helpers.bad_inputs import tiny_graph
from typer.testing import CliRunner

import edge_remat_agent.costs as costs_module
from edge_remat.cli import app
from edge_remat.planner import build

REPO = Path(__file__).resolve().parents[1]


def test_plan_with_energy_objective_builds_the_cost_model_once(tmp_path, monkeypatch):
    graph = tiny_graph(tmp_path)
    built = []
    real = costs_module.build_costs

    def counted(*args):
        built.append(len(args))
        return real(*args)

    monkeypatch.setattr(costs_module, "build_costs", counted)  # the CLI's import
    monkeypatch.setattr(build, "build_costs", counted)  # the problem's
    result = CliRunner().invoke(app, [
        "plan", "--graph", str(graph), "--budget", "1.0", "--objective", "energy",
        "--profile", str(REPO / "profiles" / "rpi4.json"), "--paging-time", "free",
        "--order", "given", "--solver", "heuristic:split", "-o", str(tmp_path / "plan.json")])
    assert result.exit_code == 0, result.output
    # the plan's model is built with its tiers (graph, profile, tiers); the fraction's
    # reference, the plain schedule's peak (graph, profile), is another: not counted
    assert built.count(3) == 1, built
