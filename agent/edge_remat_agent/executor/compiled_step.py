"""A whole planned step as one straight-line Python function, for steps the ledger replays.

The interpreter runs a step instruction by instruction: each compute goes through the loop,
the runner's `compute` (its hold counts, the node's kept values passed on by name) and the
node's compiled ops (capture/straight_line.py), and every value the runner holds is counted
in the live-tensor ledger. That Python was most of the executor's own overhead (keep-all
bert-mini: about 1,000 ops, 650 ledger registrations and 140 nodes a step). Once the ledger's
figures for the plan are known (ledger_replay.py: two measured steps that agree), a step has
nothing left to count, and this function runs it: every op of every compute, in the plan's
order, values as local variables, each dropped where the runner drops it (after its last use
inside a node, or at the `free` of its node), so the memory follows the same course.

The semantics are StepRunner's: the same calls with the same arguments in the same order; a
node with `random` replays its generator state on recomputation; gradients, batch-norm
statistics and the loss are taken from a node's first run. A plan this cannot express (page
instructions, an update node the interpreter steps, a value read that is not in memory, a
node computed while its outputs are) gets None from compile_step: it runs as before.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import fx

from ..capture.replay import StepRunner, rng_state, set_rng_state
from ..capture.straight_line import _has_node, _plain_name, _Source
from ..formats import Graph, Instruction, Stages
from .in_place import in_place_operand


class NotCompiled(Exception):
    """The plan asks for something the straight-line step does not do (see the docstring)."""


@dataclass
class StepOutcome:
    loss: Any
    grads: dict[str, torch.Tensor]  # parameter name -> gradient
    buffer_updates: dict[str, torch.Tensor]  # buffer name -> new value
    resident: dict[str, Any]  # values still in memory at the step's end (kept to its end)
    computes: int
    recomputed: int
    compute_s: float
    recompute_s: float


@dataclass
class CompiledStep:
    run_source: Callable[[dict, list], tuple]
    where: list[tuple[int, int, Instruction]]  # instruction index -> (stage, position, it)

    def run(self, env: dict) -> StepOutcome:
        """Run the step on the runner's bound inputs; on an error, FailedAt says where."""
        at = [0]
        try:
            return StepOutcome(*self.run_source(env, at))
        except Exception as error:  # noqa: BLE001 - the caller explains it per instruction
            raise FailedAt(self.where[at[0]], error) from error


class FailedAt(Exception):
    def __init__(self, where: tuple[int, int, Instruction], error: Exception):
        super().__init__(str(error))
        self.where, self.error = where, error


def compile_step(runner: StepRunner, graph: Graph, stages: Stages,
                 step_group: Callable | None = None) -> CompiledStep | None:
    """The plan's step as one function, or None where it needs the interpreter.
    `step_group`: a fused graph's update (the interpreter's, updates.FusedUpdates.step)."""
    if runner.writer is not None or (runner.fused and step_group is None):
        return None
    try:
        return _Generator(runner, graph, step_group).step(stages)
    except NotCompiled:
        return None


