"""One training step: as the plan says (PlannedStep), or plain eager PyTorch (plain_step).

A planned step binds the batch, runs the plan's instructions, hands the gradients to the
optimizer (assigned, not accumulated), steps it, applies the batch-norm statistics from each
node's first run (once), and drops every value of the step and every page. In a fused graph
the update nodes among the instructions step the optimizer group by group (updates.py), and
nothing is left to do after them.

The ledger's fixed part follows the graph's `fixed_bytes`: parameters, buffers and the batch as
the tensors they are; gradients at their full size for the whole step (a trainer's .grad
buffers; the runner does not count gradient values again); optimizer state as its real tensors
once the optimizer has made them, and at the size the graph assumes before that; an
accumulating step's gradient sums as their real tensors (accumulation.GradientBuffers).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields
from typing import Callable, Iterable

import torch
from torch import nn

from ..accumulation import GradientBuffers, mean_loss, scaled
from ..capture.replay import StepRunner
from ..devices import synchronize
from ..formats import Graph, Plan
from ..grad_clip import clip_all
from ..pages import PageStore
from ..profiler.first_step import FirstStepMemory
from .compiled_step import CompiledStep, FailedAt, compile_step
from .errors import OOM_REMEDY, ExecutorError, first_line, is_out_of_memory
from .interpreter import PARTLY_REPLAYED, Interpreter, StepCounts
from .ledger_replay import LedgerReplay
from .node_timing import NodeTimes
from .updates import FusedUpdates

GradientCheck = Callable[[torch.Tensor, dict[str, torch.Tensor]], None]


@dataclass
class StepResult:
    loss: float
    counts: StepCounts


class FixedMemory:
    """Registers what the graph counts as fixed memory (besides parameters, buffers and the
    batch, which the runner binds) in the ledger, and keeps it registered across steps."""

    GRADIENTS = ("fixed", "gradients")
    STATE_PENDING = ("fixed", "optimizer_state (not yet made)")

    def __init__(self, ledger, module: nn.Module,
                 optimizer: torch.optim.Optimizer | FusedUpdates, graph: Graph):
        self.ledger, self.optimizer = ledger, optimizer
        if not isinstance(optimizer, FusedUpdates):  # fused: gradients are node outputs
            trainable = {id(p): p for p in module.parameters() if p.requires_grad}
            ledger.register(self.GRADIENTS, sum(p.numel() * p.element_size()
                                                for p in trainable.values()))
        ledger.register(self.STATE_PENDING,
                        int(graph.capture.get("fixed", {}).get("optimizer_state", 0)))
        self._state_keys: list[tuple] = []
        self.sync()

    def sync(self) -> None:
        """Count the optimizer's state tensors once they exist (after its first step)."""
        if self._state_keys:
            return
        if isinstance(self.optimizer, FusedUpdates):
            tensors = self.optimizer.state_tensors()  # RAM-homed groups' state only
        else:
            tensors = [t for state in self.optimizer.state.values() for t in state.values()
                       if isinstance(t, torch.Tensor)]
        if not tensors:
            return
        self.ledger.unregister(self.STATE_PENDING)
        for i, tensor in enumerate(tensors):
            key = ("fixed", "optimizer_state", i)
            self.ledger.register_tensor(key, tensor)
            self._state_keys.append(key)


