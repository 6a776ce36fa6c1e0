"""The ledger's figures for a plan's step, measured, then replayed on the steps that follow.

Each step of a plan registers and unregisters the same tensors in the same order: the plan,
the graph's shapes and the ops fix every value's bytes and which values share a storage. So
the step's peak above what was live when it started (in all, by class, and the key that set
it) is the same every step: measured twice in a row with the same batch layout and the ledger
back where it started after each, it is laid on the ledger for later steps, which then count
nothing themselves (compiled_step.py runs them). The fixed memory registered between steps
(the optimizer's state) is outside the window: the rise sits on whatever is live then.

Any step that differs (another batch layout, a gradient check) is measured again, and a
measured step that does not agree starts the count over.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils import _pytree

from ..profiler import LiveTensorLedger
from ..profiler.memory import LedgerRise

AGREE = 2  # measured steps in a row with the same rise before it is replayed


class LedgerReplay:
    def __init__(self, ledger: LiveTensorLedger):
        self.ledger = ledger
        self.rise: LedgerRise | None = None
        self.layout: Any = None
        self.agreed = 0

    def agrees(self) -> bool:
        """Enough measured steps agree: the next step with their batch layout replays."""
        return self.agreed >= AGREE

    def ready(self, batch: tuple) -> bool:
        return self.agrees() and batch_layout(batch) == self.layout

    def open(self) -> tuple:
        return self.ledger.open_window()

    def close(self, mark: tuple, batch: tuple | None) -> None:
        """After a measured step (`batch` None: it failed, nothing is learnt from it)."""
        rise = self.ledger.rise_since(mark)
        if batch is None or rise is None:
            self.rise, self.agreed = None, 0
            return
        layout = batch_layout(batch)
        if rise == self.rise and layout == self.layout:
            self.agreed += 1
        else:
            self.rise, self.layout, self.agreed = rise, layout, 1

    def replay(self) -> None:
        self.ledger.raise_peak(self.rise)


def batch_layout(batch: tuple) -> tuple:
    """What the step's bytes depend on in a batch: each tensor's shape, strides, dtype and
    device (other leaves by type and value)."""
    leaves, spec = _pytree.tree_flatten(batch)
    return (str(spec),) + tuple(
        (tuple(x.shape), x.stride(), x.dtype, x.device.type) if isinstance(x, torch.Tensor)
        else (type(x).__name__, repr(x)) for x in leaves)
