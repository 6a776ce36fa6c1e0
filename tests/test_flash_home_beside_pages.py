"""Parameters homed on flash and a plan's page-outs fill one page folder. Before, the planner held
page-outs to the profile's whole flash capacity, the run checked the page-outs and the home
against the free space each on its own, so `--params-home flash --paging flash` passed both and
filled the folder mid-step; and frozen weights served from the model's weight file (already in
the page folder, never written to the home) were counted as the home's again. Now page-outs get
the capacity the home leaves (formats.graph.homed_bytes, the one figure), the run checks both
together before step 1, and the weight file's groups need no new room. The real page folders
are small tmpfs mounts (root; skipped elsewhere, saying so)."""

from __future__ import annotations

import pytest

from edge_remat.planner.build import build_problem
from edge_remat.planner.problem import ProblemError
from edge_remat.planner.solve import solve
from edge_remat_agent.capture import capture_model
from edge_remat_agent.executor import ExecutorError, run_plan
from edge_remat_agent.executor.stores import homed_bytes, paged_bytes_by_tier
from edge_remat_agent.formats import Profile, Tier
from edge_remat_agent.formats.graph_details import WEIGHT_FILE
from edge_remat_agent.executor.run import validate
from helpers.executor_plans import every_forward_recomputed, with_paging
from helpers.small_disk import small_disk

KiB, MiB = 2**10, 2**20


def _profile(capacity: int) -> Profile:
    flash = Tier(read_bytes_per_s=4e9, write_bytes_per_s=4e9, latency_s=1e-4,
                 capacity_bytes=capacity)
    return Profile("measured", {}, idle_w=0.0, active_w=1.0, tiers={"flash": flash})


def test_page_outs_get_the_flash_capacity_the_parameters_home_leaves():
    graph = capture_model("digits-cnn", batch=4, params_home="flash").graph
    home = sum(homed_bytes(graph))
    # at 70% a plan with the whole capacity pages 1.3 MB of activations to flash
    capacity = home + 512 * KiB
    problem = build_problem(graph, "70%", _profile(capacity), paging="flash")
    assert problem.costs.tiers["flash"].capacity_bytes == 512 * KiB
    plan = solve(problem, "auto", time_limit=3).plan
    paged = paged_bytes_by_tier(plan, graph).get("flash", 0)
    assert paged + home <= capacity, (paged, home, capacity)
    validate(graph, plan)  # replayed with the plan's own figures, it keeps within them too
    # a capacity the home alone does not fit leaves nothing, and the planner says so
    with pytest.raises(ProblemError) as refused:
        build_problem(graph, "70%", _profile(home - 1), paging="flash")
    message = str(refused.value)
    assert f"need {home} bytes" in message and f"capacity of {home - 1} bytes" in message
    assert "leaves nothing" in message and "--params-home ram" in message, message


def test_page_outs_and_the_home_past_the_free_space_together_are_refused_before_step_1(
        tmp_path):
    """Each fits 30 MiB (home 26 MiB, pages 8 MiB); together they do not, and step 2 (the
    first with the optimizer's momentum at home) filled the disk in net.0's update. With room
    for both, it trains."""
    captured = capture_model("mlp", batch=1024, params_home="flash")
    graph = captured.graph
    plan = with_paging(every_forward_recomputed(graph), graph, every=1)
    home, paged = sum(homed_bytes(graph)), paged_bytes_by_tier(plan, graph)["flash"]
    assert max(home, paged) < 30 * MiB < home + paged
    with small_disk(tmp_path / "small", "30M") as small:
        with pytest.raises(ExecutorError) as refused:
            run_plan(graph, plan, 2, str(small / "pages"), captured=captured,
                     check_gradients=False)
        left = list((small / "pages").rglob("*.page"))
    message = str(refused.value)
    assert "checked before the first step" in message, message
    assert f"it needs {home + paged} bytes" in message and f"{home} bytes" in message, message
    assert f"page-outs at their most: {paged} bytes" in message, message
    assert "--params-home ram" in message and "--reprofile" in message, message
    assert not left  # nothing was moved out
    room = -(-(home + paged) // MiB) + 2  # MiB: the pages' headers beside them
    with small_disk(tmp_path / "large", f"{room}M") as large:
        report = run_plan(graph, plan, 2, str(large / "pages"), captured=captured,
                          check_gradients=False)
    assert len(report["steps"]) == 2 and report["steps"][1]["page_outs"] > 0


def test_frozen_weights_served_from_the_weight_file_need_no_new_room(tmp_path):
    """llama-tiny-lora's frozen base (0.6 MB) is in its weight file in the page folder: the
    home holds only the LoRA groups and their state (49 KB). A 1 MiB folder has room for both;
    counted again, the frozen base was refused there."""
    def capture():
        return capture_model("llama-tiny-lora", optimizer="adamw", params_home="flash",
                             refined=False)
    captured = capture()
    graph = captured.graph
    frozen = sum(node.out_bytes for node in graph.nodes if node.kind == "param"
                 and node.attrs["io"].get("source") == WEIGHT_FILE)
    held, written = homed_bytes(graph)
    trainable = sum(node.out_bytes for node in graph.nodes if node.kind == "param") - frozen
    state = sum(node.attrs.get("state_bytes", 0) for node in graph.nodes
                if node.kind == "update" and "home" in node.attrs)
    assert frozen > 500 * KiB and held == trainable + state < 64 * KiB
    plan = solve(build_problem(graph, 1.0, paging="none"), "heuristic:keep-all").plan
    with small_disk(tmp_path / "small", "1M") as small:
        report = run_plan(graph, plan, 1, str(small / "pages"), captured=captured,
                          check_gradients=False)
    assert len(report["steps"]) == 1
