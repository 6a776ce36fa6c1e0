"""Partial fine-tuning: train the parameters whose names match, freeze the rest."""

from __future__ import annotations

from fnmatch import fnmatchcase

from torch import nn

from .errors import CaptureError
from .own_names import own_name, state_root


def freeze_except(module: nn.Module, patterns: list[str], model: str) -> list[str]:
    """Set requires_grad False on every parameter no pattern matches (shell-style patterns on
    the parameter's whole dotted name, e.g. `fc.*` or `*.bias`, a tied parameter's every
    name included); return the trained names. A transformers model's parameters match by its
    own names too, as weights.pt and its checkpoints name them (`lm_head.weight`, QA: only
    `model.lm_head.weight` matched). A pattern that matches nothing is an error: a typo
    would otherwise freeze the whole model."""
    prefix = state_root(module)[1]
    every = list(module.named_parameters(remove_duplicate=False))
    names = [own_name(name, prefix) for name, _ in every]

    def matches(name: str, pat: str) -> bool:
        return fnmatchcase(name, pat) or fnmatchcase(own_name(name, prefix), pat)

    unmatched = [pat for pat in patterns if not any(matches(n, pat) for n, _ in every)]
    if unmatched:
        sample = ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")
        raise CaptureError(model, f"--train pattern(s) {', '.join(unmatched)} match no "
                           f"parameter of the model{_whole_name_hint(unmatched, names)} (its "
                           f"parameters: {sample})")
    kept = {id(param) for name, param in every if any(matches(name, pat)
                                                      for pat in patterns)}
    trained = []
    for name, param in module.named_parameters():
        param.requires_grad_(id(param) in kept and param.requires_grad)
        if param.requires_grad:
            trained.append(name)
    if not trained:
        raise CaptureError(model, "--train leaves no trainable parameter")
    return trained


def _whole_name_hint(unmatched: list[str], names: list[str]) -> str:
    """For `--train head` where head.weight exists: a pattern matches a whole name."""
    for pat in unmatched:
        below = [n for n in names if n.startswith(pat + ".")]
        if below:
            return (f"; a pattern matches a parameter's whole dotted name: '{pat}.*' would "
                    f"match {', '.join(below[:3])}{', ...' if len(below) > 3 else ''}")
    return ""
