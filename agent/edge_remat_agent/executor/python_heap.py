"""Keep Python's cyclic garbage collector off what a run set up, while its steps are timed.

Every tensor a planned step makes is a Python object that the collector tracks (eager PyTorch's
saved tensors live in C++ autograd and are not), so a step starts several young collections, and
each older collection also walks everything the run set up: the captured trace's fx nodes, the
plan, the runner's resolved ops, hundreds of thousands of objects. Measured on bert-mini
(benchmarks/end_to_end.py --quick sizes, the keep-all plan): 21 ms of collection inside the two
timed steps of a run, one gen-2 pass in ten runs, against 0.02 ms for eager's steps.

gc.freeze() moves every object alive into the permanent generation, which no collection walks.
It is done before the first step (after a young collection, so that set-up garbage is freed, not
kept) and once more before the second (the runner resolves each node's ops on its first run);
after the last step gc.unfreeze() hands them back, so garbage among them is still found later.
A caller that froze objects itself is left as it is.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Callable, Iterator

FROZEN_STEPS = 2  # freezes before steps 0 and 1: what set-up and the first step made


@contextmanager
def set_up_frozen() -> Iterator[Callable[[int], None]]:
    """`with set_up_frozen() as before_step:` then `before_step(i)` before step i."""
    owned = gc.get_freeze_count() == 0 and gc.isenabled()

    def before_step(i: int) -> None:
        if owned and i < FROZEN_STEPS:
            gc.collect(1)
            gc.freeze()
    try:
        yield before_step
    finally:
        if owned:
            gc.unfreeze()
