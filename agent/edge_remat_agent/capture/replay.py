"""Run planner nodes through their captured ATen nodes: the one engine that executes a graph.

The executor, the op profiler and the tests all run planner nodes through `StepRunner`. It keeps
one environment of live values (name -> tensor) for one training step. Computing a planner node
runs its `replays` (free views re-derived from live storages) and `members` in order, drops each
intermediate value right after its last use inside the node (so that the node's memory follows
the `workspace_bytes` the graph promises), and keeps only its `outputs`; gradients, buffer
updates and the loss are collected on the way. Two rules make recomputation exact:
  - a node with `random` saves the generator state before its first run and replays it on every
    later run (then restores the generator, so later draws are not disturbed);
  - `buffer_updates` (batch-norm running statistics) are taken from the first run only; so are
    gradients and the loss (a recompute gives the same values, keeping one copy is enough).

With a ledger (profiler.LiveTensorLedger, or anything with `register_tensor(key, tensor)` and
`unregister(key)`), every tensor the runner holds is registered while something holds it: the
ledger then reads the step's live tensor bytes, each node's workspace included.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree
from torch import fx, nn

from ..formats import Graph, NodeId
from ..accumulation import micro_batches_of, scaled
from .bindings import python_binding
from .straight_line import compile_node
from .trace import GRAD_MODE_OPS, JointTrace


def bind_inputs(trace: JointTrace, module: nn.Module, example_args,
                device: torch.device | None = None,
                loaded: frozenset[str] = frozenset(),
                named: tuple[dict, dict] | None = None,
                constants: dict[str, torch.Tensor] | None = None,
                micro_batches: int = 1) -> dict[str, torch.Tensor]:
    """Placeholder values: parameters, buffers, the batch, lifted constants, and
    d(loss)/d(loss) = 1, or 1 / K for one of K accumulated micro-batches (eager's backward of
    `loss / K` starts from the same division, so the gradients are its bit for bit). `loaded`: the placeholders of parameters that param nodes load (not
    bound here). `named`: the module's (parameters, buffers) by name, when the caller has them;
    `constants`: trace.constants(), when the caller has them."""
    params, buffers = named if named is not None else named_tensors(module)
    env = {ph: params[name].detach() for ph, name in trace.params.items() if ph not in loaded}
    env.update({ph: buffers[name].detach() for ph, name in trace.buffers.items()})
    # The trace numbers the batch's leaves: a dict or nested argument is several inputs.
    leaves = pytree.tree_leaves(tuple(example_args))
    env.update({ph: _on(leaves[i], device) for ph, i in trace.user_inputs.items()})
    constants = trace.constants() if constants is None else constants
    env.update({name: _on(t, device) for name, t in constants.items()})
    loss = trace.node(trace.tangent).meta["val"]
    env[trace.tangent] = scaled(torch.ones(loss.shape, dtype=loss.dtype, device=device),
                                micro_batches)
    return env


def _on(value: Any, device: torch.device | None) -> Any:
    """A tensor on the step's device (a lifted constant; the batch too: the op profiler binds
    the example batch as captured, on the CPU)."""
    return value.to(device) if device is not None and isinstance(value, torch.Tensor) else value


def named_tensors(module: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The module's parameters and buffers by name (duplicates included)."""
    return (dict(module.named_parameters(remove_duplicate=False)),
            dict(module.named_buffers(remove_duplicate=False)))


def rng_state(device: torch.device | None = None) -> tuple:
    """The generators a node may draw from: the CPU's, and the accelerator's when it runs there."""
    on_cuda = device is not None and device.type == "cuda"
    return torch.get_rng_state(), (torch.cuda.get_rng_state(device) if on_cuda else None)


def set_rng_state(state: tuple, device: torch.device | None = None) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


