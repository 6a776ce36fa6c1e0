"""Granularity: `max_nodes` controls how fine the captured graph is, refinement splits the
groups that set the memory floor down to single ATen ops (and, where that floor is set by a node
no split reaches, the groups that set the floor without paging), the planner's floor names the
op that sets it, and a fine-grained graph still trains bit for bit like eager PyTorch.

Models are tiny (batch 2, 32x32 images; examples/my_model.py at batch 4, 16x16), but for
bert-mini at the size where its forward layers set the floor without paging."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from edge_remat.cli import app
from edge_remat.planner.build import build_problem
from edge_remat_agent.capture import capture_model, capture_module
from edge_remat_agent.executor import run_plan
from edge_remat_agent.floor import floor_node, no_paging_floor
from edge_remat_agent.formats import Tier
from edge_remat_agent.zoo import build
from helpers.executor_plans import (EXAMPLE, assert_same_model, eager_run, example_model,
                                    fresh, with_paging)

pytestmark = pytest.mark.slow

STEPS = 3


def resnet(max_nodes: int):
    module, args = build("resnet18", batch=2, image=32)
    return capture_module(module, args, "resnet18", max_nodes=max_nodes)


def module_level(name: str, **sizes):
    """The graph capture made before refinement: module-level groups only."""
    module, args = build(name, batch=2, **sizes)
    return capture_module(module, args, name, refined=False, update="step").graph


def test_max_nodes_controls_the_node_count():
    counts = [len(resnet(n).graph) for n in (30, 60, 100)]
    assert counts[0] <= 30 < counts[1] <= 60 < counts[2] <= 100, counts
    fine = resnet(1000).graph
    assert len(fine) > 100  # finer than any module-level grouping (73 nodes)
    members = [m for n in fine.nodes for m in n.attrs["members"]]
    assert len(members) == len(set(members)) == fine.capture["captured_nodes"]


@pytest.mark.parametrize("name, sizes", [("resnet18", dict(image=32)),
                                         ("mobilenet_v2", dict(image=32))])
def test_refinement_lowers_the_floor(name, sizes):
    coarse = module_level(name, **sizes)
    module, args = build(name, batch=2, **sizes)
    # Gradients as fixed memory ("step"), so that the floor is the activations' alone: at batch
    # 2 a fused graph's floor is a large weight's gradient and update, which no split changes.
    refined = capture_module(module, args, name, update="step").graph
    coarse_floor, refined_floor = floor_node(coarse)[0], floor_node(refined)[0]
    assert refined_floor < 0.9 * coarse_floor, (coarse_floor, refined_floor)
    # The planner's smallest budget is that floor on top of fixed memory, or higher where,
    # without paging, the pebbling floor lifts it (edge_remat_agent/pebbling.py)
    smallest, k = build_problem(refined, "1000").smallest_budget()
    assert smallest >= refined.fixed_bytes + refined_floor
    with_paging = build_problem(refined, "1000", paging="flash", tiers={
        "flash": Tier(read_bytes_per_s=1e8, write_bytes_per_s=1e8)})
    assert with_paging.smallest_budget()[0] == refined.fixed_bytes + refined_floor


def test_refinement_lowers_the_floor_without_paging_where_the_working_set_floor_stays(
        monkeypatch):
    # bert-mini b16 s128, parameters on flash: the floor is the word embedding's update
    # (parameters, gradient, momentum: 30 MiB each), which no split lowers. The coarsest
    # grouping that reaches it keeps each forward layer one 42 MiB tensor, and without paging
    # two of them come back together for the backward. Refinement splits them on.
    import edge_remat_agent.capture.refine as refine_module
    module, args = build("bert-mini", batch=16, seq=128)
    refined = capture_module(module, args, "bert-mini", params_home="flash").graph
    monkeypatch.setattr(refine_module, "no_paging_floor", lambda graph: 0)  # as it was
    coarsest = capture_module(module, args, "bert-mini", params_home="flash").graph
    need = floor_node(refined)[0]
    assert floor_node(coarsest)[0] == need
    assert no_paging_floor(refined) == need < 0.95 * no_paging_floor(coarsest)
    assert len(coarsest) < len(refined) <= 200


def test_the_floor_names_the_single_op_that_sets_it(tmp_path):
    module, args = build("mobilenet_v2", batch=2, image=32)
    graph = capture_module(module, args, "mobilenet_v2", update="step").graph
    path = tmp_path / "g.json"
    graph.save(path)
    result = CliRunner().invoke(app, ["plan", "--graph", str(path), "--budget", "1000"])
    assert result.exit_code == 2
    line = result.output.strip()
    assert line.startswith("error:") and "\n" not in line
    node = graph.node(int(re.search(r"node (\d+) \(", line).group(1)))
    assert len(node.attrs["ops"]) == 1 and node.attrs["ops"][0] in line, line
    assert f"({node.name})" in line and ":" in node.name  # e.g. ...backward:native_batch_norm_...
    smallest = build_problem(graph, "1000").smallest_budget()[0]
    assert f"needs at least {smallest} bytes" in line


def split_plan_near_the_floor(graph):
    """The split heuristic's plan halfway between the smallest budget and the plain peak."""
    from edge_remat.planner.build import plain_peak_bytes
    from edge_remat.planner.solve import solve
    smallest = build_problem(graph, "1000").smallest_budget()[0]
    budget = (smallest + plain_peak_bytes(graph)) // 2
    return solve(build_problem(graph, str(int(budget)), paging="none"), "heuristic:split").plan


