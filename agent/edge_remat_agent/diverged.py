"""A loss that is not finite (NaN, inf): training diverged, by the model's doing (a learning
rate too large, a forward that divides by a parameter driven to zero), not the plan's. The run
goes on as plain PyTorch's would, but says so once, naming the first such step, and its report
keeps that step and how many steps had one (`nonfinite_loss`); asked to (`stop_on_nonfinite`),
a run stops after the first such step instead. Standard library only: the host reads it too.

The check is the step's loss alone, which every step already reads as a Python float (one
`math.isfinite` a step); the gradients are not scanned (a pass over every gradient a step)."""

from __future__ import annotations

import math
from typing import Iterable, Optional

DEFAULT_REMEDY = ("try a smaller --lr, or look for a division by zero or an overflow in the "
                  "model's forward")
HALF_DTYPES = ("bf16", "fp16")


def is_nonfinite(loss) -> bool:
    """Whether `loss` is a number that is NaN or infinite (a missing one is not)."""
    return isinstance(loss, (int, float)) and not math.isfinite(loss)


class LossTally:
    """Each step's loss, seen once as it comes: the first step whose loss is not finite and
    how many were. `remedy`: the words of what to try, for this run's options
    (nonfinite_remedy), kept in what it found."""

    def __init__(self, remedy: Optional[str] = None) -> None:
        self.remedy = remedy
        self.first: Optional[dict] = None
        self.count = 0

    def see(self, step: int, loss) -> bool:
        """Tally step `step`'s loss (steps from 1); whether it is not finite."""
        if not is_nonfinite(loss):
            return False
        self.count += 1
        if self.first is None:
            # as text ("nan", "inf"): strict JSON has neither
            self.first = {"step": step, "loss": str(float(loss))}
        return True

    @property
    def found(self) -> Optional[dict]:
        """{"step": the first step whose loss is not finite, "loss": it as text, "count": how
        many steps' were, "remedy": what to try (where known)}, or None while all are finite."""
        if self.first is None:
            return None
        return {**self.first, "count": self.count,
                **({"remedy": self.remedy} if self.remedy else {})}


def first_nonfinite_loss(losses: Iterable) -> Optional[dict]:
    """LossTally.found of these losses, the first being step 1."""
    tally = LossTally()
    for step, loss in enumerate(losses, start=1):
        tally.see(step, loss)
    return tally.found


def nonfinite_remedy(lr: Optional[float], clip_grad_norm: Optional[float] = None,
                     dtype: Optional[str] = None, trainable_dtype: Optional[str] = None) -> str:
    """What to try against a loss that went non-finite, among the options this run did not
    take: a smaller learning rate, clipping the gradients, fp32 trained parameters under a
    half-precision model (clipping and the dtypes are capture options: `run` or `graph`)."""
    tries = ["a smaller --lr" + (f" (this run's is {lr:g})" if lr else "")]
    if clip_grad_norm is None:
        tries.append("clipping the gradients (--clip-grad-norm 1.0 on run or graph)")
    if dtype in HALF_DTYPES and (trainable_dtype or dtype) != "fp32":
        tries.append(f"training in fp32 rather than {dtype} (--trainable-dtype fp32 with a "
                     "frozen base, else --dtype fp32; on run or graph)")
    listed = tries[0] if len(tries) == 1 else ", ".join(tries[:-1]) + " or " + tries[-1]
    return (f"try {listed}; else look for a division by zero or an overflow in the model's "
            "forward")


def remedy_for(capture: dict, lr: Optional[float]) -> str:
    """nonfinite_remedy for a graph captured so (its `capture` record: clipping, dtypes) or,
    for plain training, its params alike; `lr` None: the optimizer's default."""
    if lr is None:
        from .capture import DEFAULT_LR  # light: the capture's torch parts load on first use
        lr = DEFAULT_LR.get(capture.get("optimizer") or "sgd")
    source = capture.get("source") or capture
    return nonfinite_remedy(lr, capture.get("clip_grad_norm"), source.get("dtype"),
                            source.get("trainable_dtype"))


def nonfinite_loss_warning(found: dict) -> str:
    """The warning line (run, deploy, reports) for what LossTally found."""
    later = int(found.get("count") or 1) - 1
    return (f"the loss is not finite ({found['loss']}) at step {found['step']}"
            + (f" and at {later} later step{'s' if later > 1 else ''}" if later else "")
            + f": training diverged (the model's doing, not the plan's); "
            f"{found.get('remedy') or DEFAULT_REMEDY}")


def stopped_line(found: dict, steps: int) -> str:
    """The error line of a run that stopped at its first non-finite loss (stop_on_nonfinite)."""
    return (f"stopped at step {found['step']} of {steps} (--stop-on-nonfinite): the loss is not "
            f"finite ({found['loss']}): training diverged; "
            f"{found.get('remedy') or DEFAULT_REMEDY}")


class LossWatch:
    """Told what LossTally found so far, as often as progress comes (a host may see only some
    steps' progress); gives the warning line the first time it is a step, else None."""

    def __init__(self) -> None:
        self.warned = False

    def see(self, found: Optional[dict]) -> Optional[str]:
        if self.warned or not found:
            return None
        self.warned = True
        return nonfinite_loss_warning(found)