@dataclass
class _NodeOps:
    """How to run one planner node: its ops in order, and what to drop after each; and what
    compute() reads from the node's attrs, taken once (they do not change between steps)."""

    ops: list[fx.Node]
    drop_after: list[list[str]]  # local values whose last use is that op (never what the
    # node keeps: its outputs, gradients, buffer updates, the loss)
    steps: list[_OpStep] = field(default_factory=list)  # the same ops, resolved to run
    outputs: tuple[str, ...] = ()
    grads: tuple[tuple[str, str], ...] = ()  # (value, parameter name)
    buffer_updates: tuple[tuple[str, str], ...] = ()  # (value, buffer name)
    loss: str | None = None
    random: bool = False
    reads: tuple[str, ...] = ()
    keep: frozenset[str] = frozenset()  # outputs, gradients, buffer updates, the loss
    replayed: frozenset[str] = frozenset()  # views re-derived here (another node's too)
    # The steps compiled (capture/straight_line.py), for the out writer they were made with.
    run: Callable[[dict], dict] | None = None
    run_writer: Any = None


@dataclass(frozen=True)
class _OpStep:
    """One op made ready once per run: the callable itself (torch's Python binding where it
    reaches the same overload, bindings.py, else the OpOverload's C++ entry point, not its
    Python wrapper), its keyword arguments, and the values dropped after it.

    `held`: the runner holds (and the ledger counts) the result; False for a view that dies
    inside the node before the value it views (see _unheld_views). `items`: (position, name,
    ledger key) of each getitem folded into this op (see _folded_getitems): the op's tuple
    result is never held itself, its items are held as the op returns, and the getitems do
    not run."""

    name: str
    call: Callable[..., Any]
    kwargs: dict
    grad_mode: bool
    drop: tuple[str, ...]
    op: fx.Node  # the traced op: its arguments (the out writer reads its result's shapes)
    held: bool = True
    items: tuple[tuple[int, str, tuple], ...] = ()


def _op_step(op: fx.Node, drop: list[str], grad_mode: bool, device: torch.device | None,
             unheld: set[str] = frozenset(), items: tuple[tuple[int, str], ...] = ()) -> _OpStep:
    target = op.target
    kwargs = dict(op.kwargs)
    if device is not None and device.type != "cpu" and kwargs.get("device") is not None:
        kwargs["device"] = device  # factories traced on the CPU
    call = getattr(target, "_op", target) if isinstance(target, torch._ops.OpOverload) \
        else target
    if isinstance(target, torch._ops.OpOverload):
        call = python_binding(op, kwargs) or call
    return _OpStep(op.name, call, kwargs, grad_mode, tuple(drop), op,
                   held=op.name not in unheld and not items,
                   items=tuple((i, name, ("value", name, 0)) for i, name in items))


def _folded_getitems(ops: list[fx.Node],
                     keep: set[str]) -> dict[str, tuple[tuple[int, str], ...]]:
    """Ops with several results (batch norm, convolution backward, ...) whose every user is a
    getitem in the same node and whose every tensor result is taken by one: op name ->
    (position, getitem name) for each. Such an op's result is split as it returns and the
    getitems are not run: holding the tuple and then each item counted every tensor twice in
    the ledger (a fifth of resnet18's ledger work, and its getitems a quarter of the loop)."""
    here = {op.name for op in ops}
    folded: dict[str, tuple[tuple[int, str], ...]] = {}
    for op in ops:
        meta = op.meta.get("val")
        if op.name in keep or op.target is operator.getitem or not op.users \
                or not isinstance(meta, (tuple, list)):
            continue
        users = list(op.users)
        if not all(u.target is operator.getitem and u.name in here and len(u.args) == 2
                   and isinstance(u.args[1], int) for u in users):
            continue
        taken = {u.args[1] for u in users}
        if any(isinstance(m, torch.Tensor) and i not in taken for i, m in enumerate(meta)):
            continue  # a result nobody takes is counted with the tuple's, as ATen makes it
        folded[op.name] = tuple((u.args[1], u.name) for u in users)
    return folded


