"""From captured groups to the planner's graph: sizes per storage, dependencies, workspace, costs.

For each group (planner node):
  - a value it reads from another group is followed through views back to the value that owns
    the storage: the group depends on (`reads`) that owner's group and re-derives the views
    itself (`replays`, free). So a node never depends on a group that merely took a view, and a
    view of a parameter creates no dependency at all.
  - `outputs`: values other groups read; `out_bytes` counts their storages once.
  - `workspace_bytes`: the peak of the group's own transient storages beyond `out_bytes`,
    replayed op by op, so grouping never hides a memory peak.
  - storages of parameters, buffers, the batch and parameter gradients are fixed memory.
"""

from __future__ import annotations

import hashlib
import json
import operator
from dataclasses import replace

import torch
from torch import fx, nn

from ..formats import Graph, Node
from ..formats.graph import DTYPES
from .coarsen import Group, op_name
from .estimate import DEFAULT_RATES, Rates, op_cost, round_time
from .optimizer import Optimizer, fixed_memory, largest_trainable_bytes, trainable_elements
from .state import param_groups, plan_state
from .storage import (Storage, aliased_input, storage_nbytes,
                      unpicked_result_nbytes)
from .trace import JointTrace

def _draws_random_numbers(node: fx.Node) -> bool:
    """Whether an op draws from the generator: its group must replay the generator state when
    recomputed. ATen tags every such op, functionalized variants included (a list of names
    missed `rrelu_with_noise_functional`, RReLU in training mode)."""
    return torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ())


def assemble(trace: JointTrace, groups: list[Group], module: nn.Module, example_args,
             optimizer: Optimizer, rates: Rates = DEFAULT_RATES, update: str = "fused",
             params_home: str = "ram", clip_grad_norm: float | None = None,
             accumulate: int = 1) -> tuple[Graph, dict]:
    """The planner graph, and figures for reports (saved bytes, fixed-memory breakdown, the
    bytes that are planned tensors instead of fixed memory). `update`: "fused" (gradients and,
    with `params_home` a tier, parameters and optimizer state are planned tensors: state.py)
    or "step" (one optimizer step after the backward; they are all fixed memory).
    `accumulate` > 1: the graph is one of that many micro-passes, and the buffers that sum
    their gradients are fixed memory (accumulation.py), but for groups homed on a tier, whose
    sums live there between their update nodes (state.py)."""
    fused = update == "fused"
    store = trace.storages()
    groups = _gradient_views_with_their_storage(trace, groups, store)
    group_of = {name: i for i, g in enumerate(groups) for name in g.members}
    fixed_roots = {s.root for name, s in store.items() if trace.node(name).op == "placeholder"}
    if not fused:
        fixed_roots |= {store[name].root for name in trace.grads if name in store}
    links = [_links(i, g, trace, group_of) for i, g in enumerate(groups)]
    read_by_others = {name for _, reads, _ in links for name in reads}
    if fused:
        read_by_others |= set(trace.grads)  # the update nodes read them
    nodes = []
    for i, group in enumerate(groups):
        outputs = [name for name in group.members if name in read_by_others]
        nodes.append(_planner_node(i, group, links[i], outputs, trace, store, fixed_roots, rates))
    _name_uniquely(nodes)
    saved = saved_bytes(nodes)
    fixed = fixed_memory(module, example_args, optimizer)
    if accumulate > 1:  # resident across the micro-passes, as optimizer state is across steps
        fixed["gradient_accumulators"] = fixed["gradients"]
        fixed["total"] += fixed["gradients"]
    fixed["step_state"] = _step_state_bytes(trace, store)
    fixed["constants"] = sum(storage_nbytes(t) for t in trace.constants().values())
    fixed["total"] += fixed["step_state"] + fixed["constants"]
    planned = {"parameters": 0, "gradients": 0, "optimizer_state": 0}
    if fused:
        # The storages behind gradients, by the node that allocates them: the plain
        # reference holds these as .grad buffers (planner/build).
        grad_roots = {store[v].root for v in trace.grads if v in store}
        for index, node in enumerate(nodes):
            own = [root for root in grad_roots if group_of.get(root) == index]
            if own:
                node.attrs["grad_bytes"] = sum(store[root].nbytes for root in own)
        # only clipping reads them (refinement assembles the graph many times)
        shared = _gradients_sharing_storage(trace, store, read_by_others) \
            if clip_grad_norm is not None else None
        state = plan_state(nodes, param_groups(trace, module, nodes), optimizer, params_home,
                           rates, clip_grad_norm, [name for name, _ in module.named_parameters()],
                           accumulate, shared)
        nodes, planned = state.nodes, state.planned
        for kind, nbytes in planned.items():
            fixed[kind] -= nbytes
            fixed["total"] -= nbytes
    else:
        nodes.append(_update_node(len(nodes), module, optimizer, fixed["gradients"], rates))
    graph = Graph(nodes=nodes, name=trace.model, fixed_bytes=fixed["total"],
                  batch=_batch(example_args), dtype=_dtype(module), cost_source="estimate")
    return graph, {"saved_bytes": saved, "fixed": fixed, "planned": planned}


