"""A loss that is not finite (NaN, inf): training diverged, by the model's doing (a learning
rate too large, a forward that divides by a parameter driven to zero), not the plan's. The run
goes on as plain PyTorch's would, but says so once, naming the first such step, and its report
keeps that step (`nonfinite_loss`). Standard library only: the host reads it too."""

from __future__ import annotations

import math
from typing import Iterable, Optional


def is_nonfinite(loss) -> bool:
    """Whether `loss` is a number that is NaN or infinite (a missing one is not)."""
    return isinstance(loss, (int, float)) and not math.isfinite(loss)


def first_nonfinite_loss(losses: Iterable) -> Optional[dict]:
    """{"step": the first step (from 1) whose loss is not finite, "loss": it as text ("nan",
    "inf": strict JSON has neither)}, or None where every loss is finite."""
    for step, loss in enumerate(losses, start=1):
        if is_nonfinite(loss):
            return {"step": step, "loss": str(float(loss))}
    return None


def nonfinite_loss_warning(found: dict) -> str:
    return (f"the loss is not finite ({found['loss']}) at step {found['step']}: training "
            "diverged (the model's doing, not the plan's); try a smaller --lr, or look for a "
            "division by zero or an overflow in the model's forward")


class LossWatch:
    """Told what `first_nonfinite_loss` found so far, as often as progress comes (a host may see
    only some steps' progress); gives the warning line the first time it is a step, else None."""

    def __init__(self) -> None:
        self.warned = False

    def see(self, found: Optional[dict]) -> Optional[str]:
        if self.warned or not found:
            return None
        self.warned = True
        return nonfinite_loss_warning(found)
