"""Training in half precision (`--dtype bf16|fp16`): the whole model in one floating dtype.

The model's floating parameters and buffers are converted (`module.to(dtype)`) and the
example batch's floating tensors cast to it, before capture; the loss is what the model then
computes, the gradients and the optimizer's state are in that dtype too (torch keeps state
like its parameter), as `model.to(torch.bfloat16)` and the same optimizer do in plain
PyTorch. Every caller that builds the model (capture, the board's executor, plain training,
the gradient check) goes through `load_model(..., dtype=...)`, so all of them train the same
model, bit for bit. Batches from data are cast on their way in (data/__init__.py).

fp32 is the default and changes nothing: a graph records `source.dtype` only when it is not.
"""

from __future__ import annotations

import torch
from torch import nn

from . import DTYPE_NAMES
from .errors import CaptureError

DTYPES = dict(zip(DTYPE_NAMES, (torch.float32, torch.bfloat16, torch.float16)))
DEFAULT_DTYPE = "fp32"


def dtype_named(name: str | None, model: str = "model") -> torch.dtype:
    """The torch dtype of a `--dtype` name; an unknown name is a CaptureError (exit 2)."""
    name = name or DEFAULT_DTYPE
    if name not in DTYPES:
        raise CaptureError(model, f"unknown dtype {name!r}: use one of {', '.join(DTYPES)}")
    return DTYPES[name]


def in_dtype(module: nn.Module, args: tuple, name: str | None,
             model: str = "model") -> tuple[nn.Module, tuple]:
    """`module` and its example `args` in dtype `name` (unchanged for fp32). Integer tensors
    (token ids, labels) keep their dtype; a model that has no floating parameter is refused,
    since there is nothing a dtype could change."""
    dtype = dtype_named(name, model)
    if dtype is torch.float32:
        return module, args
    floating = [p for p in module.parameters() if p.is_floating_point()]
    if not floating:
        raise CaptureError(model, f"--dtype {name}: the model has no floating-point "
                           "parameter to convert; leave --dtype out")
    return module.to(dtype), cast_floating(args, dtype)


def cast_floating(args: tuple, dtype: torch.dtype) -> tuple:
    """Each floating tensor of `args` (nested too) in `dtype`; everything else as it is."""
    from torch.utils._pytree import tree_map
    return tuple(tree_map(lambda a: a.to(dtype) if isinstance(a, torch.Tensor)
                          and a.is_floating_point() else a, tuple(args)))


def dtype_source(name: str | None) -> dict:
    """What a graph's `capture.source` records of the dtype: nothing for the default (fp32
    graphs stay byte for byte what they were)."""
    return {} if (name or DEFAULT_DTYPE) == DEFAULT_DTYPE else {"dtype": name}


# Adam's eps (1e-8) is 0 in float16 (its smallest step is 6e-8): an element whose gradient and
# moments are 0 (an unused embedding row, a dead ReLU) steps by 0/0, NaN, at the first step.
_EPS_IN_DENOMINATOR = ("adam", "adamw", "adam-amsgrad")


def refuse_fp16_adam(module: nn.Module, optimizer: str, model: str) -> None:
    """What cannot train: Adam's family on float16 parameters (bf16 has float32's range)."""
    if optimizer in _EPS_IN_DENOMINATOR and any(
            p.dtype is torch.float16 for p in module.parameters() if p.requires_grad):
        raise CaptureError(model, f"{optimizer} on float16 parameters: its eps (1e-8) is 0 in "
                           "float16, so an element whose gradient is 0 becomes NaN at the "
                           "first step; use --dtype bf16, or --optimizer sgd")


def slow_half_kernels(module: nn.Module) -> str | None:
    """Why a float16 model would train far slower than float32 on this CPU, if it would:
    torch has no vectorised float16 convolution backward on CPU (digits-cnn's first step: 226 s
    in float16, 6.2 s in float32, 3.9 s in bfloat16 here; convolution_backward was 84% of a
    float16 step in torch.profiler)."""
    if not any(p.dtype is torch.float16 for p in module.parameters()):
        return None
    convs = [name for name, m in module.named_modules()
             if isinstance(m, nn.modules.conv._ConvNd)]
    if convs:
        return (f"--dtype fp16: torch's CPU convolution backward has no fast float16 kernel "
                f"(module '{convs[0]}'); a step may take tens of times longer than in fp32: "
                "--dtype bf16 has one")
    return None
