"""Build models on the `meta` device where they allow it, and make only the tensors needed.

A model that supports it (zoo/llama.py) carries `weight_seed` and makes each parameter on its
own (`init_tensor(name, shape, seed)`): capture needs no values at all (it traces with fake
tensors), and the executor makes the small trainable tensors in RAM and reads the frozen base
from the weight page store (store.py).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Callable, Iterator

import torch
from torch import nn

_state = threading.local()


@contextlib.contextmanager
def deferred_weights() -> Iterator[None]:
    """Models built inside put their parameters on `meta` (those that can)."""
    before = getattr(_state, "on", False)
    _state.on = True
    try:
        yield
    finally:
        _state.on = before


def deferring() -> bool:
    return getattr(_state, "on", False)


def is_deferred(module: nn.Module) -> bool:
    return any(p.device.type == "meta" for p in module.parameters())


def weight_maker(module: nn.Module) -> Callable[[str, tuple, torch.dtype], torch.Tensor]:
    """name, shape, dtype -> the parameter's initial value (the model's own per-tensor init)."""
    from ..zoo.llama import init_tensor
    seed = getattr(module, "weight_seed", None)
    if seed is None:
        raise ValueError(f"{type(module).__name__} was built on meta but does not say how to "
                         "make its weights (no weight_seed)")
    return lambda name, shape, dtype: init_tensor(name, shape, seed, dtype)


def set_parameter(param: nn.Parameter, value: torch.Tensor) -> None:
    """`param.data = value`, also from `meta` to a real device (which `.data` refuses): the
    parameter object stays the same, so optimizers and name maps holding it still do."""
    if param.device == value.device:
        param.data = value
    else:
        torch.utils.swap_tensors(param, nn.Parameter(value, requires_grad=param.requires_grad))


def make_missing(module: nn.Module, keep_on_meta: set[str] = frozenset()) -> int:
    """Make every meta parameter in RAM except those named in `keep_on_meta` (the frozen ones
    a weight file serves); returns the bytes made."""
    if not is_deferred(module):
        return 0
    make = weight_maker(module)
    made = 0
    for name, param in module.named_parameters():
        if param.device.type == "meta" and name not in keep_on_meta:
            set_parameter(param, make(name, tuple(param.shape), param.dtype))
            made += param.numel() * param.element_size()
    return made


def traceable(module: nn.Module) -> nn.Module:
    """What to trace for a meta-built model: a copy whose parameters have CPU storage that is
    never written or read (the tracer fakes them from their metadata, so the kernel gives no
    pages to it). Tracing on `meta` itself would mix devices with the batch; the copy goes when
    the trace is done, and the model itself stays on `meta`."""
    if not is_deferred(module):
        return module
    import copy
    replica = copy.deepcopy(module)
    for param in replica.parameters():
        if param.device.type == "meta":
            set_parameter(param, torch.empty(param.shape, dtype=param.dtype))
    return replica
