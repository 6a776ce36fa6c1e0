"""Partial fine-tuning: train the parameters whose names match, freeze the rest."""

from __future__ import annotations

from fnmatch import fnmatchcase

from torch import nn

from .errors import CaptureError


def freeze_except(module: nn.Module, patterns: list[str], model: str) -> list[str]:
    """Set requires_grad False on every parameter no pattern matches (shell-style patterns on
    the parameter's dotted name, e.g. `fc.*` or `*.bias`); return the trained names. A pattern
    that matches nothing is an error: a typo would otherwise freeze the whole model."""
    names = [name for name, _ in module.named_parameters()]
    unmatched = [pat for pat in patterns if not any(fnmatchcase(n, pat) for n in names)]
    if unmatched:
        sample = ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")
        raise CaptureError(model, f"--train pattern(s) {', '.join(unmatched)} match no "
                           f"parameter of the model (its parameters: {sample})")
    trained = []
    for name, param in module.named_parameters():
        keep = any(fnmatchcase(name, pat) for pat in patterns)
        param.requires_grad_(keep and param.requires_grad)
        if param.requires_grad:
            trained.append(name)
    if not trained:
        raise CaptureError(model, "--train leaves no trainable parameter")
    return trained
