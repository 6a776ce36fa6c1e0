"""Learning-rate schedules: a linear warmup, then constant, linear or cosine decay.

The factor of step k (from 0) of a run of N steps with W warmup steps, as Hugging Face
transformers' schedules define it (what fine-tuners expect):
    warmup    k < W: k / W   (the first step's learning rate is 0)
    constant  1
    linear    max(0, (N - k) / max(1, N - W))
    cosine    0.5 * (1 + cos(pi * (k - W) / max(1, N - W)))
Each step's learning rate is base * factor(k), the one multiplication
torch.optim.lr_scheduler.LambdaLR makes with the same function: plain training and the planned
executor set it the same way on every optimizer they step (a fused graph has one per update
node), so both take the same steps bit for bit.
"""

from __future__ import annotations

import math
from typing import Callable

# The most steps a run (deploy, run, the board's run and train-plain jobs) takes: ten million.
# QA: `deploy --steps 99999999999999999999` (beyond 2^64) was taken and trained forever at 0%;
# a run's report keeps a record of every step, so a count near this is already a lot.
MAX_STEPS = 10_000_000


def steps_refusal(steps: int, option: str = "--steps") -> "str | None":
    """Why `steps` is no number of steps to train (None: it is one)."""
    if steps < 1:
        return f"{option} must be at least 1, not {steps}"
    if steps > MAX_STEPS:
        return (f"{option} {steps} is more than {MAX_STEPS:,} steps, the most a run takes: "
                "give fewer steps")
    return None

SCHEDULES = ("constant", "linear", "cosine")


def check_schedule(schedule: str, warmup: int, steps: int) -> None:
    """ValueError with one line naming the option and its remedy."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown --lr-schedule {schedule!r}: use one of {', '.join(SCHEDULES)}")
    if warmup < 0:
        raise ValueError(f"--warmup must be 0 or more steps, not {warmup}")
    if warmup > steps:
        raise ValueError(f"--warmup {warmup} is longer than the run's {steps} steps: the "
                         "learning rate would never reach --lr; give a warmup of at most "
                         "--steps")


def lr_factor(schedule: str, warmup: int, steps: int) -> Callable[[int], float]:
    """step -> the factor of the base learning rate (LambdaLR's lr_lambda)."""
    check_schedule(schedule, warmup, steps)
    decay_steps = max(1, steps - warmup)

    def factor(step: int) -> float:
        if step < warmup:
            return float(step) / float(max(1, warmup))
        if schedule == "linear":
            return max(0.0, float(steps - step) / float(decay_steps))
        if schedule == "cosine":
            progress = float(step - warmup) / float(decay_steps)
            return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))
        return 1.0
    return factor


class ScheduledLr:
    """Sets every param group's learning rate before each step: its learning rate when the
    schedule started, times the factor of that step."""

    def __init__(self, optimizers: list, schedule: str = "constant", warmup: int = 0,
                 steps: int = 1):
        self.factor = lr_factor(schedule, warmup, steps)
        self.constant = schedule == "constant" and warmup == 0  # nothing to set
        self.groups = [(group, group["lr"]) for opt in optimizers for group in opt.param_groups]

    def at(self, step: int) -> None:
        if self.constant:
            return
        factor = self.factor(step)
        for group, base in self.groups:
            group["lr"] = base * factor


# The base learning rate by step, where --lr changed on a --resume: [{"from_step": 1, "lr":
# 0.1}, {"from_step": 5, "lr": 0.01}] (steps from 1). A checkpoint keeps it (its meta's
# "lr_history"), and a run report's optimizer says it where it changed.
def lr_history(earlier: "list | None", first_step: int, lr: float) -> list:
    """The history of a run that trains from `first_step` (from 1) at base rate `lr`, after
    the `earlier` one its checkpoint kept (None: a fresh run, or a checkpoint that kept none)."""
    kept = [dict(entry) for entry in earlier or [] if entry["from_step"] < first_step]
    if not kept or kept[-1]["lr"] != lr:
        kept.append({"from_step": first_step, "lr": lr})
    return kept


def lr_history_text(history: "list | None") -> "str | None":
    """"--lr 0.1 for steps 1-4, 0.01 from step 5"; None where the rate never changed."""
    if not history or len(history) < 2:
        return None
    parts = []
    for entry, after in zip(history, history[1:] + [None]):
        first, lr = entry["from_step"], f"{entry['lr']:g}"
        if after is None:
            parts.append(f"{lr} from step {first}")
        else:
            last = after["from_step"] - 1
            parts.append(f"{lr} for step{'s' if last > first else ''} "
                         f"{first}{f'-{last}' if last > first else ''}")
    return "--lr " + ", ".join(parts)
