"""Gradient clipping by global norm, as torch.nn.utils.clip_grad_norm_(params, max_norm) does.

On the CPU torch computes each gradient's 2-norm with `_foreach_norm` (one norm per tensor,
each on its own), stacks those norms in parameter order, takes their 2-norm, and multiplies
every gradient by min(max_norm / (norm + 1e-6), 1). A fused graph does the same in steps
(capture/clip_nodes.py): each group's gradients' norms once the group's gradients are complete
(`tensor_norms`), the total once all are (`norm_of_norms`, in the module's parameter order),
then each update scales its group's gradients with it (`clip_with_norm`, torch's own), so the
numbers are torch's bit for bit.
"""

from __future__ import annotations

import math

import torch


def check_max_norm(max_norm) -> float:
    """The max norm as a float; ValueError with one line otherwise."""
    try:
        value = float(max_norm)
    except (TypeError, ValueError):
        raise ValueError(f"--clip-grad-norm must be a number, not {max_norm!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"--clip-grad-norm must be a positive number (the gradients' largest "
                         f"global 2-norm, e.g. 1.0), not {value:g}")
    return value


def tensor_norms(grads: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each gradient's 2-norm, as torch.nn.utils.get_total_norm takes them on the CPU."""
    return list(torch._foreach_norm(grads, 2.0))


def norm_of_norms(norms: list[torch.Tensor]) -> torch.Tensor:
    """The global 2-norm from each gradient's, `norms` in the module's parameter order."""
    return torch.linalg.vector_norm(torch.stack(norms), 2.0)


def clip_with_norm(params: list[torch.Tensor], max_norm: float, norm: torch.Tensor) -> None:
    """Scale the parameters' .grad in place by min(max_norm / (norm + 1e-6), 1)."""
    torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)


def clip_all(params, max_norm: float) -> torch.Tensor:
    """Plain training's clipping: every gradient at once; returns the total norm."""
    return torch.nn.utils.clip_grad_norm_(params, max_norm)
