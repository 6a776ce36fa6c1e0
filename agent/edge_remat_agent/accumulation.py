"""Gradient accumulation: one optimizer step over K micro-batches (`--accumulate K`).

Each micro-batch's loss is divided by K before its backward (as HF Trainer and the usual
PyTorch loop do: `(loss / K).backward()`), the K gradients are summed into `.grad`-like buffers
in the order eager autograd sums them, and the optimizer steps once. A captured graph stands
for one micro-pass: its d(loss)/d(loss) is fed with `ones / K` (the very division eager's
DivBackward does), and the buffers are fixed memory for the whole step
(`fixed["gradient_accumulators"]`, the trainable parameters' gradient bytes), planned as
resident: they live across the micro-passes as optimizer state lives across steps.
Standard library and torch only (plain training, the executor and the capture share it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

ACCUMULATE_KEY = "accumulate"  # graph.capture's key; absent (= 1) for graphs without it


def micro_batches_of(graph: Any) -> int:
    """How many micro-batches one optimizer step of this graph consumes."""
    return int((getattr(graph, "capture", None) or {}).get(ACCUMULATE_KEY, 1))


def check_micro_batches(k: Any) -> int:
    """K as an int of at least 1; anything else is a ValueError saying what to give."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"--accumulate must be a whole number of micro-batches of at least 1 "
                         f"(1: no accumulation), not {k!r}")
    return k


def scaled(loss, k: int):
    """What a micro-batch's backward starts from: the loss divided by K (the loss itself at
    K = 1, so that plain training without accumulation is untouched)."""
    return loss / k if k > 1 else loss


def mean_loss(losses: list[float]) -> float:
    """A step's loss: the mean of its micro-batches' losses (the loss itself at K = 1)."""
    return losses[0] if len(losses) == 1 else sum(losses) / len(losses)


class GradientBuffers:
    """The summed gradients of one optimizer step, by parameter name. The first micro-pass's
    gradient is copied in (a value the step frees or another parameter shares is never
    written into); later ones are added in place, as eager's AccumulateGrad adds into `.grad`:
    bit for bit `g1 + g2 + ... + gK` in that order. `ledger`: the executor's live-tensor
    ledger, which counts each sum while it is in RAM: from its first pass to the step's end,
    or, for a group homed on a tier, while its update node runs (bring, send)."""

    KEY = ("fixed", "gradient_accumulators")  # the ledger's key prefix (memory_classes)

    def __init__(self, k: int, ledger: Any = None):
        self.k = check_micro_batches(k)
        self.ledger = ledger
        self.index = 0  # the micro-pass running, from 0
        self.sums: dict[str, Any] = {}  # the sums in RAM
        self._added: set[str] = set()  # the names added in the running pass
        # Sums a homed group's update node wrote to its home (capture/state.py), by name: a
        # function that reads one back. Set where the update node sends them.
        self.away: dict[str, Callable[[], Any]] = {}
        self.checked = False  # whether the step's gradients are checked after its last pass

    def start(self, index: int) -> None:
        if index == 0:
            self.clear()
        self.index = index
        self._added = set()

    @property
    def last(self) -> bool:
        """Whether the running micro-pass is the step's last: the optimizer steps in it."""
        return self.index == self.k - 1

    def add(self, name: str, grad) -> None:
        """Adds the running pass's gradient once (clipping's norm node adds it before the
        update node that would)."""
        if name in self._added:
            return
        self._added.add(name)
        total = self.sums.get(name)
        if total is None:
            self.sums[name] = total = grad.detach().clone()
            if self.ledger is not None:
                self.ledger.register_tensor((*self.KEY, name), total)
        else:
            total.add_(grad)

    def bring(self, name: str, value) -> None:
        """A sum read back from its home, for the running pass to add into."""
        self.away.pop(name, None)
        self.sums[name] = value
        if self.ledger is not None:
            self.ledger.register_tensor((*self.KEY, name), value)

    def send(self, name: str, read_back: Callable[[], Any] | None) -> None:
        """The sum out of RAM: written to its home (`read_back` reads it again), or done with
        (None) after the last pass's update."""
        self.sums.pop(name)
        if self.ledger is not None:
            self.ledger.unregister((*self.KEY, name))
        if read_back is not None:
            self.away[name] = read_back

    def for_check(self) -> Mapping[str, Any]:
        """Every sum by name, those at a home read back one at a time as the check asks."""
        return _SumsForCheck(self.sums, self.away)

    def clear(self) -> None:
        if self.ledger is not None:
            for name in self.sums:
                self.ledger.unregister((*self.KEY, name))
        self.sums = {}
        self.away = {}
        self.checked = False


class _SumsForCheck(Mapping):
    def __init__(self, held: dict[str, Any], away: dict[str, Callable[[], Any]]):
        self.held, self.away = held, away

    def __getitem__(self, name: str):
        return self.held[name] if name in self.held else self.away[name]()

    def __iter__(self) -> Iterator[str]:
        return iter([*self.held, *self.away])

    def __len__(self) -> int:
        return len(self.held) + len(self.away)
