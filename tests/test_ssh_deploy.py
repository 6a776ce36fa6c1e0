"""`profile` then `deploy` end to end through a real OpenSSH server, as a user runs them.

A Debian sshd on a free loopback port (its own host key, an authorized key: helpers) is
the board. Through the command line only: `graph` captures the zoo's digits-cnn (batch 4, 8x8
images, 41 planner nodes), `profile --device <ssh config>` pushes the agent over SSH, times
every node there and brings back a measured profile, `plan` solves a 60% budget with it, and
`deploy` runs the plan on the board for 2 steps and brings back the run report. The profiler's
board-wide measurements are shortened with --param (0.1 s idle/busy power, one 4 KiB flash
size, no footprint probe, no compute share); the whole test took 42-77 s on a shared, busy 2-core
machine, most of it the board capturing the graph again and timing its nodes. Needs sshd;
skips (saying what to install) without it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from helpers.board_fixtures import loopback_ssh_board, needs_sshd
from edge_remat.cli import app
from edge_remat.planner.build import build_problem
from edge_remat_agent.formats import load_graph, load_profile

pytestmark = [needs_sshd, pytest.mark.slow, pytest.mark.loopback]
pytest.importorskip("edge_remat_agent.executor.jobs", reason="needs the executor")

# share_s=0: no compute share, which takes up to 4 s a tier (flash, the host link); it is
# measured through the daemon in test_op_profiler and on its own in test_contention
FAST_PROFILE = ["idle_s=0.1", "busy_s=0.1", "sizes=4KiB,8KiB", "no_footprint=true", "share_s=0"]


def cli(*args):
    result = CliRunner().invoke(app, [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def ssh_board(tmp_path):
    """A device config of kind ssh for a fresh loopback sshd; (config path, sshd, workdir)."""
    with loopback_ssh_board(tmp_path) as board:
        yield board


def test_profile_then_deploy_through_sshd(ssh_board, tmp_path):
    config, sshd, workdir = ssh_board

    # (a) capture a small zoo model on the host
    graph = tmp_path / "graph.json"
    code, out, err = cli("graph", "--model", "digits-cnn", "--batch", 4, "--image", 8,
                         "--level", 2, "-o", graph, "--json")
    assert code == 0, (out, err)
    captured = json.loads(out)
    g = json.loads(graph.read_text())
    node_ids = [n["id"] for n in g["nodes"]]
    assert captured["nodes"] == len(node_ids) > 10

    # (b) profile on the board, through sshd; the measured profile comes back to the host
    code, out, err = cli("profile", "--device", config, "--graph", graph,
                         *[a for p in FAST_PROFILE for a in ("--param", p)],
                         "--out", tmp_path / "profiles", "--json")
    assert code == 0, (out, err)
    answer = json.loads(out)
    assert answer["status"] == "finished" and answer["device"] == "loopback"
    assert answer["result"]["source"] == "measured"
    assert answer["result"]["nodes"] == len(node_ids)
    profile_path = tmp_path / "profiles" / "profile.json"
    assert answer["fetched"] == [str(profile_path)]
    profile = json.loads(profile_path.read_text())
    assert profile["format"] == "edge-remat/profile" and profile["source"] == "measured"
    measured_ops = profile["measurements"]["ops"]
    assert measured_ops["graph_fingerprint"] == captured["fingerprint"]  # our graph, re-captured
    assert [m["id"] for m in measured_ops["nodes"]] == node_ids  # every node, in order
    for node in g["nodes"]:
        op = profile["ops"][node.get("signature") or node["op"]]
        assert op["time_s"] > 0 and op["out_bytes"] >= 0
    assert (workdir / "agents").is_dir()  # the agent was pushed over SSH

    # (c) plan with that profile, at 60% of the plain step's memory beyond fixed memory (the
    # profile's first-call memory included: on a model this small it is a large part of it)
    p = build_problem(load_graph(graph), "1.0", load_profile(profile_path))
    assert p.costs.runtime_warm_bytes > 0  # measured on the board, carried by the profile
    budget = p.fixed + int(0.6 * (p.budget_bytes - p.fixed))
    plan = tmp_path / "plan.json"
    code, out, err = cli("plan", "--graph", graph, "--profile", profile_path, "--budget", budget,
                         "--paging", "none", "--time-limit", 3, "--workers", 1, "-o", plan,
                         "--json")
    assert code == 0, (out, err)
    planned = json.loads(plan.read_text())
    costs = planned["problem"]["costs"]
    assert costs["cost_source"] == "profile"
    assert costs["time_source"].endswith(f"for {len(node_ids)}/{len(node_ids)} nodes")
    assert planned["predicted"]["peak_bytes"] <= planned["budget_bytes"]
    assert planned["predicted"]["recomputed"] > 0  # 60% needs recomputation

    # (d) deploy: run the plan on the board, fetch its run report
    code, out, err = cli("deploy", plan, "--device", config, "--graph", graph, "--steps", 2,
                         "--out", tmp_path / "run", "--json")
    assert code == 0, (out, err)
    answer = json.loads(out)
    assert answer["status"] == "finished" and answer["device"] == "loopback"
    result = answer["result"]
    assert result["steps"] == 2
    assert result["grad_check"]["bitwise_equal"] is True
    report_path = tmp_path / "run" / "run_report.json"
    # the report, and the trained weights (--save trained, the default)
    assert answer["fetched"] == [str(report_path), str(tmp_path / "run" / "weights.pt")]
    assert result["saved_weights"]["tensors"] > 0
    report = json.loads(report_path.read_text())
    assert report["format"] == "edge-remat/run-report" and report["mode"] == "plan"
    assert report["plan_fingerprint"] == planned["fingerprint"]
    assert report["graph_fingerprint"] == captured["fingerprint"]
    assert [s["step"] for s in report["steps"]] == [1, 2]
    assert all(math.isfinite(s["loss"]) for s in report["steps"])
    assert report["grad_check"]["bitwise_equal"] is True
    assert report["recomputed"] == planned["predicted"]["recomputed"]
    assert report["summary"]["steps"] == 2 and report["summary"]["ledger_peak_bytes"] > 0

    # both commands went through sshd (publickey logins logged by the server)
    assert Path(sshd.log).read_text().count("Accepted publickey") >= 2
