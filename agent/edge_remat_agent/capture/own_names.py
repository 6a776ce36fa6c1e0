"""The model's own parameter names: a transformers model is wrapped (hf.TrainingLoss) under
`model`, and its names are the transformers model's, as its state_dict(), its checkpoints and
a PEFT adapter's files have them, without the wrapper's "model." prefix."""

from __future__ import annotations

from torch import nn


def state_root(module: nn.Module) -> tuple[nn.Module, str]:
    """The model whose state_dict() names the file uses, and the prefix of its names in
    `module` (a transformers model wrapped by hf.TrainingLoss: its `model`, "model.")."""
    if type(module).__name__ == "TrainingLoss" and isinstance(getattr(module, "model", None),
                                                              nn.Module):
        return module.model, "model."
    return module, ""


def own_name(name: str, prefix: str) -> str:
    """`name` (in the wrapper) as the model itself names it."""
    return name[len(prefix):] if prefix and name.startswith(prefix) else name
