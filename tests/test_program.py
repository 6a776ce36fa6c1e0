"""A capture sent back from its child process as a Program (capture/program.py) rebuilds the
trace with every value's traced layout: shapes, strides, dtypes and which values share a
storage. Without them a job captured in a child (every `run` and `deploy`) ran no arena .out
write, no in-place op and no Python binding, where the same plan run in-process did."""

from __future__ import annotations

import dataclasses
import pickle

import pytest
import torch

from edge_remat.planner.arena import plan_arena
from edge_remat_agent.capture import bindings, capture_model
from edge_remat_agent.capture.program import program_of
from edge_remat_agent.executor import run_plan

from helpers.executor_plans import dtr_plan


def _layouts(trace) -> dict:
    """value name -> (shape, stride, offset, dtype) of each tensor in its fake value."""
    def layout(value):
        if isinstance(value, torch.Tensor):
            return tuple(value.shape), value.stride(), value.storage_offset(), value.dtype
        if isinstance(value, (list, tuple)):
            return tuple(layout(v) for v in value)
        return None
    return {n.name: layout(n.meta.get("val")) for n in trace.graph_module.graph.nodes
            if n.op != "output"}


def _sharing(trace) -> set[frozenset]:
    """The groups of values (2 or more) whose tensors share one storage."""
    groups: dict[int, set] = {}
    for node in trace.graph_module.graph.nodes:
        value = node.meta.get("val")
        for i, item in enumerate(value if isinstance(value, (list, tuple)) else [value]):
            if isinstance(item, torch.Tensor):
                groups.setdefault(item.untyped_storage()._cdata, set()).add((node.name, i))
    return {frozenset(g) for g in groups.values() if len(g) > 1}


def test_the_rebuilt_trace_carries_every_traced_layout_and_its_aliasing():
    traced = capture_model("resnet18", batch=2, image=16).trace
    rebuilt = pickle.loads(pickle.dumps(program_of(traced))).trace()
    assert _layouts(rebuilt) == _layouts(traced)
    sharing = _sharing(traced)
    assert sharing and _sharing(rebuilt) == sharing  # views of one value, by storage
    assert all(v.device.type == "meta" for n in rebuilt.graph_module.graph.nodes
               for v in [n.meta.get("val")] if isinstance(v, torch.Tensor))


def test_the_rebuilt_trace_runs_through_the_bindings_the_child_checked(monkeypatch):
    """The check that a binding reaches the traced overload dispatches on meta tensors and
    leaves memory in its process (7.3 MiB on resnet18): the child decides, the rebuilt trace
    carries the answers, and the process that trains never runs the check."""
    traced = capture_model("resnet18", batch=2, image=16).trace
    program = pickle.loads(pickle.dumps(program_of(traced)))
    ops = [n for n in traced.compute_nodes if isinstance(n.target, torch._ops.OpOverload)]
    expected = {n.name: bindings.python_binding(n, dict(n.kwargs)) for n in ops}
    assert any(expected.values())
    rebuilt = program.trace()

    def no_check(*args):
        raise AssertionError("the binding check ran in the training process")
    monkeypatch.setattr(bindings, "_reaches", no_check)
    monkeypatch.setattr(bindings, "_checked", {})
    assert {n.name: bindings.python_binding(n, dict(n.kwargs)) for n in rebuilt.compute_nodes
            if n.name in expected} == expected


@pytest.mark.slow
def test_a_job_captured_in_a_child_runs_the_arena_as_one_captured_here(tmp_path):
    """run_plan without `captured` captures in a child, as run and deploy jobs do: the arena
    step writes the same results through .out variants (before: none, every result left
    where ATen put it), and trains bit for bit."""
    captured = capture_model("resnet18", batch=4, image=16)
    plan = dtr_plan(captured.graph)
    plan = dataclasses.replace(plan, arena=plan_arena(captured.graph, plan, None, "best-fit", 5.0))
    counts = {}
    for where, given in (("here", captured), ("child", None)):
        report = run_plan(captured.graph, plan, 2, str(tmp_path / where), captured=given,
                          seed=3, allocator="arena")
        assert report["grad_check"]["bitwise_equal"], report["grad_check"]
        counts[where] = report["steps"][-1]["arena"]
    assert counts["child"]["out_writes"] > 0
    for key in ("out_writes", "out_bytes", "copies", "kept_outside", "kept_outside_bytes"):
        assert counts["child"][key] == counts["here"][key], (key, counts)
