"""A planned run times its nodes for a profile that has none (executor/node_timing.py), and the
host writes them into the cached profile (run/timed_in_run.py).

The profile standing in for a board's node-less one is the shipped rpi4 profile: no ops, and
compute rates the planner's roofline costs nodes with, as a board without room for a plain
step measures. The end-to-end path (a real board in a memory cgroup) is in test_run_e2e.py.
"""

from __future__ import annotations

import shutil

import pytest

from helpers.executor_plans import every_forward_recomputed
from edge_remat.run.profiles import ChosenProfile
from edge_remat.run.timed_in_run import TIMED_FILE, keep_run_times, steps_to_time
from edge_remat.shipped import shipped_dir
from edge_remat_agent.costs import build_costs
from edge_remat_agent.executor import run_plan
from edge_remat_agent.formats import load_profile

STEPS = 4


@pytest.fixture(scope="module")
def timed_and_plain_runs(user_capture):
    graph = user_capture().graph
    plan = every_forward_recomputed(graph)
    timed = run_plan(graph, plan, STEPS, None, captured=user_capture(), seed=3, time_nodes=2)
    plain = run_plan(graph, plan, STEPS, None, captured=user_capture(), seed=3)
    return graph, timed, plain


def test_a_run_times_every_node_in_the_steps_after_its_first_and_trains_the_same(
        timed_and_plain_runs):
    graph, timed, plain = timed_and_plain_runs
    assert [r["loss"] for r in timed["steps"]] == [r["loss"] for r in plain["steps"]]
    assert timed["grad_check"]["bitwise_equal"] is True
    assert "node_times" not in plain
    # its first step ran the eager reference (the gradient check) first: no warm-up measured
    assert "persistent_bytes" not in timed["node_times"]
    figures = timed["node_times"]
    assert figures["steps"] == 2
    assert len(figures["time_s"]) == len(graph.nodes)
    # every node, the optimizer's step (the update node) included, took some time
    assert all(t is not None and t > 0 for t in figures["time_s"]), figures
    # the timed steps (2 and 3) ran interpreted, node by node, not replayed compiled
    assert [r["ledger"] for r in timed["steps"][1:3]] == ["measured", "measured"]
    # the first computes of a step sum to about what the step's nodes took (recomputes apart)
    step_compute = sorted(r["compute_s"] for r in timed["steps"][1:3])
    assert sum(figures["time_s"]) <= 2 * step_compute[-1]


def test_the_cached_profile_takes_the_run_times_and_costs_every_node_from_them(
        timed_and_plain_runs, tmp_path):
    graph, timed, _ = timed_and_plain_runs
    cached = tmp_path / "cache" / "board.json"
    cached.parent.mkdir()
    shutil.copyfile(shipped_dir("profiles") / "rpi4.json", cached)
    chosen = ChosenProfile(load_profile(cached), cached, "cached", cached)
    before = build_costs(graph, chosen.profile)
    assert "roofline" in before.time_source and before.cost_source != "profile"
    assert steps_to_time(chosen, STEPS) == 3 and steps_to_time(chosen, 1) == 0
    said = []
    kept = keep_run_times(timed, chosen, graph, tmp_path, "pi", said.append)

    assert kept["nodes"] == len(graph.nodes) and kept["steps"] == 2
    assert kept["measured_s"] == pytest.approx(sum(timed["node_times"]["time_s"]))
    assert f"pi: {len(graph.nodes)} of {len(graph.nodes)} nodes timed as the plan ran them" \
        in said[0], said
    profile = load_profile(cached)
    after = build_costs(graph, profile)
    assert after.cost_source == "profile", after.time_source
    assert profile.measurements["nodes_timed_in_run"]["nodes"] == len(graph.nodes)
    assert load_profile(tmp_path / TIMED_FILE).ops == profile.ops
    assert "its nodes timed in a planned run" in ChosenProfile(profile, cached, "cached").describe()
    # nodes sharing a signature share the mean of their times
    by_node = dict(zip((n.id for n in graph.nodes), timed["node_times"]["time_s"]))
    for node in graph.nodes:
        key = node.signature or node.op
        same = [by_node[m.id] for m in graph.nodes if (m.signature or m.op) == key]
        assert profile.ops[key].time_s == pytest.approx(sum(same) / len(same))


def test_a_profile_with_node_times_or_outside_the_cache_is_left_as_it_is(
        timed_and_plain_runs, tmp_path):
    graph, timed, _ = timed_and_plain_runs
    given = shipped_dir("profiles") / "rpi4.json"
    untouched = given.read_bytes()
    chosen = ChosenProfile(load_profile(given), given, "given")
    assert steps_to_time(chosen, STEPS) == 0
    assert keep_run_times(timed, chosen, graph, tmp_path, "pi", print) is None
    assert given.read_bytes() == untouched and not (tmp_path / TIMED_FILE).exists()


@pytest.mark.parametrize("update, accumulate", [("step", 1), ("fused", 2)])
def test_a_step_graphs_optimizer_and_each_micro_pass_are_timed(update, accumulate):
    """A "step" graph's one update node is the optimizer's step after the instructions; an
    accumulating graph's K passes a step are each timed, and a node's figure is its mean
    over them (a fused update steps in the last pass only)."""
    from edge_remat_agent.capture import capture_model
    from helpers.executor_plans import EXAMPLE
    captured = capture_model(EXAMPLE, batch=4, image=16, update=update, accumulate=accumulate)
    graph = captured.graph
    report = run_plan(graph, every_forward_recomputed(graph), 3, None, captured=captured,
                      seed=1, time_nodes=1)
    assert report["grad_check"]["bitwise_equal"] is True
    figures = report["node_times"]
    assert figures["steps"] == 1
    updates = [t for n, t in zip(graph.nodes, figures["time_s"]) if n.kind == "update"]
    assert updates and all(t is not None and t > 0 for t in updates), figures
    assert all(t is not None for t in figures["time_s"])


def test_a_nodes_figure_is_its_mean_over_a_steps_passes_and_the_median_over_steps(
        user_capture):
    from edge_remat_agent.executor.node_timing import NodeTimes
    graph = user_capture().graph
    a, b = (n.id for n in graph.nodes[:2])
    times = NodeTimes(3)
    assert not times.wanted(0)  # the first step pays the warm-up
    assert times.wanted(1)
    times.add({a: 1.0, b: 2.0})
    times.add({a: 3.0, b: 0.0})  # the same step's second pass: a 2.0, b 1.0
    assert times.wanted(2)
    times.add({a: 6.0, b: 5.0})
    assert times.wanted(3)
    times.add({a: 4.0})
    assert not times.wanted(4)
    report = times.report(graph)
    assert report["steps"] == 3
    assert report["time_s"][:2] == [4.0, 3.0]  # a: median of 2, 6, 4; b: of 1, 5
    assert report["time_s"][2:] == [None] * (len(graph.nodes) - 2)
    assert NodeTimes(0).report(graph) is None