class PlannedStep:
    def __init__(self, runner: StepRunner, graph: Graph, plan: Plan, module: nn.Module,
                 optimizer: torch.optim.Optimizer | FusedUpdates,
                 stores: dict[str, PageStore], ledger,
                 overlap: tuple[list[int], int] | None = None, placement=None,
                 sums: GradientBuffers | None = None, time_nodes: int = 0):
        """`overlap`: (the simulator's RAM at each instruction, the plan's peak) to page on an
        IO thread beside compute (executor/paging.py); None pages synchronously. `placement`:
        the arena executor's hooks (executor/arena.py); None leaves tensors to the allocator.
        `sums`: the gradient sums of an accumulating graph's micro-passes (the optimizer's,
        when fused), stepped by `run_accumulated`. `time_nodes`: how many steps after the first
        to time node by node (node_timing.py; the run sets `timing` for each of them)."""
        self.runner, self.graph, self.plan = runner, graph, plan
        self.sums = sums
        self.module, self.optimizer, self.stores = module, optimizer, stores
        self.fused = isinstance(optimizer, FusedUpdates)
        self.interpreter = Interpreter(runner, graph, stores,
                                       optimizer.step if self.fused else None, overlap,
                                       placement)
        self.params = dict(module.named_parameters(remove_duplicate=False))
        self.fixed = FixedMemory(ledger, module, optimizer, graph)
        # Steps whose ledger figures are known run as one compiled function (compiled_step.py);
        # not with paging on an IO thread or the arena's hooks. While accumulating, each kind
        # of micro-pass has figures of its own (_replay).
        self.ledger = ledger
        self.replays: dict[str, LedgerReplay] | None = \
            {} if ledger is not None and overlap is None and placement is None else None
        self.compiled: CompiledStep | None = None
        self.compiled_tried = False
        # Set by the run for the steps whose nodes it times (node_timing.py): they run
        # interpreted, each compute waited for, into `node_times`.
        self.timing = False
        self.node_times = NodeTimes(time_nodes)
        # Set by the run for its first step when it measures what that step leaves
        # (profiler/first_step.py): around each node's call.
        self.first_step: FirstStepMemory | None = None
        # a "step" graph's one update node: the optimizer's step after the instructions
        self.update_node = next((n.id for n in graph.nodes if n.kind == "update"), None)

    def _step_optimizer(self) -> None:
        """A "step" graph's one optimizer step after the backward."""
        for name, grad in self._gradients().items():
            self.params[name].grad = grad
        try:
            clip = self.graph.capture.get("clip_grad_norm")
            if clip is not None:  # in place, as plain training's (the check has run)
                clip_all(self.module.parameters(), clip)
            self.optimizer.step()
        except Exception as error:
            if is_out_of_memory(error):
                raise ExecutorError(f"out of memory in the optimizer step "
                                    f"({first_line(error)}). Remedy: {OOM_REMEDY}") from error
            raise
        self.optimizer.zero_grad(set_to_none=True)

    def _gradients(self) -> dict[str, torch.Tensor]:
        """The gradients the optimizer steps with: this pass's, or the micro-passes' sums."""
        return self.runner.grads if self.sums is None else self.sums.for_check()

    def run_accumulated(self, batches: Iterable[tuple],
                        check: GradientCheck | None = None) -> StepResult:
        """One optimizer step over the K micro-batches of an accumulating graph: the plan once
        per micro-batch, the gradients summed, the optimizer stepping in the last pass, and
        the check (of the sums) there too. Its loss is the micro-batches' mean."""
        results = []
        try:
            for index, batch in enumerate(batches):
                self.sums.start(index)
                self.sums.checked = check is not None and self.sums.last
                results.append(self.run(batch, check if self.sums.last else None))
        finally:
            self.sums.clear()
        counts = StepCounts()
        for field in fields(StepCounts):
            values = [getattr(r.counts, field.name) for r in results]
            setattr(counts, field.name, sum(values) if isinstance(values[0], (int, float))
                    and not isinstance(values[0], bool) else values[-1])
        kinds = {r.counts.ledger for r in results}  # the first pass is always measured
        counts.ledger = kinds.pop() if len(kinds) == 1 else PARTLY_REPLAYED
        return StepResult(mean_loss([r.loss for r in results]), counts)

    def _replay(self) -> LedgerReplay | None:
        """The ledger figures of the pass about to run, where they can be replayed: the
        step's; while accumulating, a middle micro-pass's or the last one's (which steps the
        optimizer). The first micro-pass makes the sums, so the ledger never ends it where it
        began: it is always measured."""
        if self.replays is None:
            return None
        if self.sums is None:
            kind = "step"
        elif self.sums.index == 0:
            return None
        else:
            kind = "last" if self.sums.last else "middle"
        if kind not in self.replays:  # made once, not on every pass
            self.replays[kind] = LedgerReplay(self.ledger)
        return self.replays[kind]

    def run(self, batch: tuple, check: GradientCheck | None = None) -> StepResult:
        replay = self._replay()
        if check is None and not self.timing and replay is not None and replay.ready(batch):
            compiled = self._compiled()
            if compiled is not None:
                return self._run_compiled(compiled, batch, replay)
        mark = None
        if replay is not None:
            # What the runner bound when it was made goes first (start_step would let it go
            # anyway): a window must end where it starts.
            self.runner.release_all()
            mark = replay.open()
        done = False
        try:
            result = self._run_measured(batch, check)
            done = True
        finally:
            if mark is not None:
                replay.close(mark, batch if done and check is None else None)
        if mark is not None and replay.agrees():
            self._compiled()  # made here, in the last measured step, not in the first replayed
        self.fixed.sync()
        return result

    def _run_measured(self, batch: tuple, check: GradientCheck | None) -> StepResult:
        self.runner.start_step(self.module, batch)
        # A fused step keeps its gradients only for the check (they cost a plain step's worth);
        # an accumulating one has the sums for it.
        self.runner.keep_grads = not self.fused or (check is not None and self.sums is None)
        times = self.interpreter.node_times = {} if self.timing else None
        self.interpreter.around_compute = None if self.first_step is None \
            else self.first_step.around
        try:
            with torch.no_grad():  # once for the step, not per node (the runner checks)
                counts = self.interpreter.run(self.plan.stages)
            loss = self.runner.loss
            if loss is None:
                raise ExecutorError("the plan never computed the loss node")
            if self.sums is not None and not self.fused:
                self._sum_gradients()
            if check is not None:
                check(loss, self._gradients())
            # fused: the update nodes among the instructions stepped (in the last micro-pass)
            if not self.fused and (self.sums is None or self.sums.last):
                start = time.perf_counter()
                if self.first_step is None or self.update_node is None:
                    self._step_optimizer()
                else:
                    self.first_step.around(self.update_node, self._step_optimizer)
                if times is not None and self.update_node is not None:
                    synchronize(self.runner.device)
                    times[self.update_node] = time.perf_counter() - start
            self.runner.apply_buffer_updates(self.module)  # each micro-pass's, as eager's
            value = float(loss)
            if times is not None:
                self.node_times.add(times)
        finally:
            self.interpreter.node_times = self.interpreter.around_compute = None
            self.runner.release_all()
            for store in self.stores.values():
                store.clear()
        return StepResult(value, counts)

    def _sum_gradients(self) -> None:
        """A "step" graph's micro-pass adds its gradients into the sums (a fused graph's
        update nodes add theirs)."""
        for name, grad in self.runner.grads.items():
            self.sums.add(name, grad)

    def _compiled(self) -> CompiledStep | None:
        if not self.compiled_tried:
            self.compiled_tried = True
            self.compiled = compile_step(self.runner, self.graph, self.plan.stages,
                                         self.optimizer.step if self.fused else None)
        return self.compiled

    def _run_compiled(self, compiled: CompiledStep, batch: tuple,
                      replay: LedgerReplay) -> StepResult:
        """The step (or micro-pass) as the measured ones ran it, with nothing counted: the
        ledger gets the measured ones' rise instead (ledger_replay.py)."""
        runner, ledger = self.runner, self.runner.ledger
        runner.ledger = None  # bound inputs are held without registering them
        runner.keep_grads = not self.fused
        try:
            runner.start_step(self.module, batch)
            try:
                with torch.no_grad():
                    out = compiled.run(runner.env)
            except FailedAt as failed:
                raise self.interpreter._explain(failed.error, *failed.where) from failed.error
            runner.env.update(out.resident)  # to the step's end, as the interpreter keeps them
            runner.grads, runner.buffer_updates, runner.loss = \
                out.grads, out.buffer_updates, out.loss
            if out.loss is None:
                raise ExecutorError("the plan never computed the loss node")
            if not self.fused:  # fused: the update nodes among the instructions stepped
                if self.sums is not None:
                    self._sum_gradients()
                if self.sums is None or self.sums.last:
                    self._step_optimizer()
            runner.apply_buffer_updates(self.module)
            value = float(out.loss)
        finally:
            runner.release_all()
            runner.ledger = ledger
            for store in self.stores.values():
                store.clear()
        replay.replay()
        self.fixed.sync()
        return StepResult(value, StepCounts(computes=out.computes, recomputed=out.recomputed,
                                            compute_s=out.compute_s,
                                            recompute_s=out.recompute_s, ledger="replayed"))


def eager_forward_backward(module: nn.Module, batch: tuple, micro_batches: int = 1
                           ) -> torch.Tensor:
    """Plain PyTorch: the loss, with every trainable parameter's .grad filled in (added to,
    when it holds earlier micro-batches' gradients: the loss is divided by their number)."""
    loss = module(*batch)
    scaled(loss, micro_batches).backward()
    return loss.detach()


def plain_step(module: nn.Module, optimizer: torch.optim.Optimizer, batch: tuple,
               *more: tuple, clip_grad_norm: float | None = None) -> float:
    """One plain eager training step (what a `--plain` run does, and what the plan must
    match); with `more` batches, over all of them with gradient accumulation: each loss
    divided by their number, one optimizer step. The loss: the batches' mean. With
    `clip_grad_norm`, torch.nn.utils.clip_grad_norm_ of the summed gradients before the
    optimizer's step."""
    batches = (batch, *more)
    optimizer.zero_grad(set_to_none=True)
    losses = [float(eager_forward_backward(module, b, len(batches))) for b in batches]
    if clip_grad_norm is not None:
        clip_all(module.parameters(), clip_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return mean_loss(losses)
