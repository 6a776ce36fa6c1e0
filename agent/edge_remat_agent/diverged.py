"""A loss that is not finite (NaN, inf): training diverged, by the model's doing (a learning
rate too large, a forward that divides by a parameter driven to zero), not the plan's. The run
goes on as plain PyTorch's would, but says so once, naming the first such step, and its report
keeps that step and how many steps had one (`nonfinite_loss`); asked to (`stop_on_nonfinite`),
a run stops after the first such step instead. Standard library only: the host reads it too.

The check is the step's loss alone, which every step already reads as a Python float (one
`math.isfinite` a step); the gradients are not scanned (a pass over every gradient a step)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Optional

DEFAULT_REMEDY = ("try a smaller --lr, or look for a division by zero or an overflow in the "
                  "model's forward")
HALF_DTYPES = ("bf16", "fp16")


def is_nonfinite(loss) -> bool:
    """Whether `loss` is a number that is NaN or infinite (a missing one is not)."""
    return isinstance(loss, (int, float)) and not math.isfinite(loss)


class LossTally:
    """Each step's loss, seen once as it comes: the first step whose loss is not finite and
    how many were. `remedy`: what to try, for this run's options (remedy_for's Remedy, or
    its words), kept in what it found; told of the run's checkpoints as they are written
    (`checkpointed`), a Remedy says which one a resume can go on from."""

    def __init__(self, remedy: "Remedy | str | None" = None) -> None:
        self.remedy = remedy
        self.first: Optional[dict] = None
        self.count = 0
        self.checkpoint_step: Optional[int] = None  # the run's newest checkpoint so far
        self._checkpoint_before: Optional[int] = None  # the newest before the first

    def checkpointed(self, step: int) -> None:
        """The run holds a checkpoint after step `step` (written, or resumed from)."""
        self.checkpoint_step = step

    def see(self, step: int, loss) -> bool:
        """Tally step `step`'s loss (steps from 1); whether it is not finite."""
        if not is_nonfinite(loss):
            return False
        self.count += 1
        if self.first is None:
            # as text ("nan", "inf"): strict JSON has neither
            self.first = {"step": step, "loss": str(float(loss))}
            self._checkpoint_before = self.checkpoint_step
        return True

    def see_record(self, step: int, record: dict) -> bool:
        """Tally an executor step record of step `step`: its loss, then the checkpoint written
        after it (`checkpoint_s`), which holds the weights the next step's loss comes from."""
        nonfinite = self.see(step, record.get("loss"))
        if "checkpoint_s" in record:
            self.checkpointed(step)
        return nonfinite

    @property
    def found(self) -> Optional[dict]:
        """{"step": the first step whose loss is not finite, "loss": it as text, "count": how
        many steps' were, "remedy": what to try (where known)}, or None while all are finite."""
        if self.first is None:
            return None
        remedy = self.remedy.words(self.first["step"], self._checkpoint_before) \
            if isinstance(self.remedy, Remedy) else self.remedy
        return {**self.first, "count": self.count, **({"remedy": remedy} if remedy else {})}


def first_nonfinite_loss(losses: Iterable) -> Optional[dict]:
    """LossTally.found of these losses, the first being step 1."""
    tally = LossTally()
    for step, loss in enumerate(losses, start=1):
        tally.see(step, loss)
    return tally.found


def nonfinite_remedy(lr: Optional[float], clip_grad_norm: Optional[float] = None,
                     dtype: Optional[str] = None, trainable_dtype: Optional[str] = None, *,
                     takes_lr: bool = True, resume: Optional[str] = None) -> str:
    """What to try against a loss that went non-finite, among the options this run did not
    take: a smaller learning rate, clipping the gradients, fp32 trained parameters under a
    half-precision model (clipping and the dtypes are capture options: `run` or `graph`).
    `takes_lr`: False for a command that has no --lr (the board's own `run` of a plan: its
    graph's optimizer's own rate). `resume`: the words on going on from a checkpoint with a
    smaller --lr (Remedy.words), said with the learning rate."""
    if not takes_lr:
        tries = ["a smaller learning rate" + (f" (this run's is {lr:g}, its optimizer's own, "
                                              "which this command cannot change: `edge-remat "
                                              "deploy` of the plan takes --lr)" if lr else "")]
    else:
        said = [f"this run's is {lr:g}"] if lr else []
        said += [resume] if resume else []
        tries = ["a smaller --lr" + (f" ({'; '.join(said)})" if said else "")]
    where = "on run or graph" if takes_lr else "on edge-remat graph, then plan again"
    if clip_grad_norm is None:
        tries.append(f"clipping the gradients (--clip-grad-norm 1.0 {where})")
    if dtype in HALF_DTYPES and (trainable_dtype or dtype) != "fp32":
        tries.append(f"training in fp32 rather than {dtype} (--trainable-dtype fp32 with a "
                     f"frozen base, else --dtype fp32; {where})")
    listed = tries[0] if len(tries) == 1 else ", ".join(tries[:-1]) + " or " + tries[-1]
    return (f"try {listed}; else look for a division by zero or an overflow in the model's "
            "forward")


@dataclass(frozen=True)
class Remedy:
    """What to try against a non-finite loss, for a run's options (nonfinite_remedy's), made
    once and handed to whatever tallies the losses (a job's progress, its report). With
    `resume_out` (the run stops at that step and keeps its checkpoints: --stop-on-nonfinite
    with --checkpoint-every or --resume; the folder its --resume names) it also says which
    checkpoint a resume with a smaller --lr (a tenth of this run's) can go on from: step k's
    loss is the forward of the weights after step k-1, so a checkpoint after step k-1 holds
    weights that give it again, and only an earlier one is worth resuming from."""

    lr: Optional[float]
    clip_grad_norm: Optional[float] = None
    dtype: Optional[str] = None
    trainable_dtype: Optional[str] = None
    takes_lr: bool = True
    resume_out: Optional[str] = None

    def words(self, step: Optional[int] = None, checkpoint_step: Optional[int] = None) -> str:
        """What to try where the first non-finite loss is step `step`'s and the run's newest
        checkpoint then is after `checkpoint_step` (None: it has none)."""
        return nonfinite_remedy(self.lr, self.clip_grad_norm, self.dtype, self.trainable_dtype,
                                takes_lr=self.takes_lr,
                                resume=self._resume(step, checkpoint_step))

    def _resume(self, step: Optional[int], checkpoint_step: Optional[int]) -> Optional[str]:
        if not (self.resume_out and self.takes_lr and self.lr and step and checkpoint_step):
            return None  # no checkpoint to go on from: the run again, from its start
        if checkpoint_step >= step - 1:
            return (f"again from the start: the checkpoint after step {checkpoint_step} "
                    f"holds the weights that gave step {step}'s loss, which --resume "
                    f"{self.resume_out} would repeat")
        return (f"the same command with `--resume {self.resume_out} --lr {self.lr / 10:g}` "
                f"goes on from its checkpoint after step {checkpoint_step}")


def remedy_for(capture: dict, lr: Optional[float], *, resume_out: Optional[str] = None,
               takes_lr: bool = True) -> Remedy:
    """The Remedy for a graph captured so (its `capture` record: clipping, dtypes) or, for
    plain training, its params alike; `lr` None: the optimizer's default."""
    if lr is None:
        from .capture import DEFAULT_LR  # light: the capture's torch parts load on first use
        lr = DEFAULT_LR.get(capture.get("optimizer") or "sgd")
    source = capture.get("source") or capture
    return Remedy(lr, capture.get("clip_grad_norm"), source.get("dtype"),
                  source.get("trainable_dtype"), takes_lr, resume_out)


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
