"""The compiled step writes an elementwise result into an operand that dies at the op
(executor/in_place.py): only where nothing else can see that operand's memory, with the same
bits as the functional op, and a run that does it trains exactly like eager PyTorch."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from helpers.executor_plans import assert_same_model, eager_run, keep_all, zoo_model
from edge_remat_agent.executor import compiled_step, in_place, run_plan

aten = torch.ops.aten


def traced(f, *shapes):
    """f traced to ATen ops with fake tensors: each node carries its result's metadata."""
    graph = make_fx(f, tracing_mode="fake")(*(torch.randn(s) for s in shapes)).graph
    return [n for n in graph.nodes if n.op == "call_function"]


def test_only_a_dying_operand_that_owns_its_memory_takes_the_result():
    def f(x, y):
        a = x * y
        b = a / 3.0  # a dies here and owns its memory
        c = x * y
        view = c.t()  # c is viewed: nothing may be written into it
        d = c + 1.0
        e = x * y
        g = y * e  # e, the second operand of a product, dies here
        h = x * y
        k = y - h  # the second operand of a difference: it does not commute
        m = x[0] * 2.0
        n = x * y
        flat = aten._unsafe_view.default(n, [9])  # shares n's memory, though its schema
        o = n + 1.0  # does not say so
        return b, view, d, g, k, m, flat, o
    ops = traced(f, (3, 3), (3, 3))
    a, b, c, _, d, e, g, h, k, select, m, n, flat, o = ops
    assert (b.target, d.target, g.target, k.target) == \
        (aten.div.Tensor, aten.add.Tensor, aten.mul.Tensor, aten.sub.Tensor)

    assert in_place.in_place_operand(b, {a.name}) == (aten.div_.Tensor._op, 0)
    assert in_place.in_place_operand(b, set()) is None  # a lives on
    assert in_place.in_place_operand(d, {c.name}) is None  # c has a view
    assert in_place.in_place_operand(g, {e.name}) == (aten.mul_.Tensor._op, 1)
    assert in_place.in_place_operand(k, {h.name}) is None
    assert in_place.in_place_operand(m, {select.name}) is None  # select views x
    assert in_place.in_place_operand(a, {"x", "y"}) is None  # inputs are not the node's
    assert flat.target is aten._unsafe_view.default
    assert in_place.in_place_operand(o, {n.name}) is None


def test_the_in_place_overload_gives_the_functional_bits():
    """Including the zeros' signs and NaNs a dropout mask's product makes."""
    grad = torch.randn(4096)
    grad[:4] = torch.tensor([float("inf"), -float("inf"), float("nan"), -0.0])
    mask = (torch.rand(4096) > 0.1).to(torch.float32)
    for functional, (overload, _) in in_place.IN_PLACE.items():
        if functional in (aten.div.Scalar, aten.mul.Scalar):
            expected, result = functional(mask, 0.9), overload._op(mask.clone(), 0.9)
        else:
            expected, result = functional(grad, mask), overload._op(grad.clone(), mask)
        assert torch.equal(expected.view(torch.int32), result.view(torch.int32)), functional
    product = aten.mul.Tensor(grad, mask)
    assert torch.equal(product.view(torch.int32),
                       aten.mul_.Tensor._op(mask.clone(), grad).view(torch.int32))


@pytest.mark.slow
def test_a_compiled_bert_step_writes_in_place_and_trains_like_eager(zoo_captures, tmp_path,
                                                                     monkeypatch):
    written = []

    def counting(op, dying):
        found = in_place.in_place_operand(op, dying)
        written.extend([op.target] if found else [])
        return found
    monkeypatch.setattr(compiled_step, "in_place_operand", counting)
    captured = zoo_captures("bert-mini")
    steps = 5  # the checked step, two measured, two compiled
    report = run_plan(captured.graph, keep_all(captured.graph), steps, str(tmp_path),
                      captured=captured, seed=11)
    # dropout's scaling and product, the residual adds
    assert {aten.div.Scalar, aten.mul.Tensor, aten.add.Tensor} <= set(written)
    assert report["grad_check"]["bitwise_equal"]
    reference, losses = eager_run(zoo_model("bert-mini"), steps, seed=11)
    assert [r["loss"] for r in report["steps"]] == losses
    assert_same_model(captured.module, reference)
