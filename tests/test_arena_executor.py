"""The arena executor against eager PyTorch: every planned tensor in the plan's arena layout,
and parameters after N steps bitwise equal to plain training (recomputation, paging to flash,
dropout and batch-norm statistics included); a plan without a layout, or with a layout that
does not fit its schedule, is one clear error."""

from __future__ import annotations

import dataclasses

import pytest

from edge_remat.planner.arena import plan_arena
from edge_remat_agent.executor import BadInput, run_plan
from edge_remat_agent.formats.arena import Slot

from helpers.executor_plans import (assert_same_model, dtr_plan, eager_run,
                                    every_forward_recomputed, example_model, trainable_count,
                                    with_paging, zoo_model)

pytestmark = pytest.mark.slow

STEPS = 3


def with_arena(plan, graph, method="best-fit"):
    return dataclasses.replace(plan, arena=plan_arena(graph, plan, None, method, 5.0))


@pytest.mark.parametrize("name", ["resnet18", "bert-mini", "mobilenet_v2"])
def test_arena_plans_train_bitwise_like_eager(name, zoo_captures, tmp_path):
    captured = zoo_captures(name)
    plan = with_arena(with_paging(dtr_plan(captured.graph), captured.graph), captured.graph)
    report = run_plan(captured.graph, plan, STEPS, str(tmp_path / "pages"), captured=captured,
                      seed=11, allocator="arena")
    assert report["recomputed"] > 0 and report["page_ins"] > 0
    check = report["grad_check"]
    assert check["bitwise_equal"] and check["compared"] == trainable_count(captured.module)
    reference, losses = eager_run(zoo_model(name), STEPS, seed=11)
    assert [r["loss"] for r in report["steps"]] == losses
    assert_same_model(captured.module, reference)
    assert report["executor_allocator"] == "arena"
    assert report["arena"]["size_bytes"] == plan.arena.size_bytes
    counts = report["steps"][-1]["arena"]
    # Outputs reach their slots by .out writes, page reads or copies; none stays outside.
    assert counts["outside"] == 0, counts
    assert counts["out_writes"] > 0 and counts["page_reads"] > 0, counts
    # Free ranges' pages go back to the kernel (executor/arena_pages.py).
    assert counts["released"] > 0 and counts["released_bytes"] > 0, counts
    # With pages given back, what ATen allocated stays where it is (a copy would hold it
    # twice), its slot untouched: nothing is copied in.
    assert counts["copies"] == 0 and counts["kept_outside_bytes"] > 0, counts
    # The CPU allocator's free heap pages go back too, where the plan nears its peak.
    assert counts["heap_trims"] > 0, counts



@pytest.mark.parametrize("name", ["resnet18", "bert-mini"])
def test_the_copying_path_cuda_takes_trains_bitwise_on_the_cpu(name, zoo_captures, tmp_path,
                                                               monkeypatch):
    """Where the arena's pages are not given back (CUDA, or no madvise), what ATen allocated
    is copied into its slot, and pages are read elsewhere and copied in (CUDA reads them on
    the CPU). No GPU here: the CPU arena is opened with CUDA's two choices, so that the
    path the device takes is checked for exactness where it can run."""
    from edge_remat_agent.executor import run as run_module
    from edge_remat_agent.executor.arena import Arena

    def cuda_like(plan, graph, device):
        arena = Arena(plan.arena, graph, plan, device, release_slack_bytes=None)
        arena.reads_pages_into_slots = False
        return arena
    monkeypatch.setattr(run_module, "open_arena", cuda_like)
    captured = zoo_captures(name)
    plan = with_arena(with_paging(dtr_plan(captured.graph), captured.graph), captured.graph)
    report = run_plan(captured.graph, plan, STEPS, str(tmp_path / "pages"), captured=captured,
                      seed=11, allocator="arena")
    assert report["grad_check"]["bitwise_equal"], report["grad_check"]
    reference, losses = eager_run(zoo_model(name), STEPS, seed=11)
    assert [r["loss"] for r in report["steps"]] == losses
    assert_same_model(captured.module, reference)
    counts = report["steps"][-1]["arena"]
    # Every page and every storage ATen made reaches its slot by a copy; none is left out.
    assert counts["page_reads"] == 0 and counts["copies"] > 0, counts
    assert counts["kept_outside"] == 0 and counts["outside"] == 0, counts
    assert counts["released"] == 0 and counts["heap_trims"] == 0, counts

def test_dropout_and_batch_norm_in_the_arena(user_capture, tmp_path):
    captured = user_capture()
    graph = captured.graph
    plan = with_arena(with_paging(every_forward_recomputed(graph), graph, every=3), graph,
                      "cpsat")
    report = run_plan(graph, plan, STEPS, str(tmp_path), captured=captured, seed=5,
                      allocator="arena")
    assert report["grad_check"]["bitwise_equal"], report["grad_check"]
    reference, losses = eager_run(example_model, STEPS, seed=5)
    assert [r["loss"] for r in report["steps"]] == losses
    assert_same_model(captured.module, reference)
    # The ledger counts each slot's bytes, not the arena its storage is: the tensor peak is
    # the glibc executor's for the same plan.
    plain = run_plan(graph, plan, 1, str(tmp_path / "glibc"), captured=user_capture(), seed=5,
                     paging_io="sync")
    assert report["steps"][0]["ledger_peak_bytes"] == plain["steps"][0]["ledger_peak_bytes"]
    assert report["steps"][0]["ledger_peak_bytes"] < plan.arena.size_bytes + graph.fixed_bytes


def test_a_plan_without_a_layout_or_with_a_bad_one_is_refused(user_capture):
    captured = user_capture()
    graph = captured.graph
    plan = every_forward_recomputed(graph)
    with pytest.raises(BadInput, match="no arena layout.*edge-remat plan --arena"):
        run_plan(graph, plan, 1, None, captured=captured, allocator="arena")
    with pytest.raises(BadInput, match="unknown allocator"):
        run_plan(graph, plan, 1, None, captured=captured, allocator="jemalloc")
    layout = plan_arena(graph, plan)
    first, second = [s for s in layout.slots if s.output_bytes][:2]
    clash = [dataclasses.replace(s, output_offset=first.output_offset)
             if s is second else s for s in layout.slots]
    bad = dataclasses.replace(plan, arena=dataclasses.replace(layout, slots=clash))
    with pytest.raises(BadInput, match="arena layout does not fit its schedule.*overlap"):
        run_plan(graph, bad, 1, None, captured=captured, allocator="arena")
    assert isinstance(first, Slot)
