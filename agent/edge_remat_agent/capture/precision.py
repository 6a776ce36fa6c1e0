"""Training in half precision (`--dtype bf16|fp16`): the whole model in one floating dtype.

The model's floating parameters and buffers are converted (`module.to(dtype)`) and the
example batch's floating tensors cast to it, before capture; the loss is what the model then
computes, the gradients and the optimizer's state are in that dtype too (torch keeps state
like its parameter), as `model.to(torch.bfloat16)` and the same optimizer do in plain
PyTorch. Every caller that builds the model (capture, the board's executor, plain training,
the gradient check) goes through `load_model(..., dtype=...)`, so all of them train the same
model, bit for bit. Batches from data are cast on their way in (data/__init__.py).

fp32 is the default and changes nothing: a graph records `source.dtype` only when it is not.

Mixed precision (`--trainable-dtype fp32` with `--dtype bf16|fp16`): the frozen parameters and
the buffers in `--dtype`, the parameters that train in float32, so their gradients and optimizer
state are float32 too (a bf16 weight plus an update below its rounding step stays the same
weight; in float32 the update lands). This is PEFT's default for LoRA on a half-precision
base (`autocast_adapter_dtype`); the adapter layers cast their input to the adapters' dtype and
their result back (PEFT's own layers; zoo/lora.py's as they do), so only adapter parameters may
train in float32. A PEFT `modules_to_save` copy (a classifier head) trains too, in `--dtype`:
PEFT's `autocast_adapter_dtype` upcasts its tuner layers only, so the copy keeps the base's
dtype, and PEFT saves it so. The graph records `source.trainable_dtype` only when it differs
from `--dtype`.
"""

from __future__ import annotations

import torch
from torch import nn

from . import DTYPE_NAMES, mixed_dtype_problem
from .errors import CaptureError

DTYPES = dict(zip(DTYPE_NAMES, (torch.float32, torch.bfloat16, torch.float16)))
DEFAULT_DTYPE = "fp32"


def dtype_named(name: str | None, model: str = "model") -> torch.dtype:
    """The torch dtype of a `--dtype` name; an unknown name is a CaptureError (exit 2)."""
    name = name or DEFAULT_DTYPE
    if name not in DTYPES:
        raise CaptureError(model, f"unknown dtype {name!r}: use one of {', '.join(DTYPES)}")
    return DTYPES[name]


def in_dtype(module: nn.Module, args: tuple, name: str | None, model: str = "model",
             trainable: str | None = None) -> tuple[nn.Module, tuple]:
    """`module` and its example `args` in dtype `name` (unchanged for fp32), the parameters
    that train in dtype `trainable` (None: `name` too). Integer tensors (token ids, labels)
    keep their dtype; a model that has no floating parameter is refused, since there is
    nothing a dtype could change."""
    dtype = dtype_named(name, model)
    trained = trainable_dtype(name, trainable, model)
    if dtype is torch.float32:
        return module, args
    floating = [p for p in module.parameters() if p.is_floating_point()]
    if not floating:
        raise CaptureError(model, f"--dtype {name}: the model has no floating-point "
                           "parameter to convert; leave --dtype out")
    if trained is None:
        return module.to(dtype), cast_floating(args, dtype)
    _refuse_unmixable(module, name, trainable, model)
    in_base = saved_copy_parameters(module)
    # Module._apply hands each Parameter itself to the function: requires_grad says its dtype
    module._apply(lambda t: t.to(trained if t.requires_grad and id(t) not in in_base else dtype)
                  if t.is_floating_point() else t)
    return module, cast_floating(args, dtype)


def trainable_dtype(name: str | None, trainable: str | None,
                    model: str = "model") -> torch.dtype | None:
    """The dtype the trainable parameters take apart from the model's (`--trainable-dtype`);
    None where they take the model's. A pair mixed_dtype_problem refuses is a CaptureError."""
    if trainable is None or trainable == (name or DEFAULT_DTYPE):
        return None
    dtype_named(trainable, model)
    if (problem := mixed_dtype_problem(name, trainable)) is not None:
        raise CaptureError(model, problem)
    return DTYPES[trainable]