def test_a_graph_of_single_ops_trains_bitwise_like_eager(tmp_path):
    captured = capture_model(EXAMPLE, batch=4, image=16, max_nodes=1000)
    graph = captured.graph
    single = sum(1 for n in graph.nodes if len(n.attrs.get("ops", [])) == 1)
    assert single > 0.6 * len(graph), (single, len(graph))
    captured = fresh(captured, example_model)
    plan = with_paging(split_plan_near_the_floor(graph), graph)
    report = run_plan(graph, plan, STEPS, str(tmp_path / "pages"), captured=captured, seed=7)
    assert report["recomputed"] > 0 and report["page_ins"] > 0
    assert report["grad_check"]["bitwise_equal"], report["grad_check"]
    reference, losses = eager_run(example_model, STEPS, seed=7)
    assert [r["loss"] for r in report["steps"]] == losses
    assert_same_model(captured.module, reference)
    assert report["summary"]["ledger_within_prediction"], report["summary"]


def test_recapture_on_the_board_gives_the_same_refined_graph():
    from edge_remat_agent.capture import recapture
    graph = capture_model("resnet18", batch=2, image=32, max_nodes=90).graph
    again = recapture(graph).graph
    assert again.fingerprint() == graph.fingerprint()
    assert [n.name for n in again.nodes] == [n.name for n in graph.nodes]


def test_a_graph_grouped_for_flash_with_parameters_in_ram_shares_the_flash_graphs_nodes():
    """What a profile job times for a flash-homed run: the graph with parameters in RAM whose
    ops are grouped as for flash. Grouped for RAM (as before), resnet18 b8 matched 20 of the
    flash graph's 46 compute nodes and none of its updates; the plan then charged 0.12 MiB of
    the first step's 4.8 MB warm-up, which sits mostly on the updates."""
    from edge_remat_agent.capture.pipeline import recapture, recapture_in_ram
    from edge_remat_agent.costs import profile_key_for, runtime_warm_bytes
    from edge_remat_agent.costs import build_costs
    from edge_remat_agent.formats import Profile
    from edge_remat_agent.formats.profile import OpCost

    def compute_keys(graph):
        return {n.signature or n.op for n in graph.nodes if n.kind not in ("param", "update")}

    on_flash = capture_model("resnet18", batch=8, image=32, params_home="flash").graph
    in_ram = capture_model("resnet18", batch=8, image=32).graph
    profiled = capture_model("resnet18", batch=8, image=32, grouped_for="flash").graph
    assert compute_keys(on_flash) != compute_keys(in_ram)  # refinement groups per home
    assert compute_keys(profiled) == compute_keys(on_flash)
    assert profiled.capture["grouped_for"] == "flash"
    assert profiled.fixed_bytes == in_ram.fixed_bytes
    # the board captures it again from its record, grouping included; a profile job given
    # the flash graph times this twin
    assert recapture(profiled).graph.fingerprint() == profiled.fingerprint()
    assert recapture_in_ram(on_flash).graph.fingerprint() == profiled.fingerprint()
    # a profile of it: every node of the flash graph but its parameter loads is measured, the
    # updates by their twins with the group in RAM (time and warm-up, not workspace: on
    # flash the update stages its state in RAM)
    ops = {n.signature or n.op: OpCost(time_s=1e-3, workspace_bytes=7, persistent_bytes=1000)
           for n in profiled.nodes}
    profile = Profile("measured", {}, 1.0, 2.0, ops=ops, name="fixture")
    unmatched = [n.kind for n in on_flash.nodes if profile_key_for(profile, n) is None]
    assert set(unmatched) == {"param"}
    assert runtime_warm_bytes(on_flash, profile) == 1000 * len(ops)
    update = next(n for n in on_flash.nodes if n.kind == "update")
    costs = build_costs(on_flash, profile)
    assert costs.time_s[on_flash.index[update.id]] >= 1e-3
    assert costs.workspace_bytes[on_flash.index[update.id]] == update.workspace_bytes != 7
