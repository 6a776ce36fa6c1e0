"""Python state a model's forward changes: what the captured step cannot follow.

The capture runs the forward once and keeps the ops it ran. A forward that keeps a counter
in a module attribute and reads it (a KL warm-up switched on after N steps, a curriculum)
trains as eager PyTorch until the state changes, then on with what it computed at capture:
the first step's gradient check passes, later steps differ. The capture cannot see what the
forward reads, only what it writes: each plain attribute (bool, int, float, str, None) of a
module that the traced forward changed is said, so that the user can keep such state in a
tensor (a buffer the step updates) or out of the forward.
"""

from __future__ import annotations

from torch import nn

_PLAIN = (bool, int, float, str, type(None))


def python_state(module: nn.Module) -> dict[tuple[str, str], object]:
    """Every plain attribute of every submodule, by (module name, attribute)."""
    return {(name, attr): value for name, sub in module.named_modules()
            for attr, value in vars(sub).items()
            if not attr.startswith("_") and isinstance(value, _PLAIN)}


def changed_since(before: dict[tuple[str, str], object], module: nn.Module) -> list[str]:
    """'module.attribute (old -> new)' for each plain attribute the forward set or changed."""
    after = python_state(module)
    changes = []
    for key, value in after.items():
        old = before.get(key, "unset")
        # `is` first: an attribute that holds NaN, unchanged, is not unequal to itself
        if key not in before or type(old) is not type(value) or not (old is value
                                                                        or old == value):
            name, attr = key
            changes.append(f"{name + '.' if name else ''}{attr} ({old!r} -> {value!r})")
    return changes


def changed_state_warning(changes: list[str]) -> str | None:
    """The run's and the graph command's warning, None where the forward changed nothing."""
    if not changes:
        return None
    shown = ", ".join(changes[:3]) + (f" and {len(changes) - 3} more" if len(changes) > 3
                                      else "")
    return (f"the model's forward changes Python state: {shown}. The captured step keeps "
            "what the forward computed when it was captured, so if the forward reads that "
            "state (a step counter, a warm-up switch), training departs from eager PyTorch "
            "once it changes, and only the first step is checked: keep such state in a "
            "tensor (a buffer) or out of the forward")
