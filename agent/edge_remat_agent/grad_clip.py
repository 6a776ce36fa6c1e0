"""Gradient clipping by global norm, as torch.nn.utils.clip_grad_norm_(params, max_norm) does.

torch computes each gradient's 2-norm (on the CPU `_foreach_norm`, one norm per tensor), the
2-norm of those norms stacked in parameter order, then multiplies every gradient by
min(max_norm / (norm + 1e-6), 1). A fused graph splits that in two (capture/state.py): one
node computes the total norm once every gradient is complete (`total_norm`, over the gradients
in the module's parameter order, so the stack sums in the same order), and each update node
scales its group's gradients with it (`clip_with_norm`). Both call torch's own functions, so
the numbers are torch's bit for bit.
"""

from __future__ import annotations

import math

import torch

CLIP_OP = "clip_grad_norm"  # the op of a fused graph's norm node


def check_max_norm(max_norm) -> float:
    """The max norm as a float; ValueError with one line otherwise."""
    try:
        value = float(max_norm)
    except (TypeError, ValueError):
        raise ValueError(f"--clip-grad-norm must be a number, not {max_norm!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"--clip-grad-norm must be a positive number (the gradients' largest "
                         f"global 2-norm, e.g. 1.0), not {max_norm:g}")
    return value


def total_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """The gradients' global 2-norm, `grads` in the module's parameter order."""
    return torch.nn.utils.get_total_norm(grads)


def clip_with_norm(params: list[torch.Tensor], max_norm: float, norm: torch.Tensor) -> None:
    """Scale the parameters' .grad in place by min(max_norm / (norm + 1e-6), 1)."""
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)


def clip_all(params, max_norm: float) -> torch.Tensor:
    """Plain training's clipping: every gradient at once; returns the total norm."""
    return torch.nn.utils.clip_grad_norm_(params, max_norm)