def _gradients_sharing_storage(trace: JointTrace, store: dict[str, Storage],
                               read_by_others: set[str]) -> dict[str, int]:
    """Gradient value -> its storage's bytes, for the gradients whose storage another value
    that outlives its node also holds (another gradient, a value a later node reads) or that
    is the step's input: clipping scales those on a copy, the rest in place (state.py)."""
    held: dict[str, set[str]] = {}  # storage root -> the values on it that outlive their node
    for name in read_by_others | set(trace.grads):
        if name in store:
            held.setdefault(store[name].root, set()).add(name)
    shared = {}
    for value in trace.grads:
        root = store[value].root
        if held[root] - {value} or trace.node(root).op == "placeholder":
            shared[value] = store[value].nbytes
    return shared


def _gradient_views_with_their_storage(trace: JointTrace, groups: list[Group],
                                       store: dict[str, Storage]) -> list[Group]:
    """`groups` with each gradient that is a view of another group's value (the transpose of
    a mm that the backward took in another module's group, or in a node of its own once
    refinement split them) moved to the group that owns its storage. The update reads it from
    there, and the storage goes when that node is freed. Left where it was, the gradient
    would keep the storage alive as long as its node's other outputs, which the plan does not
    count (nn.TransformerEncoder's out_proj weight gradient, 4 KiB over the plan). Moving a
    view adds no input. The views between the owner's value and the gradient move with it:
    left in another group (`t(t(mm))` from torch.func.functional_call, the inner transpose in
    the update's group), the owner would replay them before computing the value they view."""
    group_of = {name: i for i, g in enumerate(groups) for name in g.members}
    moved: dict[int, list[str]] = {}
    for value in trace.grads:
        root = store[value].root if value in store else value
        owner, holder = group_of.get(root), group_of.get(value)
        if owner is not None and holder is not None and owner != holder:
            chain, _ = _view_chain(trace.node(value))
            for name in chain:  # base first: the order the owner computes them in
                if group_of.get(name, owner) != owner and name not in moved.setdefault(owner, []):
                    moved[owner].append(name)
    if not moved:
        return groups
    leaving = {value for values in moved.values() for value in values}
    out = []
    for i, group in enumerate(groups):
        members = [name for name in group.members if name not in leaving] + moved.get(i, [])
        if members:  # a node that held only the view is gone
            out.append(replace(group, members=members))
    return out


def _step_state_bytes(trace: JointTrace, store: dict[str, Storage]) -> int:
    """Bytes the executor holds from a node's first run to the step's end whatever the
    schedule: the new batch-norm statistics (applied once, after the optimizer step), the loss
    and d(loss)/d(loss). Fixed memory, so that the plan's peak is the executor's: counted by
    their storages, as the executor's ledger counts them (a loss may keep a larger one).
    `store`: trace.storages()."""
    names = [*trace.buffer_updates, trace.loss, trace.tangent]
    return sum({store[name].root: store[name].nbytes for name in names if name in store}.values())


def saved_bytes(nodes: list[Node]) -> int:
    """Activation bytes the backward pass reads from forward and loss nodes: what the plain
    schedule holds when the loss is done."""
    backward = [n for n in nodes if n.kind == "backward"]
    read = {dep for n in backward for dep in n.inputs}
    return sum(n.out_bytes for n in nodes if n.kind in ("forward", "loss") and n.id in read)


