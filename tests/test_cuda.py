"""The executor, paging and the op profiler on a CUDA device (what a Jetson's GPU runs).

Skipped where no CUDA device is (CI's machines); run on a lent GPU with
`python -m pytest -q tests/test_cuda.py` (the lead ran it on an H100: see docs/boards.md, "On a
CUDA device"). Bitwise equality with eager is promised on the CPU only: on CUDA the replayed ATen
ops are the ones traced on the CPU, and some (batch norm, dropout) take other kernels than
eager's there; these tests check what must be exact on CUDA too (paging) and what runs.
"""

from __future__ import annotations

import pytest
import torch

from helpers.executor_plans import dtr_plan, fresh, with_paging, zoo_capturer, zoo_model
from edge_remat_agent.capture import capture_module
from edge_remat_agent.executor import BadInput, run_plan
from edge_remat_agent.pages import PinnedStore
from edge_remat_agent.pages.codec import reading_into

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")

CUDA = torch.device("cuda")


def test_pinned_store_round_trips_on_a_side_stream():
    store, side = PinnedStore(), torch.cuda.Stream()
    value = torch.randn(64, 33, device=CUDA).t()  # a transposed (dense, non-contiguous) layout
    with torch.cuda.stream(side):
        store.put("a", value)
        into = torch.empty_strided(value.shape, value.stride(), device=CUDA)
        with reading_into(lambda nbytes, dtype, shape, stride: into):
            back = store.get("a")
    assert back is into and torch.equal(back, value) and back.stride() == value.stride()
    assert store.bytes_held == value.numel() * 4
    assert store.discard("a") and store.bytes_held == 0


def _trained(plan, **options) -> tuple[dict, dict]:
    """Two planned steps on CUDA from the same weights, batch and seed: the report and the
    parameters after them."""
    captured = zoo_capturer()("bert-mini")
    report = run_plan(captured.graph, plan, 2, None, captured=captured, seed=3, device="cuda",
                      **options)
    return report, {name: p.detach().cpu() for name, p in captured.module.named_parameters()}


@pytest.mark.parametrize("io", ["sync", "overlap"])
def test_paging_on_cuda_moves_exact_bytes(io):
    """Paging moves raw bytes, on a copy stream too: a plan paging half its recomputations to
    pinned host memory trains to the same bits as the same plan recomputing them. (Against
    eager, CUDA differs: its dropout and batch norm kernels are not the CPU-traced ones.)"""
    graph = zoo_capturer()("bert-mini").graph
    recompute = dtr_plan(graph)
    _, expected = _trained(recompute)
    report, trained = _trained(with_paging(recompute, graph), stores={"flash": PinnedStore()},
                               paging_io=io)
    assert report["page_ins"] > 0 and report["tiers"]["flash"]["store"] == "PinnedStore"
    assert all(torch.equal(trained[name], value) for name, value in expected.items())
    assert all(s["device_reserved_peak_bytes"] >= s["device_peak_bytes"] > 0
               for s in report["steps"])


def test_the_arena_is_refused_on_cuda():
    from edge_remat.planner.arena import plan_arena
    from edge_remat_agent.costs import build_costs
    captured = zoo_capturer()("bert-mini")
    plan = dtr_plan(captured.graph)
    plan.arena = plan_arena(captured.graph, plan, build_costs(captured.graph), "best-fit", 5)
    with pytest.raises(BadInput, match="CPU only"):
        run_plan(captured.graph, plan, 1, None, captured=captured, device="cuda",
                 allocator="arena")


def test_the_op_profiler_measures_every_node_on_cuda():
    """The example batch, captured on the CPU, is bound on the device (it was not: the first
    convolution failed on a CPU input and CUDA weights)."""
    from edge_remat_agent.profiler.ops import measure_nodes
    module, args = zoo_model("resnet18")()
    captured = capture_module(module, args, "resnet18")
    nodes = measure_nodes(fresh(captured, zoo_model("resnet18")), device="cuda",
                          context_steps=2)
    assert len(nodes) == len(captured.graph) and all(n.time_s > 0 for n in nodes)
    assert all(n.allocator_peak_bytes is not None for n in nodes if n.kind != "update")