def _unheld_views(ops: list[fx.Node], keep: set[str], drop_after: list[list[str]]) -> set[str]:
    """Views (view, t, transpose, expand, ...: the schema says the one result aliases the
    first argument, read only) that the node drops before the value they view, or that view a
    value the whole node keeps alive (the environment's, or one it keeps). Their storage is
    counted, and kept alive, by that value for as long as they live, so holding them adds no
    byte to the ledger: they skip the bookkeeping (about half of a transformer's ops)."""
    dropped_at = {name: k for k, names in enumerate(drop_after) for name in names}
    unheld: set[str] = set()
    for op in ops:
        base = op.args[0] if op.args else None
        if op.name in keep or not isinstance(base, fx.Node) or not _is_view(op):
            continue
        if base.name in dropped_at and dropped_at[base.name] <= dropped_at[op.name]:
            continue  # the viewed value goes first (or with it): the view must count
        unheld.add(op.name)
    return unheld


def _is_view(op: fx.Node) -> bool:
    if not isinstance(op.target, torch._ops.OpOverload):
        return False
    schema = op.target._schema
    if len(schema.returns) != 1 or not schema.arguments:
        return False
    result, first = schema.returns[0], schema.arguments[0]
    return (str(result.type) == "Tensor" and result.alias_info is not None
            and not result.alias_info.is_write and first.alias_info is not None
            and not first.alias_info.is_write)


