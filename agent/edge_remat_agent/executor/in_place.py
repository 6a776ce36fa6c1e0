"""Elementwise ops written into an operand that dies at them, in the compiled step.

The traced graph is functional: `scaled = noise / q`, then `out = x * scaled`, each result in
new memory. Eager PyTorch writes many of these in place (dropout's `noise.div_(q)`; autograd
accumulates with `add_`), and on the CPU a result in fresh memory costs more than the
arithmetic: at BERT-mini's shapes an out-of-place `div` by a scalar took 2.4x the time of
eager's `div_` (torch.profiler, keep-all step against eager's). So where an operand is a value
of the node that dies at the op, the compiled step (compiled_step.py) runs the op's in-place
overload on it instead. The bits are the same: the same elementwise kernel, element by
element, and `a * b` is `b * a` in IEEE arithmetic (so is `+`). Memory only falls.

It is safe only where nothing else sees the operand's storage: it was made by an op that
returns new memory (its schema's result aliases nothing), no view was ever taken of it, the
other operand is another value, and the result has the operand's shape, dtype and strides
(the traced metadata), so later ops see exactly the tensor they would have.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

_aten = torch.ops.aten
# functional overload -> (in-place overload, whether its two tensor operands commute)
IN_PLACE = {
    _aten.div.Scalar: (_aten.div_.Scalar, False),
    _aten.div.Tensor: (_aten.div_.Tensor, False),
    _aten.mul.Scalar: (_aten.mul_.Scalar, False),
    _aten.mul.Tensor: (_aten.mul_.Tensor, True),
    _aten.add.Tensor: (_aten.add_.Tensor, True),
    _aten.sub.Tensor: (_aten.sub_.Tensor, False),
}


def in_place_operand(op: fx.Node, dying: set[str]) -> tuple[Any, int] | None:
    """(the in-place overload's C++ entry point, the position of the operand to write into)
    for `op`, if one of its operands can take the result (module docstring); `dying`: the
    names of the node's own values whose last use is this op."""
    entry = IN_PLACE.get(op.target)
    if entry is None:
        return None
    in_place, commutes = entry
    if op.kwargs.get("alpha", 1) != 1:
        commutes = False  # a + alpha * b is not b + alpha * a
    positions = (0, 1) if commutes else (0,)
    for position in positions:
        operand = op.args[position] if position < len(op.args) else None
        if not isinstance(operand, fx.Node) or operand.name not in dying:
            continue
        other = op.args[1 - position] if len(op.args) > 1 else None
        if other is operand or not _same_layout(operand, op) or not _owns_memory(operand):
            continue
        return in_place._op, position
    return None


def _same_layout(operand: fx.Node, op: fx.Node) -> bool:
    a, out = operand.meta.get("val"), op.meta.get("val")
    return (isinstance(a, torch.Tensor) and isinstance(out, torch.Tensor)
            and a.shape == out.shape and a.dtype == out.dtype and a.stride() == out.stride()
            and a.device == out.device)


def _owns_memory(value: fx.Node) -> bool:
    """Made by an op whose result aliases no input, and never viewed by another op. The
    traced metadata's fake tensors share storage where the real ones will, which also
    catches the ops whose schema does not say they alias (`_unsafe_view`)."""
    target = value.target
    if value.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return False
    returns = target._schema.returns
    storage = _storage(value.meta.get("val"))
    if len(returns) != 1 or returns[0].alias_info is not None or storage is None:
        return False
    if any(_storage(a.meta.get("val")) == storage for a in value.all_input_nodes):
        return False  # a view of its input
    for user in value.users:
        if not isinstance(user.target, torch._ops.OpOverload):
            return False
        if any(result.alias_info is not None for result in user.target._schema.returns):
            return False  # a view of it, or an op that writes it
        results = user.meta.get("val")
        for result in results if isinstance(results, (list, tuple)) else (results,):
            if _storage(result) == storage:
                return False
    return True


def _storage(value: Any) -> int | None:
    """The identity of a tensor's storage (None for anything else)."""
    if not isinstance(value, torch.Tensor):
        return None
    try:
        return value.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):  # a tensor without one (sparse, nested)
        return None
