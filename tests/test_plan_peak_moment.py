"""The run report's two memory lines give one plan split for the plan's one peak.

QA: `run --model digits-cnn --arena cpsat --allocator arena --memory-limit 600MiB` said
"activations 198.0, workspace 18.0" at the plan's peak and "activations 216.0, workspace 0.0"
on the next line, "where the board's replay of the plan peaks": the board replayed the plan
with the graph's costs, which lack the profile's measured workspace of the convolution
backward, so it watched the ledger two instructions before the plan's own peak. The board now
watches at the plan's predicted peak_at.
"""

from __future__ import annotations

import json

import pytest
from helpers.bad_inputs import REPO, cli

pytestmark = pytest.mark.slow

MODEL = str(REPO / "examples" / "my_model.py") + ":make_model"


def test_the_plan_split_at_its_peak_is_the_one_beside_the_ledger(tmp_path):
    graph = tmp_path / "g.json"
    proc = cli("graph", "--model", MODEL, "--output", graph)
    assert proc.returncode == 0, proc.stderr
    # A profile of this graph whose convolution backwards measured a workspace 4x their
    # output (the graph's estimate has none): the plan peaks inside one of them.
    ops = {}
    for node in json.loads(graph.read_text())["nodes"]:
        op = ops.setdefault(node.get("signature") or node["op"],
                            {"time_s": node.get("time_s") or 1e-4})
        if "convolution_backward" in node["op"]:
            op["workspace_bytes"] = 4 * node["out_bytes"]
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({
        "format": "edge-remat/profile", "version": 1, "name": "ws", "source": "measured",
        "device": {}, "power": {"idle_w": 1.0, "active_w": 3.0}, "tiers": {}, "ops": ops}))
    out = tmp_path / "run"
    proc = cli("run", "--device", "local", "--model", MODEL, "--profile", profile, "--budget",
               "80%", "--steps", "1", "--no-plots", "--out", out, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((out / "report.json").read_text())
    plan = json.loads((out / "plan.json").read_text())
    split = report["memory_by_class"]
    moment = split["at_plan_peak"]
    assert moment["at"] == plan["predicted"]["peak_at"]
    assert moment["planned"] == split["planned"]
    assert split["planned"]["workspace"] > 0  # a convolution backward's, as planned
    assert sum(split["planned"].values()) == plan["predicted"]["peak_bytes"]
    # beside the ledger there, the plan's classes but the workspace the ledger cannot see
    seen = {k: v for k, v in moment["planned"].items() if k not in ("workspace", "runtime_warm")}
    assert {k: moment["measured"][k] for k in seen} == seen
    text = (out / "report.txt").read_text()
    assert "where the plan peaks" in text and "board's replay" not in text