class StepRunner:
    """One training step's forward + backward, planner node by planner node."""

    def __init__(self, trace: JointTrace, graph: Graph, module: nn.Module, example_args,
                 device: str | torch.device | None = None, ledger: Any = None,
                 load_parameter: Callable[[str], torch.Tensor] | None = None,
                 load_parameters: Callable[[list[str]], list[torch.Tensor]] | None = None):
        self.trace, self.graph, self.ledger = trace, graph, ledger
        self.device = torch.device(device) if device is not None else None
        self._node_ops: dict[NodeId, _NodeOps] = {}
        self._holds: dict[str, int] = {}  # value name -> how many holders keep it alive
        self._keys: dict[str, list[tuple]] = {}  # value name -> its ledger keys
        # Fused graphs plan gradients as node outputs; "step" graphs hold them as fixed memory.
        self.fused = graph.capture.get("update") == "fused"
        self._gradient_values, self._gradient_elements = (set(), {}) if self.fused else \
            gradient_storages(trace)
        # Keep every gradient to the step's end (self.grads): what an optimizer step after the
        # backward needs, and the gradient check. A planned fused step turns this off: its
        # update nodes consume the gradients as they go (executor/step.py).
        self.keep_grads = True
        # Param nodes load parameters: from their home (the executor's), else the module's own.
        params = dict(module.named_parameters(remove_duplicate=False))
        self.load_parameter = load_parameter or (lambda name: params[name].detach())
        # A param node's group at once (a home reads it as one page), else name by name.
        self.load_parameters = load_parameters or (
            lambda names: [self.load_parameter(name) for name in names])
        self._loaded = frozenset(ph for node in graph.nodes if node.kind == "param"
                                 for ph in node.attrs["outputs"])
        self._read_last_by: dict[NodeId, list[NodeId]] | None = None  # reader -> inputs
        self._grad_mode_ops = {n.name for n in trace.compute_nodes
                               if getattr(n.target, "__name__", "").split(".")[0]
                               in GRAD_MODE_OPS}
        self.env: dict[str, Any] = {}
        self._named: tuple[nn.Module, tuple[dict, dict]] | None = None  # see _named_tensors
        # Found once (they walk the whole graph), and named before a step binds them.
        self._constants = trace.constants()
        # Optional: runs ops as .out variants into planned memory (executor/arena.OutWriter).
        self.writer: Any = None
        self.start_step(module, example_args)

    # -- a step's lifetime -------------------------------------------------------------------

    def start_step(self, module: nn.Module, example_args) -> None:
        """Forget the previous step's values and bind this step's parameters and batch."""
        self.release_all()
        self.env = bind_inputs(self.trace, module, tuple(example_args), self.device,
                               self._loaded, self._named_tensors(module), self._constants,
                               micro_batches_of(self.graph))
        for name, value in self.env.items():
            self._hold(name, value)
        self.rng_states: dict[NodeId, tuple] = {}
        self.runs: dict[NodeId, int] = {}
        self.grads: dict[str, torch.Tensor] = {}  # parameter name -> gradient
        self.buffer_updates: dict[str, torch.Tensor] = {}  # buffer name -> new value
        self.loss: torch.Tensor | None = None

    def bound_names(self) -> set[str]:
        """The values start_step binds (what bind_inputs returns)."""
        trace = self.trace
        return ({ph for ph in trace.params if ph not in self._loaded} | set(trace.buffers)
                | set(trace.user_inputs) | set(self._constants) | {trace.tangent})

    def release_all(self) -> None:
        """Drop every value of the step (after the optimizer has used the gradients)."""
        for name in list(self._holds):
            self._holds[name] = 1
            self._release(name)
        self.env = {}
        self.grads, self.buffer_updates, self.loss = {}, {}, None

    # -- the instructions ------------------------------------------------------------------

    def compute(self, node_id: NodeId) -> None:
        prep = self._node_ops.get(node_id) or self._ops_of(node_id)
        if prep.ops is None:  # a param node
            self._load_parameters(self.graph.node(node_id))
            return
        runs = self.runs
        first = node_id not in runs
        runs[node_id] = runs.get(node_id, 0) + 1
        restore = None
        if prep.random:
            if first:
                self.rng_states[node_id] = rng_state(self.device)
            else:
                restore = rng_state(self.device)
                set_rng_state(self.rng_states[node_id], self.device)
        try:
            local = self._run(prep)
        except KeyError:
            missing = [name for name in prep.reads if name not in self.env]
            if missing:  # checked here, not before every node: the simulator checked the plan
                node = self.graph.node(node_id)
                raise RuntimeError(f"node {node_id} ({node.name}) reads {missing}, which are "
                                   "not in memory: its producers were freed or never "
                                   "computed") from None
            raise
        finally:
            if restore is not None:
                set_rng_state(restore, self.device)
        try:
            if self.keep_grads:
                for name, param in prep.grads:
                    # A "step" graph's gradients are not in the ledger: they are fixed memory
                    # (a trainer's .grad buffers), which the caller counts at full size.
                    self.grads.setdefault(param, local[name])
            for name, buffer in prep.buffer_updates:
                if buffer not in self.buffer_updates:
                    self._hold(name, local[name])
                    self.buffer_updates[buffer] = local[name]
            if prep.loss is not None and self.loss is None:
                self._hold(prep.loss, local[prep.loss])
                self.loss = local[prep.loss]
            env = self.env
            for name in prep.outputs:  # the node's hold on an output passes to the env
                env[name] = local.pop(name)
        finally:
            for name in local:  # the node's own hold on the rest
                self._release(name)

    def _load_parameters(self, node) -> None:
        self.runs[node.id] = self.runs.get(node.id, 0) + 1
        for placeholder, value in zip(node.attrs["outputs"],
                                      self.load_parameters(node.attrs["params"])):
            self._hold(placeholder, value)
            self.env[placeholder] = value

    def place_parameters(self, node_id: NodeId, values: dict[str, torch.Tensor]) -> None:
        """A param node's group loaded elsewhere (overlapped paging's read from home), by
        output: as computing the node would have left it."""
        self.runs[node_id] = self.runs.get(node_id, 0) + 1
        for placeholder, value in values.items():
            self._hold(placeholder, value)
            self.env[placeholder] = value

    def free(self, node_id: NodeId) -> None:
        for name in self.graph.node(node_id).attrs["outputs"]:
            if self.env.pop(name, None) is not None:
                self._release(name)

    def outputs(self, node_id: NodeId) -> dict[str, torch.Tensor]:
        return {name: self.env[name] for name in self.graph.node(node_id).attrs["outputs"]}

    def restore_outputs(self, node_id: NodeId, values: dict[str, torch.Tensor]) -> None:
        """Put a node's outputs back (paged in) without computing it."""
        expected = self.graph.node(node_id).attrs["outputs"]
        if sorted(values) != sorted(expected):
            raise ValueError(f"node {node_id}: got values {sorted(values)}, its outputs are "
                             f"{sorted(expected)}")
        for name in expected:
            if name in self.env:
                raise RuntimeError(f"node {node_id}: {name} is already in memory")
            self._hold(name, values[name])
            self.env[name] = values[name]

    def rebind(self, name: str, value: torch.Tensor) -> None:
        """The same value, moved (the arena executor copied it into its slot)."""
        self.env[name] = value
        keys = self._keys.get(name)
        if keys and self.ledger is not None:
            tensors = dict(_tensors(value))
            for key in keys:
                self.ledger.unregister(key)
                self.ledger.register_tensor(key, tensors[key[2]])

    def fixed_values(self) -> set[str]:
        """Values in a gradient's storage that the caller counts as fixed memory."""
        return self._gradient_values

    def run_plain(self) -> None:
        """Every node once, in order, freeing each output after its last reader (the
        optimizer's steps are the caller's: update nodes are skipped)."""
        for node in self.graph.nodes:
            if node.kind == "update":
                continue
            self.compute(node.id)
            self.free_inputs_read_last(node.id)

    def free_inputs_read_last(self, node_id: NodeId) -> None:
        """In the plain schedule's order: free the inputs no node after this one reads."""
        if self._read_last_by is None:
            self._read_last_by = {}
            last_reader = {dep: node.id for node in self.graph.nodes for dep in node.inputs}
            for dep, reader in last_reader.items():
                self._read_last_by.setdefault(reader, []).append(dep)
        for dep in self._read_last_by.get(node_id, ()):
            self.free(dep)

    def apply_buffer_updates(self, module: nn.Module) -> None:
        if not self.buffer_updates:
            return
        buffers = self._named_tensors(module)[1]
        with torch.no_grad():
            for name, value in self.buffer_updates.items():
                buffers[name].copy_(value)

    def _named_tensors(self, module: nn.Module) -> tuple[dict, dict]:
        """named_tensors(module), walked once per module: the walk cost 0.2-0.7 ms a step
        (resnet18, bert-mini), and a run's module keeps its parameter and buffer objects (the
        optimizer updates them in place)."""
        if self._named is None or self._named[0] is not module:
            self._named = (module, named_tensors(module))
        return self._named[1]

    # -- running ops -------------------------------------------------------------------------

    def _ops_of(self, node_id: NodeId) -> _NodeOps:
        node_ops = self._node_ops.get(node_id)
        if node_ops is None:
            node = self.graph.node(node_id)
            if node.kind == "param":
                node_ops = self._node_ops[node_id] = _NodeOps(None, [])
                return node_ops
            ops = [self.trace.node(name) for name in node.attrs.get("replays", [])
                   + node.attrs["members"]]
            keep = set(node.attrs["outputs"]) | set(node.attrs.get("grads", {})) \
                | set(node.attrs.get("buffer_updates", {}))
            if "loss" in node.attrs:
                keep.add(node.attrs["loss"])
            position = {op.name: k for k, op in enumerate(ops)}
            last_use = {op.name: k for k, op in enumerate(ops)}  # unused: dropped at once
            for k, op in enumerate(ops):
                for arg in op.all_input_nodes:
                    if arg.name in position:
                        last_use[arg.name] = max(last_use[arg.name], k)
            drop_after: list[list[str]] = [[] for _ in ops]
            for name, k in last_use.items():
                if name not in keep:
                    drop_after[k].append(name)
            unheld = _unheld_views(ops, keep, drop_after)
            folded = _folded_getitems(ops, keep)
            into = {name: owner for owner, items in folded.items() for _, name in items}
            # A folded getitem's drops (its tuple, or itself when unused) go with its op's.
            dropped_with = {owner: [] for owner in folded}
            for op, dropped in zip(ops, drop_after):
                if op.name in into:
                    dropped_with[into[op.name]] += [n for n in dropped if n not in folded]
            steps = [_op_step(op, dropped + dropped_with.get(op.name, []),
                              op.name in self._grad_mode_ops, self.device, unheld,
                              folded.get(op.name, ()))
                     for op, dropped in zip(ops, drop_after)
                     if op.name not in into]  # a folded getitem runs with its op
            node_ops = self._node_ops[node_id] = _NodeOps(
                ops, drop_after, steps, tuple(node.attrs["outputs"]),
                tuple(node.attrs.get("grads", {}).items()),
                tuple(node.attrs.get("buffer_updates", {}).items()), node.attrs.get("loss"),
                bool(node.attrs.get("random")), tuple(node.attrs.get("reads", {})),
                frozenset(keep), frozenset(node.attrs.get("replays", [])))
        return node_ops

    def _run(self, node_ops: _NodeOps) -> dict[str, Any]:
        run = node_ops.run
        if run is None or node_ops.run_writer is not self.writer:
            run = node_ops.run = compile_node(
                node_ops.steps, node_ops.keep, node_ops.replayed, self._gradient_values,
                self.ledger, self._hold, self._release, self.writer)
            node_ops.run_writer = self.writer
        if torch.is_grad_enabled():  # a planned step runs under no_grad already (step.py)
            with torch.no_grad():
                return run(self.env)
        return run(self.env)

    # -- who holds what (the ledger's view) --------------------------------------------------

    def _hold(self, name: str, value: Any) -> None:
        count = self._holds.get(name, 0)
        self._holds[name] = count + 1
        if count or self.ledger is None:
            return
        if name in self._gradient_values:
            return  # a gradient's storage: fixed memory, see the module docstring
        if type(value) is torch.Tensor:  # the common case, without building lists
            key = ("value", name, 0)
            self.ledger.register_tensor(key, value)
            self._keys[name] = (key,)
            return
        skip = self._gradient_elements.get(name, ())
        keys = []
        for i, tensor in _tensors(value):
            if i in skip:
                continue
            key = ("value", name, i)
            self.ledger.register_tensor(key, tensor)
            keys.append(key)
        self._keys[name] = keys

    def _release(self, name: str) -> None:
        count = self._holds.get(name, 0) - 1
        if count > 0:
            self._holds[name] = count
            return
        self._holds.pop(name, None)
        keys = self._keys.pop(name, None)
        if keys:
            for key in keys:
                self.ledger.unregister(key)


def _tensors(value: Any) -> list[tuple[int, torch.Tensor]]:
    """The tensors in an op's result, by their position in it (None results are skipped)."""
    if isinstance(value, torch.Tensor):
        return [(0, value)]
    if isinstance(value, (tuple, list)):
        return [(i, item) for i, item in enumerate(value) if isinstance(item, torch.Tensor)]
    return []


def gradient_storages(trace: JointTrace) -> tuple[set[str], dict[str, set[int]]]:
    """Values that live in a gradient's storage, and for ops with several results (convolution
    backward), which result positions do: the ledger leaves them to the caller's fixed memory."""
    roots = trace.storage_roots()
    gradient_roots = {roots[name] for name in trace.grads if name in roots}
    values = {name for name, root in roots.items() if root in gradient_roots}
    elements: dict[str, set[int]] = {}
    for name in values:
        node = trace.node(name)
        parent = node.args[0] if node.target is operator.getitem else None
        if isinstance(parent, fx.Node) and parent.name not in roots:
            elements.setdefault(parent.name, set()).add(node.args[1])
    return values, elements
