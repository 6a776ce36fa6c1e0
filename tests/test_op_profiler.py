"""The op profiler: every planner node timed on real inputs for a window the clock can resolve,
its bytes read from the real tensors, written as a measured profile that the planner takes
(`edge-remat plan --profile`: cost_source "profile"), on this machine and through the daemon."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from board_fixtures import stop_agent
from edge_remat.cli import app
from edge_remat_agent import cli as agent_cli
from edge_remat_agent.capture import capture_model
from edge_remat_agent.formats import load_graph, load_profile
from edge_remat_agent.profiler.ops import CONTEXT_STEPS, measure_nodes, ops_from, profile_key

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = f"{ROOT / 'examples' / 'my_model.py'}:make_model"
QUICK_BOARD = ["--sensor", "model", "--idle-s", "0.1", "--busy-s", "0.1", "--no-footprint",
               "--sizes", "4KiB,64KiB"]


@pytest.fixture(scope="module")
def graph_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("graph") / "graph.json"
    capture_model(EXAMPLE, batch=4, image=16).graph.save(path)
    return path


def test_every_node_is_timed_for_a_measurable_window_with_its_real_bytes():
    captured = capture_model(EXAMPLE, batch=4, image=16)
    nodes = measure_nodes(captured, min_window_s=0.01)
    graph = captured.graph
    assert [m.id for m in nodes] == [n.id for n in graph.nodes]
    for m, node in zip(nodes, graph.nodes):
        # The isolated window is long enough for the clock; time_s is the in-context median.
        assert m.runs >= 1 and m.isolated_time_s * m.runs >= 0.01, m
        assert m.time_s > 0 and m.context_runs == CONTEXT_STEPS, m
        assert m.key == profile_key(node)
        if node.kind in ("forward", "backward"):  # real storages, as the capture sized them
            assert m.out_bytes == node.out_bytes, (node.name, m.out_bytes, node.out_bytes)
            assert m.workspace_bytes == node.workspace_bytes, node.name
    ops = ops_from(nodes)
    assert set(ops) == {profile_key(n) for n in graph.nodes}
    assert len(ops) < len(nodes)  # the two residual blocks' twin layers share a signature


def test_measured_profile_changes_the_planners_costs(graph_file, tmp_path, capsys):
    profile_file = tmp_path / "profile.json"
    code = agent_cli.main(["profile", "--graph", str(graph_file), "-o", str(profile_file),
                           "--page-dir", str(tmp_path / "pages"), *QUICK_BOARD])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["nodes"] == len(load_graph(graph_file))
    profile = load_profile(profile_file)
    assert profile.source == "measured" and profile.device["cpu"] and "flash" in profile.tiers
    assert profile.measurements["ops"]["graph_fingerprint"] == load_graph(graph_file).fingerprint()

    plans = {}
    for label, extra in (("estimate", []), ("profile", ["--profile", str(profile_file)])):
        plan_file = tmp_path / f"plan-{label}.json"
        result = CliRunner().invoke(app, ["plan", "--graph", str(graph_file), "--budget", "0.95",
                                          "--solver", "heuristic:dtr", "-o", str(plan_file),
                                          *extra])
        assert result.exit_code == 0, result.output
        plans[label] = json.loads(plan_file.read_text())
        check = CliRunner().invoke(app, ["simulate", str(plan_file), "--graph", str(graph_file),
                                         *extra, "--json"])
        assert check.exit_code == 0 and json.loads(check.stdout)["valid"], check.output
    costs = plans["profile"]["problem"]["costs"]
    assert costs["cost_source"] == "profile" and "for 27/27 nodes" in costs["time_source"]
    assert plans["estimate"]["problem"]["costs"]["cost_source"] == "estimate"
    assert plans["profile"]["predicted"]["time_s"] != plans["estimate"]["predicted"]["time_s"]


def test_profile_job_on_the_board_through_the_daemon(graph_file, tmp_path, monkeypatch):
    folder = tmp_path / "configs"
    folder.mkdir()
    workdir = tmp_path / "board"
    (folder / "bench.toml").write_text(
        f'name = "bench"\n[connection]\nkind = "local"\nworkdir = "{workdir}"\n')
    monkeypatch.setenv("EDGE_REMAT_DEVICE_CONFIGS", str(folder))
    params = [arg for pair in (("sensor=model", "idle_s=0.1", "busy_s=0.1", "no_footprint=true",
                                "sizes=4KiB")) for arg in ("--param", pair)]
    try:
        result = CliRunner().invoke(app, ["profile", "--device", "bench", "--graph",
                                          str(graph_file), *params, "--out", str(tmp_path / "out"),
                                          "--json"])
    finally:
        stop_agent(workdir)
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    assert answer["status"] == "finished" and answer["result"]["nodes"] == 27
    profile = load_profile(tmp_path / "out" / "profile.json")
    assert profile.source == "measured" and profile.ops and "flash" in profile.tiers
