"""The instruction loop: a plan's `compute`, `free`, `page_out`, `page_in`, one handler each.

Values live in a `StepRunner` (capture/replay.py), keyed by the planner node that produced them;
paged-out values live in page stores keyed by (node id, value name). The interpreter checks
nothing the simulator already checked before the run (inputs resident, pages present); what it
adds is what only a real run can hit: out of memory, a full or damaged page store.

With `overlap` (the plan's trace and peak, see paging.py) page-ins are prefetched and
page-outs written behind on an IO thread, as the plan's IO timeline assumes.

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
from ..devices import synchronize
from ..formats import HOME, Graph, Instruction, Node, Stages
from ..pages import PageStore, PageStoreError
from .errors import OOM_REMEDY, InstructionFailed, OutOfMemory, first_line, is_out_of_memory
from .paging import IoFailed, OverlappedPaging


PARTLY_REPLAYED = "partly replayed"


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
    page_out_s: float = 0.0  # overlapped: the IO thread's time writing
    page_in_s: float = 0.0  # overlapped: the IO thread's time reading
    home_read_s: float = 0.0  # overlapped: the IO thread's time reading param nodes from home
    overlapped: bool = False  # paging ran on the IO thread beside compute
    io_wait_s: float = 0.0  # overlapped: time the step waited for the IO thread
    # "measured": the ledger counted this step; "replayed": it ran compiled and the ledger's
    # figures are the measured steps' (ledger_replay.py, compiled_step.py); an accumulating
    # step whose later micro-passes replayed: PARTLY_REPLAYED
    ledger: str = "measured"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Interpreter:
    def __init__(self, runner: StepRunner, graph: Graph, stores: dict[str, PageStore],
                 step_group: Callable[[Node, StepRunner], None] | None = None,
                 overlap: tuple[list[int], int] | None = None, placement: Any = None):
        self.runner, self.graph, self.stores = runner, graph, stores
        self.placement = placement  # the arena executor's hooks (executor/arena.py), or None
        self.step_group = step_group
        self.overlap = overlap  # (the simulator's RAM at each instruction, the plan's peak)
        self.handlers = {"compute": self._compute, "free": self._free,
                         "page_out": self._page_out, "page_in": self._page_in}
        self.counts = StepCounts()
        self.paging: OverlappedPaging | None = None
        # node id -> seconds of its first compute in this step, when set to a dict (node_timing.py):
        # each compute then waits for the device, as the profiler's do
        self.node_times: dict[Any, float] | None = None
        # (node id, its call) -> None, wrapped around each compute when set (a first step's
        # memory meter: profiler/first_step.py)
        self.around_compute: Callable[[Any, Callable[[], None]], None] | None = None
        # the flat index of the instruction where the plan peaks, when set: the ledger's split
        # by class just after it, into `held_at_watch` (the report sets plan and ledger side
        # by side at one moment of the step, not each at its own peak)
        self.watch_at: int | None = None
        self.held_at_watch: dict[str, int] | None = None

    def run(self, stages: Stages) -> StepCounts:
        self.counts = StepCounts(overlapped=self.overlap is not None)
        if self.overlap is not None:
            self.paging = OverlappedPaging(self.runner, self.graph, self.stores, self.counts,
                                           *self.overlap)
        index = 0
        try:
            for s, stage in enumerate(stages):
                for k, ins in enumerate(stage):
                    try:
                        if self.paging is not None:
                            self.paging.before(index, ins)
                        if self.placement is None:
                            self.handlers[ins.op](ins, (s, k, ins))
                        else:
                            self._placed(index, ins, (s, k, ins))
                    except IoFailed as failed:
                        raise self._explain(failed.error, *failed.where) from failed.error
                    except Exception as error:  # noqa: BLE001 - each becomes one clear line
                        raise self._explain(error, s, k, ins) from error
                    if index == self.watch_at and self.runner.ledger is not None:
                        self.held_at_watch = dict(self.runner.ledger.live_by_class)
                    index += 1
            if self.paging is not None:
                try:
                    self.paging.drain()
                except IoFailed as failed:
                    raise self._explain(failed.error, *failed.where) from failed.error
        finally:
            if self.paging is not None:
                self.paging.close()
                self.paging = None
        return self.counts

    def _placed(self, t: int, ins: Instruction, where: tuple) -> None:
        self.placement.before(t, ins)
        try:
            self.handlers[ins.op](ins, where)
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

    def _compute(self, ins: Instruction, where=None) -> None:
        node = self.graph.node(ins.node)
        if self.paging is not None:
            self.paging.inputs_ready(ins.node)
        if node.kind == "update" and self.step_group is None:
            return  # the optimizer steps after the last instruction
        start = time.perf_counter()
        if self.around_compute is None:
            self._call(node)
        else:
            self.around_compute(ins.node, lambda: self._call(node))
        if self.node_times is not None:
            synchronize(self.runner.device)
        elapsed = time.perf_counter() - start
        self.counts.computes += 1
        if self.runner.runs[ins.node] > 1:
            self.counts.recomputed += 1
            self.counts.recompute_s += elapsed
        else:
            self.counts.compute_s += elapsed
            if self.node_times is not None:
                self.node_times[ins.node] = elapsed

    def _call(self, node: Node) -> None:
        if node.kind != "update":
            self.runner.compute(node.id)
        else:
            self.runner.runs[node.id] = self.runner.runs.get(node.id, 0) + 1
            self.step_group(node, self.runner)

    def _free(self, ins: Instruction, where=None) -> None:
        self.runner.free(ins.node)

    def _page_out(self, ins: Instruction, where=None) -> None:
        if self.paging is not None:
            self.paging.page_out(ins, where)
            return
        store = self.stores[ins.tier]
        start = time.perf_counter()
        unwritten = []
        for name, value in self.runner.outputs(ins.node).items():
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"its output {name} is a {type(value).__name__}, not a tensor: "
                                "it cannot be paged")
            key = (ins.node, name)
            if key not in store:  # values are immutable within a step: the page still holds it
                unwritten.append((key, value))
            self.counts.paged_bytes += value.untyped_storage().nbytes()
        if unwritten:
            store.put_many(unwritten)  # at once (flash: one file)
            self.counts.pages_written += len(unwritten)
        self.runner.free(ins.node)
        self.counts.page_outs += 1
        self.counts.page_out_s += time.perf_counter() - start

    def _page_in(self, ins: Instruction, where=None) -> None:
        if ins.tier == HOME:  # a param node's read from its parameters' home
            if self.paging is not None:
                self.paging.read_home(ins, where)
            else:
                self._compute(ins, where)
            return
        if self.paging is not None:
            self.paging.page_in(ins, where)
            return
        store = self.stores[ins.tier]
        start = time.perf_counter()
        names = self.graph.node(ins.node).attrs["outputs"]
        values = dict(zip(names, store.get_many([(ins.node, name) for name in names])))
        self.runner.restore_outputs(ins.node, values)
        self.counts.paged_bytes += sum(v.untyped_storage().nbytes() for v in values.values())
        self.counts.page_ins += 1
        self.counts.page_in_s += time.perf_counter() - start
