"""The runner calls an op through torch's Python binding only where that binding reaches the
traced overload (capture/bindings.py); the traced overload runs otherwise."""

from __future__ import annotations

import torch
from torch import fx

from edge_remat_agent.capture import bindings
from edge_remat_agent.capture.bindings import python_binding

aten = torch.ops.aten


def traced(target, *args, **kwargs) -> fx.Node:
    """An fx node calling `target` on placeholders carrying meta values, as a trace makes."""
    graph = fx.Graph()
    nodes = []
    for i, shape in enumerate(args):
        if isinstance(shape, tuple):
            node = graph.placeholder(f"x{i}")
            node.meta["val"] = torch.empty(shape, device="meta")
            nodes.append(node)
        else:
            nodes.append(shape)
    return graph.call_function(target, tuple(nodes), kwargs)


def test_a_binding_that_reaches_the_traced_overload_is_used():
    assert python_binding(traced(aten.transpose.int, (2, 3, 4), 1, 2), {}) \
        is torch._C._VariableFunctions.transpose
    assert python_binding(traced(aten.view.default, (2, 3, 4), [6, 4]), {}) \
        is torch._C.TensorBase.view
    node = traced(aten.sum.dim_IntList, (2, 3), [1], True)
    assert python_binding(node, {}) is torch._C._VariableFunctions.sum


def test_a_binding_that_reaches_another_overload_is_not(monkeypatch):
    # torch.div(x, 2.0) runs div.Tensor on a wrapped number, not div.Scalar.
    monkeypatch.setitem(bindings.CANDIDATES, aten.div.Scalar, torch._C._VariableFunctions.div)
    assert python_binding(traced(aten.div.Scalar, (2, 3), 2.0), {}) is None
    # A Python number where the schema has a tensor: left to the OpOverload.
    assert python_binding(traced(aten.add.Tensor, (2, 3), 1), {}) is None
    assert python_binding(traced(aten.gelu.default, (2, 3)), {}) is None  # no candidate


def test_an_op_without_shapes_does_not_turn_the_binding_off_for_its_kind(monkeypatch):
    # A graph read back from a file can hold ops whose inputs carry no traced shapes: that op
    # runs its OpOverload, and later ops of the same argument kinds still get the binding
    # (the answer was once cached by kinds, and one such op turned view's off for the process).
    monkeypatch.setattr(bindings, "_checked", {})
    graph = fx.Graph()
    bare = graph.call_function(aten.view.default, (graph.placeholder("x"), [6, 4]))
    assert python_binding(bare, {}) is None
    assert python_binding(traced(aten.view.default, (2, 3, 4), [6, 4]), {}) \
        is torch._C.TensorBase.view