def _refuse_unmixable(module: nn.Module, name: str, trainable: str, model: str) -> None:
    """Mixed precision needs frozen parameters to hold in `name`, and every trainable one in
    a layer that casts its input to the weight's dtype (a LoRA adapter): any other layer
    would meet a bf16 input with a float32 weight."""
    params = dict(module.named_parameters())
    trained = [n for n, p in params.items() if p.requires_grad]
    if len(trained) == len(params):  # (QA: it said "--train PATTERN", refused next below)
        raise CaptureError(model, f"--trainable-dtype {trainable}: every parameter trains (full "
                           f"fine-tuning), so none would stay in --dtype {name}: give --dtype "
                           f"{trainable} to train it all in {trainable}, or train a LoRA "
                           "adapter alone (a zoo *-lora model, hf: with adapter=): only "
                           "adapters may train in another dtype")
    allowed = adapter_parameters(module) | saved_copy_parameters(module)
    outside = [n for n in trained if id(params[n]) not in allowed]
    if outside:
        raise CaptureError(model, f"--trainable-dtype {trainable}: parameter '{outside[0]}' "
                           "trains outside a LoRA adapter, and its layer would meet a "
                           f"{name} input with {trainable} weights; only adapters (zoo *-lora "
                           "models, hf: with adapter=) may train in another dtype, and PEFT's "
                           f"modules_to_save in {name}: --train adapter parameters only, or "
                           "leave --trainable-dtype out")


def adapter_parameters(module: nn.Module) -> set[int]:
    """ids of the parameters adapter layers own besides their base layer's: zoo/lora.py's
    LoRALinear, PEFT's tuner layers (both cast their input to the adapter's dtype)."""
    import sys
    from ..zoo.lora import LoRALinear
    kinds: tuple[type, ...] = (LoRALinear,)
    peft = sys.modules.get("peft.tuners.tuners_utils")  # loaded only where an hf: model uses it
    if peft is not None:
        kinds += (peft.BaseTunerLayer,)
    found: set[int] = set()
    for layer in module.modules():
        if isinstance(layer, kinds):
            base = layer.base if isinstance(layer, LoRALinear) else layer.get_base_layer()
            found |= {id(p) for p in layer.parameters()} - {id(p) for p in base.parameters()}
    return found


def saved_copy_parameters(module: nn.Module) -> set[int]:
    """ids of the parameters of PEFT's `modules_to_save` copies (ModulesToSaveWrapper): they
    train whole, in the base's dtype, as PEFT leaves them (its upcast skips them)."""
    import sys
    peft = sys.modules.get("peft.utils.other")  # loaded only where an hf: model uses it
    wrapper = getattr(peft, "ModulesToSaveWrapper", None)
    if wrapper is None:
        return set()
    return {id(p) for layer in module.modules() if isinstance(layer, wrapper)
            for p in layer.modules_to_save.parameters()}


def cast_floating(args: tuple, dtype: torch.dtype) -> tuple:
    """Each floating tensor of `args` (nested too) in `dtype`; everything else as it is."""
    from torch.utils._pytree import tree_map
    return tuple(tree_map(lambda a: a.to(dtype) if isinstance(a, torch.Tensor)
                          and a.is_floating_point() else a, tuple(args)))


def dtype_source(name: str | None, trainable: str | None = None) -> dict:
    """What a graph's `capture.source` records of the dtypes: nothing for the default (fp32
    graphs stay byte for byte what they were), the trainable dtype only where it differs."""
    return {**({} if (name or DEFAULT_DTYPE) == DEFAULT_DTYPE else {"dtype": name}),
            **({} if trainable is None or trainable == (name or DEFAULT_DTYPE)
               else {"trainable_dtype": trainable})}


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
