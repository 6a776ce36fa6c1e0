"""Bad-input catalogue, files: graphs, plans and profiles that are broken, cut short, too big,
or made for something else. Each case: the real CLI, exit status 2, one `error:` line, no
traceback, no file left behind (see helpers/bad_inputs.py)."""

from __future__ import annotations

import json

import pytest

from helpers.bad_inputs import BAD_INPUT, cli, no_new_files, refused, tiny_graph, tiny_plan, tree

# (case, how to break the tiny graph's JSON, words the error line must hold)
GRAPH_CASES = [
    ("truncated", lambda g: json.dumps(g)[:40], ["valid JSON"]),
    # QA: "expected valid JSON, got 'Expecting value'"
    ("empty", lambda g: " \n", ["an empty file"]),
    ("a list", lambda g: json.dumps([g]), ["JSON object"]),
    ("wrong format", lambda g: json.dumps({**g, "format": "edge-remat/plan"}), ["format"]),
    ("future version", lambda g: json.dumps({**g, "version": 99}), ["version"]),
    ("negative size", lambda g: json.dumps(_node(g, 0, out_bytes=-5)), ["out_bytes"]),
    ("size as text", lambda g: json.dumps(_node(g, 0, out_bytes="1MB")), ["out_bytes"]),
    ("unknown input", lambda g: json.dumps(_node(g, 1, inputs=["zz"])), ["zz"]),
    ("duplicate id", lambda g: json.dumps(_node(g, 1, id="a")), ["a"]),
    ("input after its reader", lambda g: json.dumps(_node(g, 0, inputs=["b"])), ["b"]),
    ("10^30-byte tensor", lambda g: json.dumps(_node(g, 2, out_bytes=10**30)),
     ["larger than any board"]),
    ("10^30 fixed bytes", lambda g: json.dumps({**g, "fixed_bytes": 10**30}),
     ["larger than any board"]),
    ("infinite time", lambda g: json.dumps(_node(g, 0, time_s=1.0)).replace("1.0", "1e999", 1),
     ["time_s"]),
    ("unknown node kind", lambda g: json.dumps(_node(g, 0, kind="sideways")), ["kind"]),
    ("not UTF-8", lambda g: b"\xff\xfe\x00garbage", ["UTF-8"]),
    ("nested 100000 deep", lambda g: "[" * 100_000 + "]" * 100_000,  # RecursionError: exit 70
     ["valid JSON", "nested too deeply"]),
]


def _node(graph: dict, index: int, **fields) -> dict:
    graph = json.loads(json.dumps(graph))
    graph["nodes"][index].update(fields)
    return graph


@pytest.mark.parametrize("case,breaks,words", GRAPH_CASES, ids=[c[0] for c in GRAPH_CASES])
def test_broken_graph_file(tmp_path, case, breaks, words):
    good = json.loads(tiny_graph(tmp_path).read_text())
    bad = tmp_path / "bad.json"
    text = breaks(good)
    bad.write_bytes(text if isinstance(text, bytes) else text.encode())
    before = tree(tmp_path)
    refused(cli("plan", "--graph", bad, "--budget", "0.8", "-o", tmp_path / "plan.json"),
            BAD_INPUT, *words)
    no_new_files(before, tmp_path)


def test_missing_graph_file(tmp_path):
    # what to do too: the line ended at "got 'No such file or directory'"
    refused(cli("plan", "--graph", tmp_path / "nope.json", "--budget", "0.8"), BAD_INPUT,
            "nope.json", "no such file", ": check the path")


def test_graph_file_is_a_folder(tmp_path):
    refused(cli("plan", "--graph", tmp_path, "--budget", "0.8"), BAD_INPUT, str(tmp_path),
            "give the file itself, not a folder")


def test_onnx_file_is_a_folder_is_said_as_for_a_graph(tmp_path):
    # was "expected an ONNX model (IsADirectoryError: [Errno 21] Is a directory: ...)"
    line = refused(cli("graph", "--onnx", tmp_path), BAD_INPUT, str(tmp_path),
                   "give the ONNX file itself, not a folder")
    assert "Errno" not in line