class _Generator:
    def __init__(self, runner: StepRunner, graph: Graph, step_group: Callable | None):
        self.runner, self.graph, self.step_group = runner, graph, step_group
        # A fused step's update nodes consume the gradients; a "step" graph's are kept for
        # the optimizer step after the instructions.
        self.keep_grads = not runner.fused
        self.code = _Source()
        self.count = 0  # local variables made
        self.bound = runner.bound_names()  # parameters, buffers, the batch, ...
        self.loaded: dict[str, str] = {}  # a bound input -> the local it is read into
        self.resident: dict[str, str] = {}  # a node output in memory -> its local
        self.runs: dict[Any, int] = {}
        self.random_state: dict[Any, str] = {}  # node -> the local with its generator state
        self.taken: set[tuple[str, str]] = set()  # ("grad"|"buffer"|"loss", name) taken

    def new(self) -> str:
        self.count += 1
        return f"v{self.count}"

    def step(self, stages: Stages) -> CompiledStep:
        self.computed = {}  # node -> its computes in the step
        for ins in (ins for stage in stages for ins in stage if ins.op == "compute"):
            self.computed[ins.node] = self.computed.get(ins.node, 0) + 1
        body: list[str] = []
        where = []
        for s, stage in enumerate(stages):
            for k, ins in enumerate(stage):
                body.append(f"at[0] = {len(where)}")
                where.append((s, k, ins))
                if ins.op == "compute":
                    body += self.compute(ins.node)
                elif ins.op == "free":
                    body += self.free(ins.node)
                else:
                    raise NotCompiled(ins.op)
        resident = ", ".join(f"{self.code.const(n)}: {v}" for n, v in self.resident.items())
        body.append(f"return loss, G, B, {{{resident}}}, {self.computes()}, "
                    f"{self.recomputes()}, cs, rs")
        head = [f"{v} = E[{self.code.const(name)}]" for name, v in self.loaded.items()]
        head += ["G, B, loss, cs, rs = {}, {}, None, 0.0, 0.0"]
        source = "def run(E, at):\n" + "".join(f"    {line}\n" for line in head + body)
        device = self.runner.device
        namespace = dict(self.code.slots, _now=time.perf_counter, _enable_grad=torch.enable_grad,
                         _rng=lambda: rng_state(device),
                         _set_rng=lambda state: set_rng_state(state, device))
        exec(_compiled(source), namespace)  # noqa: S102 - our own source, as fx does
        return CompiledStep(namespace["run"], where)

    def computes(self) -> int:
        return sum(self.runs.values())

    def recomputes(self) -> int:
        return sum(n - 1 for n in self.runs.values())

    # -- instructions ------------------------------------------------------------------------

    def compute(self, node_id) -> list[str]:
        node = self.graph.node(node_id)
        if node.kind == "update":
            return self.update(node)
        if any(name in self.resident for name in node.attrs["outputs"]):
            raise NotCompiled(f"node {node_id} computed while its outputs are in memory")
        first = node_id not in self.runs
        self.runs[node_id] = self.runs.get(node_id, 0) + 1
        lines = ["t0 = _now()"]
        if node.kind == "param":
            variables = [self.new() for _ in node.attrs["outputs"]]
            self.resident.update(zip(node.attrs["outputs"], variables))
            if variables:
                lines.append(f"{', '.join(variables)}, = "
                             f"{self.code.const(self.runner.load_parameters)}"
                             f"({self.code.const(list(node.attrs['params']))})")
        else:
            lines += self.node_ops(node_id, first)
        lines.append(f"{'cs' if first else 'rs'} += _now() - t0")
        return lines

    def update(self, node) -> list[str]:
        """A fused graph's update node steps its group's optimizer with the gradients in
        memory (handed over in the runner's env, where FusedUpdates.step reads them); a
        "step" graph's optimizer steps after the instructions (step.py)."""
        if self.step_group is None:
            return []
        if "home" in node.attrs:  # its state is loaded into the ledger by the update itself
            raise NotCompiled(f"update node {node.id} loads its group from a home")
        first = node.id not in self.runs
        self.runs[node.id] = self.runs.get(node.id, 0) + 1
        code = self.code
        # the gradients it reads: its group's (an update, clipping's group-norm node or a sums
        # node; none for an update that steps with sums added apart)
        grads = list(node.attrs.get("reads", {}))
        lines = ["t0 = _now()"]
        lines += [f"E[{code.const(name)}] = {self.value(name, {})}" for name in grads]
        lines.append(f"{code.const(self.step_group)}({code.const(node)}, "
                     f"{code.const(self.runner)})")
        lines += [f"del E[{code.const(name)}]" for name in grads]
        lines.append(f"{'cs' if first else 'rs'} += _now() - t0")
        return lines

    def free(self, node_id) -> list[str]:
        lines = []
        for name in self.graph.node(node_id).attrs["outputs"]:
            if name in self.resident:
                lines.append(f"del {self.resident.pop(name)}")
            elif name in self.bound:
                raise NotCompiled(f"node {node_id} frees a bound input")
        return lines

    # -- a node's ops, as StepRunner.compute runs them ----------------------------------------

    def node_ops(self, node_id, first: bool) -> list[str]:
        prep = self.runner._ops_of(node_id)
        local: dict[str, str] = {}
        code = self.code
        lines: list[str] = []

        def expr(arg: Any) -> str:
            if isinstance(arg, fx.Node):
                return self.value(arg.name, local)
            if isinstance(arg, (list, tuple)) and any(_has_node(a) for a in arg):
                inner = ", ".join(expr(a) for a in arg)
                return f"[{inner}]" if isinstance(arg, list) else f"({inner},)"
            return code.const(arg)

        for k, step in enumerate(prep.steps):
            operands, entry = list(step.op.args), step.call
            into = None if step.grad_mode or step.items else \
                in_place_operand(step.op, {n for n in step.drop if n in local})
            if into is not None:  # see in_place.py: the result goes into a dying operand
                entry, position = into
                operands.insert(0, operands.pop(position))
            args = ", ".join(expr(a) for a in operands)
            kwargs = ", ".join(f"{name}={expr(value)}" if _plain_name(name)
                               else f"**{{{code.const(name)}: {expr(value)}}}"
                               for name, value in step.kwargs.items())
            call = f"{code.const(entry)}({', '.join(p for p in (args, kwargs) if p)})"
            result = f"r{k}" if step.items else local.setdefault(step.name, self.new())
            if step.grad_mode:  # see trace.GRAD_MODE_OPS
                lines += ["with _enable_grad():", f"    {result} = {call}"]
            else:
                lines.append(f"{result} = {call}")
            for i, name, _ in step.items:
                local[name] = self.new()
                lines.append(f"{local[name]} = {result}[{i}]")
            if step.items:
                lines.append(f"del {result}")
            for name in step.drop:
                lines.append(f"del {local.pop(name)}")
        # The generator state of a random node's first run, replayed on every later one (a
        # node computed once needs none).
        if prep.random and self.computed[node_id] > 1:
            if first:
                state = self.random_state[node_id] = self.new()
                lines = [f"{state} = _rng()"] + lines
            else:
                lines = ["restore = _rng()", f"_set_rng({self.random_state[node_id]})",
                         "try:"] + [f"    {line}" for line in lines] + \
                        ["finally:", "    _set_rng(restore)"]
        if first:
            taken = [("G", param, name) for name, param in prep.grads if self.keep_grads]
            taken += [("B", buffer, name) for name, buffer in prep.buffer_updates]
            for where, key, name in taken:
                if (where, key) not in self.taken:
                    self.taken.add((where, key))
                    lines.append(f"{where}[{code.const(key)}] = {local[name]}")
            if prep.loss is not None and ("loss", "") not in self.taken:
                self.taken.add(("loss", ""))
                lines.append(f"loss = {local[prep.loss]}")
        for name in prep.outputs:
            self.resident[name] = local.pop(name)
        lines += [f"del {var}" for var in local.values()]  # kept only for the step's records
        return lines

    def value(self, name: str, local: dict[str, str]) -> str:
        if name in local:
            return local[name]
        if name in self.resident:
            return self.resident[name]
        if name in self.bound:
            return self.loaded.setdefault(name, self.new())
        raise NotCompiled(f"{name} is read but not in memory")


@functools.lru_cache(maxsize=16)
def _compiled(source: str):
    """Compiled once per process (half of the 28 ms it takes to make bert-mini's step)."""
    return compile(source, "<planned step>", "exec")