def _links(index: int, group: Group, trace: JointTrace, group_of: dict[str, int]
           ) -> tuple[set[int], dict[str, int], list[str]]:
    """What a group reads from others: planner inputs, values read (-> producer), views replayed."""
    member_set = set(group.members)
    inputs: set[int] = set()
    reads: dict[str, int] = {}
    replays: list[str] = []
    for name in group.members:
        for dep in trace.node(name).all_input_nodes:
            if group_of.get(dep.name, index) == index:
                continue  # our own value, or a placeholder the executor binds
            # A view is free to re-derive: depend on the group that owns the storage behind it,
            # not on the group that happened to take the view.
            chain, base = _view_chain(dep)
            replays += [n for n in chain if n not in replays and n not in member_set]
            producer = group_of.get(base.name)
            if producer is not None and producer != index:
                inputs.add(producer)
                reads[base.name] = producer
    return inputs, reads, replays


def _planner_node(index: int, group: Group, links, outputs: list[str], trace: JointTrace,
                  store: dict[str, Storage], fixed_roots: set[str], rates: Rates) -> Node:
    inputs, reads, replays = links
    members = [trace.node(name) for name in group.members]
    member_set = set(group.members)
    own_out_roots = {store[name].root for name in outputs
                     if name in store and store[name].root in member_set
                     and store[name].root not in fixed_roots}
    out_bytes = sum(store[root].nbytes for root in own_out_roots)
    peak = _transient_peak(members, store, member_set, own_out_roots, fixed_roots)
    costs = [_op_cost(trace, n, n.name in store and store[n.name].root != n.name, rates)
             for n in members]
    attrs = {
        "members": list(group.members),
        "outputs": outputs,
        "reads": reads,
        "replays": replays,
        "scope": group.scope,
        "flops": sum(c.flops for c in costs),
        "bytes_moved": sum(c.bytes_moved for c in costs),
    }
    grads = {n.name: trace.grads[n.name] for n in members if n.name in trace.grads}
    updates = {n.name: trace.buffer_updates[n.name] for n in members
               if n.name in trace.buffer_updates}
    if grads:
        attrs["grads"] = grads
    if updates:
        attrs["buffer_updates"] = updates
    if trace.loss in member_set:
        attrs["loss"] = trace.loss
    if any(_draws_random_numbers(n) for n in members):
        attrs["random"] = True
    main = _main_op(members, costs)
    structure = trace.memo(("structure", *group.members), lambda: _structure_hash(members))
    name = group.label or ((group.scope or "model") if group.kind == "forward" else
                           "loss" if group.kind == "loss" else f"{group.scope or 'loss'}.backward")
    return Node(id=index, name=name, kind=group.kind, op=main, inputs=sorted(inputs),
                out_bytes=out_bytes, workspace_bytes=max(0, peak - out_bytes),
                time_s=round_time(sum(c.time_s for c in costs)),
                signature=f"{main}:{structure}", attrs=attrs)


def _op_cost(trace: JointTrace, node: fx.Node, is_alias: bool, rates: Rates):
    return trace.memo(("op_cost", node.name, is_alias, rates),
                      lambda: op_cost(node, is_alias, rates))


def _view_chain(node: fx.Node) -> tuple[list[str], fx.Node]:
    """The view ops leading to `node` from the value that owns its storage, and that value."""
    chain = []
    while (base := aliased_input(node)) is not None:
        chain.append(node.name)
        if node.target is operator.getitem:  # a view op with several results: replay the op too
            chain.append(node.args[0].name)
        node = base
    return chain[::-1], node


