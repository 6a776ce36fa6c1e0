"""The instruction loop: a plan's `compute`, `free`, `page_out`, `page_in`, one handler each.

Values live in a `StepRunner` (capture/replay.py), keyed by the planner node that produced them;
paged-out values live in page stores keyed by (node id, value name). The interpreter checks
nothing the simulator already checked before the run (inputs resident, pages present); what it
adds is what only a real run can hit: out of memory, a full or damaged page store.

A fused graph's update nodes step their parameter group's optimizer where the plan computes
them (`step_group`, executor/updates.py). A "step" graph's one update node is not run here: the
optimizer steps once the step's instructions are done (step.py), whatever position the plan
gives it.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import torch

from ..capture.replay import StepRunner
from ..formats import Graph, Instruction, Node, Stages
from ..pages import PageStore, PageStoreError
from .errors import OOM_REMEDY, InstructionFailed, OutOfMemory, first_line, is_out_of_memory


@dataclass
class StepCounts:
    """What one step's instructions did, and how long each kind took."""

    computes: int = 0
    recomputed: int = 0  # computes of a node beyond its first in the step
    page_outs: int = 0
    page_ins: int = 0
    pages_written: int = 0  # page_outs that wrote: a page still on its tier is not written again
    paged_bytes: int = 0  # bytes moved by page_outs and page_ins (tensor bytes)
    compute_s: float = 0.0  # first computes
    recompute_s: float = 0.0
    page_out_s: float = 0.0
    page_in_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Interpreter:
    def __init__(self, runner: StepRunner, graph: Graph, stores: dict[str, PageStore],
                 step_group: Callable[[Node, StepRunner], None] | None = None,
                 placement: Any = None):
        self.runner, self.graph, self.stores = runner, graph, stores
        self.placement = placement  # the arena executor's hooks (executor/arena.py), or None
        self.step_group = step_group
        self.handlers = {"compute": self._compute, "free": self._free,
                         "page_out": self._page_out, "page_in": self._page_in}
        self.counts = StepCounts()

    def run(self, stages: Stages) -> StepCounts:
        self.counts = StepCounts()
        t = -1
        for s, stage in enumerate(stages):
            for k, ins in enumerate(stage):
                t += 1
                try:
                    if self.placement is None:
                        self.handlers[ins.op](ins)
                    else:
                        self._placed(t, ins)
                except Exception as error:  # noqa: BLE001 - each becomes one clear line
                    raise self._explain(error, s, k, ins) from error
        return self.counts

    def _placed(self, t: int, ins: Instruction) -> None:
        self.placement.before(t, ins)
        try:
            self.handlers[ins.op](ins)
        except BaseException:
            self.placement.after(ins, failed=True)
            raise
        self.placement.after(ins)

    def _explain(self, error: Exception, s: int, k: int, ins: Instruction) -> Exception:
        if is_out_of_memory(error):
            return OutOfMemory(s, k, ins, self.graph, f"out of memory ({first_line(error)}). "
                               f"Remedy: {OOM_REMEDY}")
        if isinstance(error, PageStoreError):
            return InstructionFailed(s, k, ins, self.graph, str(error))
        return InstructionFailed(s, k, ins, self.graph,
                                 f"{type(error).__name__}: {first_line(error)}")

    def _compute(self, ins: Instruction) -> None:
        node = self.graph.node(ins.node)
        start = time.perf_counter()
        if node.kind != "update":
            self.runner.compute(ins.node)
        elif self.step_group is not None:
            self.runner.runs[ins.node] = self.runner.runs.get(ins.node, 0) + 1
            self.step_group(node, self.runner)
        else:
            return  # the optimizer steps after the last instruction
        elapsed = time.perf_counter() - start
        self.counts.computes += 1
        if self.runner.runs[ins.node] > 1:
            self.counts.recomputed += 1
            self.counts.recompute_s += elapsed
        else:
            self.counts.compute_s += elapsed

    def _free(self, ins: Instruction) -> None:
        self.runner.free(ins.node)

    def _page_out(self, ins: Instruction) -> None:
        store = self.stores[ins.tier]
        start = time.perf_counter()
        for name, value in self.runner.outputs(ins.node).items():
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"its output {name} is a {type(value).__name__}, not a tensor: "
                                "it cannot be paged")
            key = (ins.node, name)
            if key not in store:  # values are immutable within a step: the page still holds it
                store.put(key, value)
                self.counts.pages_written += 1
            self.counts.paged_bytes += value.untyped_storage().nbytes()
        self.runner.free(ins.node)
        self.counts.page_outs += 1
        self.counts.page_out_s += time.perf_counter() - start

    def _page_in(self, ins: Instruction) -> None:
        store = self.stores[ins.tier]
        start = time.perf_counter()
        names = self.graph.node(ins.node).attrs["outputs"]
        values = {name: store.get((ins.node, name)) for name in names}
        self.runner.restore_outputs(ins.node, values)
        self.counts.paged_bytes += sum(v.untyped_storage().nbytes() for v in values.values())
        self.counts.page_ins += 1
        self.counts.page_in_s += time.perf_counter() - start
