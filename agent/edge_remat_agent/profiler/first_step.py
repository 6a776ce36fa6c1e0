"""What a process's first step of a graph leaves in its anonymous resident memory for good.

The ops' first calls keep memory for the life of the process (oneDNN's primitives and their
scratch, kernel caches, the runner's prepared ops): fixed memory a run pays from its first step
on, beyond the runtime baseline taken before it. Measured around the first step, beyond the
optimizer state the step made, and split over the nodes in proportion to the rise each call
left beyond the tensors the runner then holds, so that the shares add up to the whole. The
profiler measures it in a plain step (ops.first_step_memory); a planned run in its own first
step (executor/node_timing.py), where a board has no room for a plain one.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from ..capture.replay import StepRunner
from ..executor.updates import FusedUpdates
from .memory import anonymous_resident_bytes


class FirstStepMemory:
    """Made just before the step (before its batch is bound); `around` each node's call;
    `shares()` once the step has let go of its values."""

    def __init__(self, runner: StepRunner, optimizer: torch.optim.Optimizer | FusedUpdates):
        self.runner, self.optimizer = runner, optimizer
        self.start = anonymous_resident_bytes()
        self.made_before = state_bytes(optimizer)
        self.rises: dict[Any, int] = {}

    @property
    def supported(self) -> bool:
        """False off Linux (no RssAnon)."""
        return self.start is not None

    def around(self, node_id: Any, call: Callable[[], None]) -> None:
        runner, optimizer = self.runner, self.optimizer
        before, held, made = anonymous_resident_bytes(), held_bytes(runner), \
            state_bytes(optimizer)
        call()
        rise = max(0, anonymous_resident_bytes() - before - (held_bytes(runner) - held)
                   - (state_bytes(optimizer) - made))
        self.rises[node_id] = self.rises.get(node_id, 0) + rise  # recomputed: summed

    def shares(self) -> dict[Any, int] | None:
        """Node id -> its share of what the step left; None off Linux."""
        if self.start is None:
            return None
        left = max(0, anonymous_resident_bytes() - self.start
                   - (state_bytes(self.optimizer) - self.made_before))
        return split_in_proportion(left, self.rises)


def split_in_proportion(total: int, weights: dict[Any, int]) -> dict[Any, int]:
    """`total` in whole bytes over the keys of `weights`, in proportion to them (largest
    remainders), adding up to it exactly; all to the first key where every weight is 0."""
    if not weights:
        return {}
    whole = sum(weights.values())
    if whole <= 0:
        first = next(iter(weights))
        return {key: total if key == first else 0 for key in weights}
    shares = {key: total * w // whole for key, w in weights.items()}
    short = total - sum(shares.values())
    for key in sorted(weights, key=lambda k: -(total * weights[k] % whole))[:short]:
        shares[key] += 1
    return shares


def held_bytes(runner: StepRunner) -> int:
    """The tensors the runner holds: its ledger's, and a "step" graph's gradients (kept
    outside it to the optimizer's step)."""
    grads = 0 if runner.fused else storage_bytes(runner.grads.values())
    return (runner.ledger.live_bytes if runner.ledger is not None else 0) + grads


def state_bytes(optimizer: torch.optim.Optimizer | FusedUpdates) -> int:
    """Bytes of the optimizer state in RAM (momenta, Adam's moments)."""
    if isinstance(optimizer, FusedUpdates):
        return storage_bytes(optimizer.state_tensors())
    return storage_bytes(t for state in optimizer.state.values() for t in state.values())


def storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind `tensors` (non-tensors skipped)."""
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for t in tensors if isinstance(t, torch.Tensor)}.values())
