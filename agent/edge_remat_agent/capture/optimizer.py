"""Fixed memory of a training step and the optimizer's update node.

Fixed memory is resident for the whole step whatever the schedule: parameters, their gradients,
the optimizer's state (SGD momentum: one copy of the trainable parameters; Adam, AdamW: two;
Adam with amsgrad: three), buffers
(batch-norm running statistics) and the example batch itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from . import DEFAULT_LR
from .errors import CaptureError


@dataclass(frozen=True)
class Optimizer:
    name: str
    state_copies: int  # optimizer state, in copies of the trainable parameters
    temp_copies: int  # temporaries of one parameter's size while it is updated (foreach off)
    flops_per_element: int
    tensors_moved: int  # parameter-sized tensors read or written per update
    scalar_state_bytes: int = 0  # per trainable parameter tensor, whatever its size

    def state_bytes(self, param_bytes: int, tensors: int) -> int:
        """The optimizer state of `tensors` trainable parameters of `param_bytes` in all."""
        return self.state_copies * param_bytes + self.scalar_state_bytes * tensors


OPTIMIZERS = {
    # buf = momentum * buf + grad; param -= lr * buf
    "sgd": Optimizer("sgd", state_copies=1, temp_copies=0, flops_per_element=4, tensors_moved=5),
    # m, v moments; denom = (sqrt(v) / bias_correction).add_(eps) holds two temporaries at
    # once, sqrt(v) and the quotient (QA: a 64 MiB parameter's step rose the process's
    # high-water mark by 128 MiB); each parameter's step count is a float32 scalar tensor
    "adamw": Optimizer("adamw", state_copies=2, temp_copies=2, flops_per_element=12,
                       tensors_moved=9, scalar_state_bytes=4),
    # SGD's, then grad + momentum * buf as a new tensor (one temporary) that steps the parameter
    "sgd-nesterov": Optimizer("sgd-nesterov", state_copies=1, temp_copies=1,
                              flops_per_element=6, tensors_moved=8),
    # AdamW's without its decoupled weight decay (Adam's weight_decay is 0), the same two
    # temporaries (a 64 MiB parameter's step: 128 MiB, amsgrad's too: /tmp/me/adam_temp.py)
    "adam": Optimizer("adam", state_copies=2, temp_copies=2, flops_per_element=11,
                      tensors_moved=9, scalar_state_bytes=4),
    # and the running maximum of v, a third copy, that the denominator is taken from
    "adam-amsgrad": Optimizer("adam-amsgrad", state_copies=3, temp_copies=2,
                              flops_per_element=12, tensors_moved=11, scalar_state_bytes=4),
}


def optimizer_named(name: str, model: str) -> Optimizer:
    if name not in OPTIMIZERS:
        raise CaptureError(model, f"unknown optimizer {name!r}; choose one of "
                           f"{', '.join(sorted(OPTIMIZERS))}")
    return OPTIMIZERS[name]


def fixed_memory(module: nn.Module, example_args, optimizer: Optimizer) -> dict[str, int]:
    """Bytes resident for the whole step, by kind (tied weights counted once)."""
    params = _unique(module.parameters())
    trainable = _unique(p for p in module.parameters() if p.requires_grad)
    out = {
        "parameters": sum(_bytes(p) for p in params),
        "gradients": sum(_bytes(p) for p in trainable),
        "optimizer_state": optimizer.state_bytes(sum(_bytes(p) for p in trainable),
                                                 len(trainable)),
        "buffers": sum(_bytes(b) for b in _unique(module.buffers())),
        "inputs": sum(_bytes(t) for t in _unique(_tensors(example_args))),
    }
    out["total"] = sum(out.values())
    return out


def largest_trainable_bytes(module: nn.Module) -> int:
    return max((_bytes(p) for p in module.parameters() if p.requires_grad), default=0)


def trainable_elements(module: nn.Module) -> int:
    return sum(p.numel() for p in _unique(p for p in module.parameters() if p.requires_grad))


def _unique(tensors) -> list[torch.Tensor]:
    seen, out = set(), []
    for t in tensors:
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape)) \
            if t.untyped_storage().data_ptr() else id(t)
        if key not in seen:
            seen.add(key)
            out.append(t)
    return out


def _tensors(obj) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for item in obj for t in _tensors(item)]
    if isinstance(obj, dict):
        return [t for item in obj.values() for t in _tensors(item)]
    return []


def _bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


# What the executor trains with, and the eager reference too: one place, so that both take
# exactly the same steps. foreach=False keeps temporaries one parameter large (temp_copies).
TORCH_OPTIMIZERS = {
    "sgd": (torch.optim.SGD, {"lr": DEFAULT_LR["sgd"], "momentum": 0.9, "foreach": False}),
    "adamw": (torch.optim.AdamW, {"lr": DEFAULT_LR["adamw"], "foreach": False}),
    "sgd-nesterov": (torch.optim.SGD, {"lr": DEFAULT_LR["sgd-nesterov"], "momentum": 0.9,
                                       "nesterov": True, "foreach": False}),
    "adam": (torch.optim.Adam, {"lr": DEFAULT_LR["adam"], "foreach": False}),
    "adam-amsgrad": (torch.optim.Adam, {"lr": DEFAULT_LR["adam-amsgrad"], "amsgrad": True,
                                        "foreach": False}),
}


# the settings that change the steps, where torch's own defaults stand unless named above
HYPERPARAMETERS = ("momentum", "dampening", "nesterov", "betas", "eps", "weight_decay",
                   "amsgrad")


def optimizer_settings(name: str) -> dict[str, object]:
    """Every setting the named optimizer steps with (torch's defaults included: AdamW's
    weight decay 0.01, Adam's betas and eps), so that a report says enough to train the same
    steps elsewhere (QA: AdamW's decay was nowhere to be read)."""
    import inspect
    cls, options = TORCH_OPTIMIZERS[name]
    defaults = {key: value.default for key, value in inspect.signature(cls).parameters.items()
                if key in HYPERPARAMETERS}
    settings = {"class": f"torch.optim.{cls.__name__}", **defaults, **options}
    return {k: list(v) if isinstance(v, tuple) else v for k, v in settings.items()}


def torch_optimizer(name: str, module: nn.Module, lr: float | None = None
                    ) -> torch.optim.Optimizer:
    """The optimizer a captured graph's update node stands for, over the trainable parameters;
    `lr` overrides its learning rate (the update node's memory and cost do not depend on it).
    Plain training (plain_train.py) and the executor both build theirs here, so that a plain
    run and a planned run take the same steps."""
    return torch_optimizer_over(name, [p for p in module.parameters() if p.requires_grad], lr)


def torch_optimizer_over(name: str, params: list[torch.Tensor], lr: float | None = None
                         ) -> torch.optim.Optimizer:
    """The same optimizer over `params` only (a fused update node's parameter group). With
    foreach off, each parameter's step is computed on its own, so stepping groups one by one
    gives bit for bit what one step over all parameters gives."""
    if name not in TORCH_OPTIMIZERS:
        raise CaptureError(name, f"unknown optimizer {name!r}; choose one of "
                           f"{', '.join(sorted(TORCH_OPTIMIZERS))}")
    cls, options = TORCH_OPTIMIZERS[name]
    if lr is not None:
        options = {**options, "lr": float(lr)}
    return cls(params, **options)