def test_node_link_graph_with_a_cycle(tmp_path):
    graph = {"directed": True, "graph": {}, "nodes": [{"id": 0, "cost_cpu": 1, "cost_ram": 8},
                                                      {"id": 1, "cost_cpu": 1, "cost_ram": 8}],
             "links": [{"source": 0, "target": 1}, {"source": 1, "target": 0}]}
    path = tmp_path / "cycle.json"
    path.write_text(json.dumps(graph))
    refused(cli("plan", "--graph", path, "--budget", "0.8"), BAD_INPUT, "cycle")


# --- plans ---------------------------------------------------------------------------------

def _plan_with(tmp_path, change) -> tuple:
    graph = tiny_graph(tmp_path)
    plan = tiny_plan(tmp_path, graph, budget="0.8")
    obj = json.loads(plan.read_text())
    change(obj)
    bad = tmp_path / "bad-plan.json"
    bad.write_text(json.dumps(obj))
    return graph, bad


def _free_twice(plan: dict) -> None:
    stage = plan["stages"][-1]
    stage.append({"op": "free", "node": "a"})
    stage.append({"op": "free", "node": "a"})


# QA: the replay's refusal named neither the plan file nor what to do
REPLAY_REFUSED = ["bad-plan.json: invalid plan", "edited or damaged",
                  "plan again with `edge-remat plan --graph"]
PLAN_CASES = [
    ("frees a tensor twice", _free_twice, REPLAY_REFUSED),
    ("computes before its inputs", lambda p: p["stages"].insert(0, [{"op": "compute",
                                                                      "node": "ga"}]),
     REPLAY_REFUSED),
    ("unknown instruction", lambda p: p["stages"][0].insert(0, {"op": "teleport", "node": "a"}),
     ["teleport"]),
    ("unknown node", lambda p: p["stages"][0].insert(0, {"op": "compute", "node": "zz"}),
     ["zz"]),
    ("stages not a list", lambda p: p.update(stages={"a": 1}), ["stages"]),
    ("negative budget", lambda p: p.update(budget_bytes=-1), ["budget_bytes"]),
    # QA: a float past any board's memory trained (deploy)
    ("budget past 64 bits", lambda p: p.update(budget_bytes=1.5e300),
     ["budget_bytes", "a size in bytes that fits in 64 bits"]),
    ("budget of 2^63", lambda p: p.update(budget_bytes=2**63), ["budget_bytes", "64 bits"]),
]


@pytest.mark.parametrize("case,change,words", PLAN_CASES, ids=[c[0] for c in PLAN_CASES])
def test_broken_plan(tmp_path, case, change, words):
    graph, bad = _plan_with(tmp_path, change)
    refused(cli("simulate", bad, "--graph", graph), BAD_INPUT, *words)


def test_a_plan_far_over_its_budget_says_by_what_factor_not_a_huge_percentage(tmp_path):
    """QA: a plan edited to a 10-byte budget read "38051280.0% of budget"."""
    graph, bad = _plan_with(tmp_path, lambda p: p.update(budget_bytes=10))
    proc = cli("simulate", bad, "--graph", graph)
    refused(proc, BAD_INPUT, "over its budget of 10")
    assert "x the budget of 10 B)" in proc.stdout.splitlines()[0], proc.stdout
    assert "%" not in proc.stdout.splitlines()[0], proc.stdout


