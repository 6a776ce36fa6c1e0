"""Call an ATen op through torch's Python binding where that binding dispatches to the very
same overload: eager PyTorch's forward calls ops that way, and it costs less per call than
the OpOverload's boxed entry point (which converts every argument to an IValue against the
schema: 0.6-3 us more per call, measured on view, t and transpose).

A binding picks its overload from the Python arguments it gets, so the choice is checked, not
assumed: the binding is called once on meta tensors shaped like the op's traced arguments,
under a dispatch mode that records which overload runs and stops it there. Only where that
is the traced overload (and no tensor argument is a Python number, which a binding and the
boxed call could wrap differently) is the binding used; otherwise the OpOverload is.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import fx
from torch.utils._python_dispatch import TorchDispatchMode

_aten = torch.ops.aten
_functions = torch._C._VariableFunctions
_methods = torch._C.TensorBase

# Overload -> the binding that should reach it (checked per argument shape, see below).
CANDIDATES: dict[Any, Callable] = {
    _aten.view.default: _methods.view,
    _aten.t.default: _functions.t,
    _aten.transpose.int: _functions.transpose,
    _aten.expand.default: _methods.expand,
    _aten.detach.default: _functions.detach,
    _aten.select.int: _functions.select,
    _aten.mm.default: _functions.mm,
    _aten.bmm.default: _functions.bmm,
    _aten.addmm.default: _functions.addmm,
    _aten.clone.default: _functions.clone,
    _aten.add.Tensor: _functions.add,
    _aten.mul.Tensor: _functions.mul,
    _aten.sum.dim_IntList: _functions.sum,
    _aten.mean.dim: _functions.mean,
    _aten.relu.default: _functions.relu,
    _aten.tanh.default: _functions.tanh,
    _aten.convolution.default: _functions.convolution,
    _aten.native_layer_norm.default: _functions.native_layer_norm,
    _aten.embedding.default: _functions.embedding,
    _aten._softmax.default: _functions._softmax,
    _aten._log_softmax.default: _functions._log_softmax,
}

_checked: dict[tuple, bool] = {}  # (overload, the arguments' kinds) -> the binding reaches it

# An op's meta key holding the answer decided where it was traced (capture/program.py): the
# check dispatches on meta tensors, and that leaves 7.3 MiB resident in the process that runs
# it (resnet18's 245 ops; the first convolution 2.95 MiB): the capture child, which exits.
DECIDED = "python_binding_reaches"


def python_binding(op: fx.Node, kwargs: dict) -> Callable | None:
    """The Python binding to call `op` (a traced ATen node) with its args and `kwargs`, or
    None where only its OpOverload is sure to run the same overload."""
    binding = CANDIDATES.get(op.target)
    if binding is None:
        return None
    decided = op.meta.get(DECIDED)
    if decided is not None:
        return binding if decided else None
    if not _tensors_are_values(op):
        return None
    key = (op.target, _kinds(op.args), tuple(sorted((k, _kinds(v)) for k, v in kwargs.items())))
    if key in _checked:
        return binding if _checked[key] else None
    try:
        reaches = _reaches(binding, op, kwargs)
    except _NoMeta:
        # This op's arguments carry no shapes to check with: an answer about them alone, not
        # to be kept for every op of the same kinds (it turned the binding off for them all).
        return None
    _checked[key] = reaches
    return binding if reaches else None


def _tensors_are_values(op: fx.Node) -> bool:
    """Every Tensor-typed argument is a traced value, not a Python number."""
    schema = op.target._schema
    for i, argument in enumerate(schema.arguments):
        if str(argument.type) not in ("Tensor", "Tensor?"):
            continue
        value = op.args[i] if i < len(op.args) and not argument.kwarg_only \
            else op.kwargs.get(argument.name)
        if value is not None and not isinstance(value, fx.Node):
            return False
    return True


def _kinds(value: Any) -> Any:
    if isinstance(value, fx.Node):
        return "value"
    if isinstance(value, (list, tuple)):
        return tuple(_kinds(v) for v in value)
    return type(value).__name__


class _Reached(Exception):
    pass


class _Record(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.reached = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.reached = func
        raise _Reached


def _reaches(binding: Callable, op: fx.Node, kwargs: dict) -> bool:
    args = [_meta(a) for a in op.args]
    kw = {k: _meta(v) for k, v in kwargs.items()}
    record = _Record()
    try:
        with record, torch.no_grad():
            binding(*args, **kw)
    except _Reached:
        pass
    except Exception:  # noqa: BLE001 - a binding that refuses these arguments is not used
        return False
    return record.reached is op.target


class _NoMeta(Exception):
    pass


def _meta(value: Any) -> Any:
    if isinstance(value, fx.Node):
        val = value.meta.get("val")
        if not isinstance(val, torch.Tensor):
            raise _NoMeta(value.name)
        return torch.empty_strided(tuple(val.shape), tuple(val.stride()), dtype=val.dtype,
                                   device="meta")
    if isinstance(value, (list, tuple)):
        return type(value)(_meta(v) for v in value)
    return value