def _transient_peak(members: list[fx.Node], store: dict[str, Storage], member_set: set[str],
                    keep: set[str], fixed_roots: set[str]) -> int:
    """Peak bytes of storages this group allocates, replaying its ops in order."""
    position = {n.name: k for k, n in enumerate(members)}
    last_use: dict[str, int] = {}
    for k, node in enumerate(members):
        s = store.get(node.name)
        if s is not None and s.root in member_set and s.root not in fixed_roots:
            last_use[s.root] = max(last_use.get(s.root, position[s.root]), k)
        for dep in node.all_input_nodes:
            s = store.get(dep.name)
            if s is not None and s.root in member_set and s.root not in fixed_roots:
                last_use[s.root] = max(last_use.get(s.root, k), k)
    live, peak = 0, 0
    allocs: dict[int, int] = {}
    frees: dict[int, int] = {}
    for root, end in last_use.items():
        born = _allocated_at(members[position[root]], position, store)
        allocs[born] = allocs.get(born, 0) + store[root].nbytes
        if root not in keep:
            frees[end] = frees.get(end, 0) + store[root].nbytes
    for k, node in enumerate(members):  # results nothing picks: made and dropped at the op
        unpicked = unpicked_result_nbytes(node)
        if unpicked:
            allocs[k] = allocs.get(k, 0) + unpicked
            frees[k] = frees.get(k, 0) + unpicked
    for k in range(len(members)):
        live += allocs.get(k, 0)
        peak = max(peak, live)
        live -= frees.get(k, 0)
    return peak


def _allocated_at(node: fx.Node, position: dict[str, int], store: dict[str, Storage]) -> int:
    """Where a storage comes into being: the results of an op with several outputs exist from
    that op on, while its inputs are still alive, not from the getitem that picks one later."""
    parent = node.args[0] if node.target is operator.getitem else None
    if isinstance(parent, fx.Node) and parent.name in position and parent.name not in store:
        return position[parent.name]
    return position[node.name]


def _update_node(index: int, module: nn.Module, optimizer: Optimizer, trainable_bytes: int,
                 rates: Rates) -> Node:
    elements = trainable_elements(module)
    flops = optimizer.flops_per_element * elements
    moved = optimizer.tensors_moved * trainable_bytes
    time = max(flops / rates.flops_per_s, moved / rates.bytes_per_s) + rates.op_overhead_s
    return Node(id=index, name="optimizer.step", kind="update", op=f"{optimizer.name}_step",
                inputs=[], out_bytes=0,
                workspace_bytes=optimizer.temp_copies * largest_trainable_bytes(module),
                time_s=round_time(time), signature=f"{optimizer.name}_step:{elements}",
                attrs={"members": [], "outputs": [], "optimizer": optimizer.name,
                       "flops": flops, "bytes_moved": moved})


def _main_op(members: list[fx.Node], costs) -> str:
    best = max(range(len(members)), key=lambda k: (costs[k].flops, -k), default=None)
    return op_name(members[best]) if best is not None else "none"


def _structure_hash(members: list[fx.Node]) -> str:
    """Same ops on the same shapes give the same hash, whatever the node names."""
    local = {n.name: k for k, n in enumerate(members)}

    def describe(a):
        if isinstance(a, fx.Node):
            if a.name in local:
                return f"%{local[a.name]}"
            v = a.meta.get("val")
            return f"{tuple(v.shape)}:{v.dtype}" if isinstance(v, torch.Tensor) else "?"
        return repr(a)

    rows = [[op_name(n), str(fx.node.map_aggregate(n.args, describe)),
             str(fx.node.map_aggregate(dict(n.kwargs), describe))] for n in members]
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:12]


def _name_uniquely(nodes: list[Node]) -> None:
    seen: dict[str, int] = {}
    for node in nodes:
        seen[node.name] = seen.get(node.name, 0) + 1
        if seen[node.name] > 1:
            node.name = f"{node.name}#{seen[node.name]}"


def _batch(example_args) -> int | None:
    first = next((a for a in example_args if isinstance(a, torch.Tensor) and a.dim() > 0), None)
    return int(first.shape[0]) if first is not None else None


def _dtype(module: nn.Module) -> str | None:
    """The floating dtype most of the parameters are in (one of formats.graph.DTYPES, which
    the graph's loader accepts: integer or float8 parameters are not counted); None if none."""
    counts: dict[str, int] = {}
    for p in module.parameters():
        key = str(p.dtype).replace("torch.", "")
        if key in DTYPES:
            counts[key] = counts.get(key, 0) + p.numel()
    return max(counts, key=counts.get) if counts else None