def test_a_floor_mostly_of_training_state_held_in_ram_says_to_home_it_on_flash(tmp_path):
    """QA: hf:gpt2 at 50% named a floor of 1.46 GB, 995 MB of it fixed memory (parameters,
    gradients, optimizer state held in RAM), and nothing to do about it; captured with
    --params-home flash its floor was 463 MB. A graph whose floor is mostly that state says
    so; one whose fixed memory is small does not."""
    state = {"parameters": 4_000_000, "gradients": 4_000_000, "optimizer_state": 4_000_000}
    heavy = tiny_graph(tmp_path, "heavy.json", fixed_bytes=12_000_000,
                       capture={"fixed": state})
    line = refused(cli("plan", "--graph", heavy, "--budget", "12500000B", "-o",
                       tmp_path / "p.json"), BAD_INPUT, "too small")
    assert "12000000 bytes of it are the parameters, their gradients and the optimizer " \
        "state" in line and "`edge-remat graph --params-home flash`" in line, line
    light = tiny_graph(tmp_path, "light.json")
    line = refused(cli("plan", "--graph", light, "--budget", "1000B", "-o",
                       tmp_path / "p.json"), BAD_INPUT, "too small")
    assert "--params-home" not in line, line


def test_plan_for_another_graph(tmp_path):
    graph = tiny_graph(tmp_path)
    plan = tiny_plan(tmp_path, graph)
    other = tiny_graph(tmp_path, "other.json", fixed_bytes=123)
    refused(cli("simulate", plan, "--graph", other), BAD_INPUT, "another graph", "other.json")


def test_plot_refuses_a_plan_for_another_graph(tmp_path):
    graph = tiny_graph(tmp_path)
    plan = tiny_plan(tmp_path, graph)
    other = tiny_graph(tmp_path, "other.json", fixed_bytes=123)
    before = tree(tmp_path)
    refused(cli("plot", "--plan", plan, "--graph", other, "--out", tmp_path / "plots"),
            BAD_INPUT, "another graph")
    no_new_files(before, tmp_path, allowed=["plots"])  # the folder it checked it can write


def test_graph_given_as_plan(tmp_path):
    graph = tiny_graph(tmp_path)
    refused(cli("simulate", graph, "--graph", graph), BAD_INPUT, "format")


def test_missing_plan_file(tmp_path):
    graph = tiny_graph(tmp_path)
    refused(cli("simulate", tmp_path / "nope.json", "--graph", graph), BAD_INPUT, "nope.json",
            ": check the path")


# --- profiles ------------------------------------------------------------------------------

def _profile(tmp_path, **changes) -> dict:
    obj = {"format": "edge-remat/profile", "version": 1, "name": "p", "source": "measured",
           "device": {}, "power": {"idle_w": 1.0, "active_w": 3.0}, "tiers": {}, "ops": {}}
    obj.update(changes)
    return obj


PROFILE_CASES = [
    ("negative power", lambda t: _profile(t, power={"idle_w": -1.0, "active_w": 3.0}),
     ["idle_w"]),
    ("graph given as profile", lambda t: json.loads(tiny_graph(t, "g2.json").read_text()),
     ["format"]),
    ("tier without bandwidth", lambda t: _profile(t, tiers={"flash": {"latency_s": 0.1}}),
     ["flash"]),
    ("op cost as text", lambda t: _profile(t, ops={"forward": {"time_s": "fast"}}),
     ["time_s"]),
]


@pytest.mark.parametrize("case,make,words", PROFILE_CASES, ids=[c[0] for c in PROFILE_CASES])
def test_broken_profile(tmp_path, case, make, words):
    graph = tiny_graph(tmp_path)
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(make(tmp_path)))
    refused(cli("plan", "--graph", graph, "--budget", "0.8", "--profile", profile), BAD_INPUT,
            *words)


def test_missing_profile_file(tmp_path):
    graph = tiny_graph(tmp_path)
    refused(cli("plan", "--graph", graph, "--budget", "0.8", "--profile", tmp_path / "no.json"),
            BAD_INPUT, "no.json")


def test_profile_for_another_model_is_said(tmp_path):
    """Not an error (its power and tiers still serve), but never silent."""
    graph = tiny_graph(tmp_path)
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(_profile(tmp_path, ops={"conv:abc": {"time_s": 0.1},
                                                          "relu:def": {"time_s": 0.2}})))
    proc = cli("plan", "--graph", graph, "--budget", "0.8", "--profile", profile)
    assert proc.returncode == 0, proc.stderr
    assert "warning:" in proc.stderr and "0 of the 5 nodes" in proc.stderr
    assert "Traceback" not in proc.stderr
