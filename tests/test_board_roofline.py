"""A modelled profile times no operator; its `compute` rates (a roofline from published figures)
rescale the capture's estimate, so that each board predicts its own step time: before, every
modelled board predicted the capture's (the Orin Nano and the Pi 4 the same 0.138 s)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from edge_remat_agent.capture.estimate import DEFAULT_RATES
from edge_remat_agent.capture.pipeline import capture_model
from edge_remat_agent.costs import build_costs
from edge_remat_agent.formats import ComputeRates, FormatError, Profile, load_profile
from edge_remat_agent.formats.profile import profile_from_dict

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def graph():
    return capture_model("mlp", batch=8).graph


def modelled(compute: ComputeRates | None) -> Profile:
    return Profile(source="modelled", device={}, idle_w=1.0, active_w=3.0, name="board",
                   compute=compute)


def test_the_capture_rates_give_the_capture_times(graph):
    at_estimate = ComputeRates(DEFAULT_RATES.flops_per_s, DEFAULT_RATES.bytes_per_s)
    costs = build_costs(graph, modelled(at_estimate))
    assert costs.time_s == pytest.approx([node.time_s for node in graph.nodes], rel=1e-12)
    assert "roofline" in costs.time_source


def test_a_board_half_as_fast_takes_twice_as_long(graph):
    base = build_costs(graph, modelled(None))
    half = ComputeRates(DEFAULT_RATES.flops_per_s / 2, DEFAULT_RATES.bytes_per_s / 2,
                        op_overhead_s=2 * DEFAULT_RATES.op_overhead_s)
    slow = build_costs(graph, modelled(half))
    assert slow.time_s == pytest.approx([2 * t for t in base.time_s], rel=1e-9)
    # energy follows the board's time at its power (2 W above idle)
    assert slow.energy_j == pytest.approx([2 * t for t in slow.time_s], rel=1e-9)


def test_measured_times_and_published_graphs_are_not_rescaled(graph):
    from edge_remat.synthetic import random_layered
    layered = random_layered(30, seed=0)  # published costs: nothing to rescale
    fast = ComputeRates(1e15, 1e15)
    assert build_costs(layered, modelled(fast)).time_s == [n.time_s for n in layered.nodes]
    measured = modelled(fast)
    from edge_remat_agent.formats import OpCost
    node = graph.nodes[0]
    measured.ops = {node.signature or node.op: OpCost(time_s=0.5)}
    assert build_costs(graph, measured).time_s[0] == 0.5


def test_the_shipped_modelled_boards_predict_their_own_step_times(graph):
    def step(name: str) -> float:
        return sum(build_costs(graph, load_profile(ROOT / "profiles" / f"{name}.json")).time_s)
    pi4, pi5, orin = step("rpi4"), step("rpi5"), step("jetson-orin-nano")
    assert pi5 < pi4 and orin < pi4  # the Pi 5 and the Orin's A78AE cores outrun the Pi 4
    assert len({round(t, 9) for t in (pi4, pi5, orin)}) == 3


@pytest.mark.parametrize("compute, field", [
    ({"flops_per_s": 0, "bytes_per_s": 1e9}, "flops_per_s"),
    ({"flops_per_s": 1e9, "bytes_per_s": -1}, "bytes_per_s"),
    ({"flops_per_s": 1e9, "bytes_per_s": 1e9, "op_overhead_s": -1}, "op_overhead_s"),
    ({"flops_per_s": 1e9, "bytes_per_s": 1e9, "gflops": 3}, "gflops"),
])
def test_malformed_compute_rates_are_named(compute, field):
    data = load_profile(ROOT / "profiles" / "rpi4.json").to_dict()
    data["compute"] = compute
    with pytest.raises(FormatError, match=field):
        profile_from_dict(data, "p.json")


def test_compute_rates_round_trip():
    profile = load_profile(ROOT / "profiles" / "rpi5.json")
    assert profile_from_dict(profile.to_dict()).compute == profile.compute


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edge_remat", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def test_plan_says_a_profile_is_modelled_and_a_budget_above_its_board(graph, tmp_path):
    graph.save(tmp_path / "g.json")
    done = run_cli("plan", "--graph", "g.json", "--budget", "1.0", "--profile",
                   str(ROOT / "profiles" / "cortex-m4.json"), "--solver", "heuristic:keep-all",
                   cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "is modelled: it times no operator" in done.stderr
    assert "rescaled to the board's published compute rates" in done.stderr
    # the plan (keep-all, at its plain peak) is past the board's RAM: said of the plan (85d4dc0)
    assert "warning: the plan's predicted peak" in done.stderr and "192.00 KiB" in done.stderr


def test_the_modelled_note_says_a_graph_without_an_estimate_keeps_its_own_times(tmp_path):
    """QA: a hand-written graph (no capture estimate) planned with the Pi 4's profile took the
    same 1.473 s as without it, while the note said its times were rescaled."""
    tiny = ROOT / "examples" / "graphs" / "tiny_cnn_train.json"
    done = run_cli("plan", "--graph", str(tiny), "--budget", "1.0", "--profile",
                   str(ROOT / "profiles" / "rpi4.json"), "--solver", "heuristic:keep-all",
                   cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "node times are the graph's own (it holds no capture's estimate" in done.stderr
    assert "rescaled" not in done.stderr


def test_run_refuses_a_plan_only_profile_before_any_work(tmp_path):
    done = run_cli("run", "--device", "local", "--model", "mlp", "--budget", "50%",
                   "--profile", str(ROOT / "profiles" / "cortex-m4.json"), "--out", "out",
                   cwd=tmp_path)
    assert done.returncode == 2
    assert "plan-only profile" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()
