"""The executor, paging and the op profiler on a CUDA device (what a Jetson's GPU runs).

Skipped where no CUDA device is (CI's machines); run on a lent GPU with
`python -m pytest -q -n 0 tests/test_cuda.py` (see docs/boards.md, "On a CUDA device").
Bitwise equality with eager is promised on the CPU only: on CUDA the replayed ATen ops are the
ones traced on the CPU, and some (batch norm, dropout, attention's backward) take other kernels
than eager's there. What must be exact on CUDA too: a plan's step against the captured step
replayed plainly (the gradient check's reference there), and plans, allocators and homes
against each other (the same ops in all).
"""

from __future__ import annotations

import pytest
import torch

from helpers.executor_plans import dtr_plan, fresh, with_paging, zoo_capturer, zoo_model
from edge_remat_agent.capture import capture_module
from edge_remat_agent.executor import run_plan
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
        with reading_into(lambda nbytes, dtype, shape, stride, key: into):
            back = store.get("a")
    assert back is into and torch.equal(back, value) and back.stride() == value.stride()
    assert store.bytes_held == value.numel() * 4
    assert store.discard("a") and store.bytes_held == 0


def _trained(plan, name: str = "bert-mini", **options) -> tuple[dict, dict]:
    """Two planned steps on CUDA from the same weights, batch and seed: the report and the
    parameters after them."""
    captured = zoo_capturer()(name)
    report = run_plan(captured.graph, plan, 2, None, captured=captured, seed=3, device=CUDA,
                      **options)
    return report, {n: p.detach().cpu() for n, p in captured.module.named_parameters()}


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
    assert report["grad_check"]["bitwise_equal"], report["grad_check"]
    assert all(s["device_reserved_peak_bytes"] >= s["device_peak_bytes"] > 0
               for s in report["steps"])


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2", "bert-mini"])
def test_the_arena_trains_on_cuda_as_the_caching_allocator_does(name):
    """The arena on the device: every planned tensor in one block laid out by the plan, the
    ops' results written into their slots (out variants) or copied in, pages read elsewhere and
    copied in. It trains to the bits of the same plan under PyTorch's caching allocator, pages
    and all, and the step's gradients are the captured step's replayed plainly."""
    from edge_remat.planner.arena import plan_arena
    from edge_remat_agent.costs import build_costs
    graph = zoo_capturer()(name).graph
    plan = with_paging(dtr_plan(graph), graph)
    plan.arena = plan_arena(graph, plan, build_costs(graph), "best-fit", 5)
    caching, expected = _trained(plan, name, stores={"flash": PinnedStore()})
    arena, trained = _trained(plan, name, stores={"flash": PinnedStore()}, allocator="arena")
    assert arena["page_ins"] > 0 and arena["recomputed"] > 0
    assert arena["grad_check"]["bitwise_equal"] and arena["grad_check"]["reference"] == "replay"
    assert [s["loss"] for s in arena["steps"]] == [s["loss"] for s in caching["steps"]]
    assert all(torch.equal(trained[n], value) for n, value in expected.items())
    assert arena["steps"][-1]["arena"]["out_writes"] > 0


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


def _operator_level(name: str, params_home: str):
    """`name` captured one node per allocating ATen op, trained with Adam, its parameters
    homed at `params_home`, its nodes grouped as for flash (both homes share compute nodes)."""
    module, args = zoo_model(name)()
    return capture_module(module, args, name, optimizer="adam", operator_level=True,
                          params_home=params_home, grouped_for="flash")


def _parameters(captured) -> dict:
    return {n: p.detach().cpu() for n, p in captured.module.named_parameters()}


def test_every_byte_planned_trains_on_cuda_as_in_device_memory(tmp_path):
    """This wave's graph on the device: operator-level nodes, parameters and Adam's state
    homed on flash (read at each param node, written back by each update), activations paged
    to pinned host memory. Against the same model with everything in device memory and a
    plan that only recomputes, it trains to the same bits (the same ATen ops in both)."""
    assert_every_byte_trains_as_in_memory("cuda", tmp_path, PinnedStore())


def assert_every_byte_trains_as_in_memory(device: str, tmp_path, store) -> None:
    homed = _operator_level("bert-mini", "flash")
    in_memory = _operator_level("bert-mini", "ram")
    assert any(n.kind == "param" for n in homed.graph.nodes)
    plan = with_paging(dtr_plan(homed.graph), homed.graph)
    paged = run_plan(homed.graph, plan, 2, str(tmp_path / "pages"), captured=homed, seed=3,
                     device=device, stores={"flash": store}, keep_parameters=True)
    plain = run_plan(in_memory.graph, dtr_plan(in_memory.graph), 2, None, captured=in_memory,
                     seed=3, device=device, check_gradients=False)
    assert paged["page_ins"] > 0 and paged["recomputed"] > 0 and plain["recomputed"] > 0
    assert paged["grad_check"]["bitwise_equal"], paged["grad_check"]
    trained, expected = _parameters(homed), _parameters(in_memory)
    assert next(homed.module.parameters()).device.type == device
    assert trained.keys() == expected.keys()
    assert all(torch.equal(trained[n], v) for n, v in expected.items())


def test_a_planned_run_times_every_node_on_cuda():
    """Node timing in a planned run (executor/node_timing.py) waits for the device after
    each compute: every node gets a time, and the timed nodes together take about a step
    (launch-only figures would sum to far less than the step)."""
    captured = zoo_capturer()("resnet18")
    plan = dtr_plan(captured.graph)
    report = run_plan(captured.graph, plan, 4, None, captured=captured, seed=3, device="cuda",
                      check_gradients=False, time_nodes=2)
    times = report["node_times"]["time_s"]
    assert len(times) == len(captured.graph) and all(t is not None and t > 0 for t in times)
    step = min(s["step_time_s"] for s in report["steps"][1:])
    assert sum(times) > 0.3 * step, (sum(times), step)


def test_the_gradient_checks_blocks_go_back_to_the_driver_before_step_two():
    """The check's plain step reserves a plain step's blocks. Left in the caching allocator,
    they stayed reserved for the whole run (operator-level bert-mini b16 s128, parameters on
    flash, on an H200: 656 MiB reserved in every step against 189 MiB planned). Released
    after the check, the planned steps reserve less than the first step did."""
    from edge_remat_agent.zoo import build
    module, args = build("bert-mini", batch=16, seq=128)
    captured = capture_module(module, args, "bert-mini")
    report = run_plan(captured.graph, dtr_plan(captured.graph, 0.3), 3, None,
                      captured=captured, seed=3, device=CUDA)
    first, *planned = [s["device_reserved_peak_bytes"] for s in report["steps"]]
    assert report["grad_check"]["bitwise_equal"], report["grad_check"]
    assert max(planned) < first, (first, planned)
