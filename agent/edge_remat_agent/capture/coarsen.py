"""Group captured ATen nodes into planner nodes: a layer's forward, its backward, the loss.

Forward: consecutive ops of the same module form a group. `level` sets how deep the module path
counts (level 2 groups `stages.0.conv1.0` and `stages.0.conv1.1` together as `stages.0`); the
finest level also splits a module's ops before each heavy op (conv, matmul, attention, embedding)
so that even a model written without submodules gets layer-sized groups. Ops that run in a parent
module between its children (a block's residual add and ReLU) join the group before them, leading
ones the group after them. The trailing ops of the top-level forward (after the last module) are
the loss.

Backward: every backward op carries the `seq_nr` of the forward op it differentiates, so it joins
that op's group's backward; ops without one (gradient accumulation) join the next backward op's
group. Backward groups that feed each other in both directions (interleaved branches) are merged,
so the planner nodes always have a valid execution order.

`choose_level` picks the finest level whose graph stays within `max_nodes` planner nodes.

Parameters homed on a page tier (`paged_params`) are read into RAM whole for the node that
reads them, so a forward group's parameter bytes are part of its floor whatever the budget: a
group reading more than the heaviest group at the finest level does (the part of the floor no
grouping can lower) is replaced by its groups one level finer, down to the finest, as far as
the node budget allows (`_cap_parameter_bytes`); merges that would exceed it are refused.
Backward groups and parameter groups follow the forward groups, so this keeps every planner
node's parameters near the irreducible (a 22-layer Llama's layers stay apart instead of one
node of 3.9 GB of weights).
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field

from torch import fx

from .trace import SCOPE_KEY, JointTrace

# Ops that are a layer's main work: at the finest level a module's ops are split before each one.
HEAVY_OPS = {"convolution", "addmm", "mm", "bmm", "baddbmm", "matmul", "linear", "embedding",
             "_scaled_dot_product_flash_attention_for_cpu",
             "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
             "_scaled_dot_product_cudnn_attention"}


# How many following groups a group may absorb to avoid holding a forward-only tensor.
MAX_MERGE_SPAN = 3


@dataclass
class Group:
    kind: str  # forward | loss | backward
    scope: str  # module path ("" = the top-level module)
    members: list[str] = field(default_factory=list)  # captured node names, in execution order
    label: str | None = None  # the planner node's name, where refinement named a single op


@dataclass
class _Op:
    node: fx.Node
    position: int
    backward: bool
    scope: str


def coarsen(trace: JointTrace, max_nodes: int = 200, level: int | None = None,
            paged_params: bool = False, split_nodes: int | None = None
            ) -> tuple[list[Group], int]:
    """Planner groups in execution order (forward, loss, backward) and the level used.
    `paged_params`: parameters are planner tensors read from a page tier (their bytes count in
    the floor), so groups reading more of them than the finest grouping does are split, within
    `split_nodes` (default max_nodes) planner nodes for forward, loss and backward."""
    ops = _ops(trace)
    forward = [op for op in ops if not op.backward]
    if level is None:
        level = choose_level(forward, max_nodes)
    fwd_groups = _forward_groups(forward, level)
    fwd_groups = _merge_to_fit(fwd_groups, max_nodes)
    may_merge = None
    if paged_params:
        nbytes = _parameter_bytes(trace)
        cap = _parameter_cap(forward, nbytes)
        fwd_groups = _cap_parameter_bytes(fwd_groups, forward, level, nbytes, cap,
                                          split_nodes or max_nodes)
        may_merge = _within_cap(nbytes, cap)  # a merge must not raise the floor either
    fwd_groups = _merge_forward_only_outputs(fwd_groups, trace, may_merge)
    bwd_groups = _backward_groups(ops, fwd_groups)
    return fwd_groups + bwd_groups, level


def choose_level(forward: list[_Op], max_nodes: int) -> int:
    """The finest level whose forward groups, doubled for backward, plus the update, fit."""
    finest = max((len(op.scope.split(".")) for op in forward if op.scope), default=0) + 1
    for level in range(finest, 0, -1):
        if 2 * len(_forward_groups(forward, level)) + 1 <= max_nodes:
            return level
    return finest  # nothing fits: the finest groups, merged in chunks by _merge_to_fit


def _ops(trace: JointTrace) -> list[_Op]:
    out = []
    for position, node in enumerate(trace.compute_nodes):
        backward = node.meta.get("partitioner_tag") == "is_backward"
        custom = node.meta.get("custom") or {}
        out.append(_Op(node, position, backward, custom.get(SCOPE_KEY, "") or ""))
    # A getitem belongs with the op whose results it unpacks.
    owner = {op.node.name: op for op in out}
    for op in out:
        if op.node.target is operator.getitem and isinstance(op.node.args[0], fx.Node):
            parent = owner.get(op.node.args[0].name)
            if parent is not None:
                op.scope, op.backward = parent.scope, parent.backward
    return out


def _truncate(scope: str, level: int) -> str:
    return ".".join(scope.split(".")[:level]) if scope else ""


def _is_ancestor(outer: str, inner: str) -> bool:
    return outer != inner and (outer == "" or inner.startswith(outer + "."))


def _forward_groups(forward: list[_Op], level: int) -> list[Group]:
    finest = level > max((len(op.scope.split(".")) for op in forward if op.scope), default=0)
    runs: list[tuple[str, list[_Op]]] = []
    for op in forward:
        key = _truncate(op.scope, level)
        if runs and runs[-1][0] == key:
            runs[-1][1].append(op)
        else:
            runs.append((key, [op]))
    # The last run computes the loss: the top-level ops after the last module, or the loss module.
    loss_run = runs.pop() if runs else None
    merged: list[tuple[str, list[_Op]]] = []
    for key, run in runs:
        if merged and _is_ancestor(key, merged[-1][0]):
            merged[-1][1].extend(run)  # parent-module glue after a child: joins the child
        else:
            merged.append((key, run))
    if len(merged) > 1 and _is_ancestor(merged[0][0], merged[1][0]):
        key, run = merged.pop(0)  # leading glue joins the first layer
        merged[0] = (merged[0][0], run + merged[0][1])
    groups = []
    for key, run in merged:
        for part in (_split_at_heavy_ops(run) if finest else [run]):
            groups.append(Group("forward", key, [op.node.name for op in part]))
    if loss_run is not None:
        key, run = loss_run
        *layers, loss = _split_at_heavy_ops(run) if finest else [run]  # a model without modules
        groups += [Group("forward", key, [op.node.name for op in part]) for part in layers]
        groups.append(Group("loss", key, [op.node.name for op in loss]))
    return groups


def _parameter_cap(forward: list[_Op], nbytes) -> int:
    """The parameter bytes of the heaviest group at the finest level."""
    finest = max((len(op.scope.split(".")) for op in forward if op.scope), default=0) + 1
    return max((nbytes(g) for g in _forward_groups(forward, finest)), default=0)


def _cap_parameter_bytes(groups: list[Group], forward: list[_Op], level: int, nbytes,
                         cap: int, max_nodes: int) -> list[Group]:
    """Replace forward groups that read more than `cap` parameter bytes by their groups at the
    next finer level (the heaviest first), until none does, the finest level is reached, or
    a split would take the graph (forward groups doubled for backward, plus one) past
    max_nodes."""
    finest = max((len(op.scope.split(".")) for op in forward if op.scope), default=0) + 1
    for finer in range(level + 1, finest + 1):
        heavy = [g for g in groups if g.kind == "forward" and nbytes(g) > cap]
        if not heavy:
            break
        children = [g for g in _forward_groups(forward, finer) if g.kind == "forward"]
        for group in sorted(heavy, key=lambda g: -nbytes(g)):
            members = set(group.members)
            parts = [c for c in children if members.issuperset(c.members)]
            if 2 * (len(groups) + len(parts) - 1) + 1 > max_nodes:
                continue
            if len(parts) > 1 and sum(len(c.members) for c in parts) == len(members):
                at = groups.index(group)
                groups[at:at + 1] = parts
    return groups


def _within_cap(nbytes, cap: int):
    """A function: whether merging these groups keeps their parameters within the cap (or
    within the largest of theirs, where one alone exceeds it)."""
    def may_merge(parts: list[Group]) -> bool:
        merged = Group("forward", "", [m for g in parts for m in g.members])
        return nbytes(merged) <= max(cap, *(nbytes(g) for g in parts))
    return may_merge


def _parameter_bytes(trace: JointTrace):
    """A function: the bytes of the distinct parameters a group's ops read."""
    sizes = {}
    for name in trace.params:
        value = trace.node(name).meta.get("val")
        sizes[name] = value.numel() * value.element_size() if value is not None else 0
    reads = {op.name: [d.name for d in op.all_input_nodes if d.name in sizes]
             for op in trace.compute_nodes}

    def nbytes(group: Group) -> int:
        return sum(sizes[p] for p in {p for m in group.members for p in reads.get(m, ())})
    return nbytes


def _split_at_heavy_ops(run: list[_Op]) -> list[list[_Op]]:
    parts: list[list[_Op]] = [[]]
    seen_heavy = False
    for op in run:
        heavy = op_name(op.node) in HEAVY_OPS
        if heavy and seen_heavy:
            parts.append([])
        seen_heavy = seen_heavy or heavy
        parts[-1].append(op)
    return parts


def op_name(node: fx.Node) -> str:
    packet = getattr(node.target, "overloadpacket", None)
    if packet is not None:
        return packet.__name__
    return getattr(node.target, "__name__", str(node.target))


def _merge_to_fit(groups: list[Group], max_nodes: int) -> list[Group]:
    """Last resort for flat models: merge runs of adjacent forward groups of similar position."""
    layers = [g for g in groups if g.kind == "forward"]
    budget = max(1, (max_nodes - 1) // 2 - 1)  # forward groups allowed besides the loss
    if len(layers) <= budget:
        return groups
    size = math.ceil(len(layers) / budget)
    merged = []
    for start in range(0, len(layers), size):
        chunk = layers[start:start + size]
        merged.append(Group("forward", chunk[0].scope,
                            [name for g in chunk for name in g.members]))
    return merged + [g for g in groups if g.kind == "loss"]


def _merge_forward_only_outputs(groups: list[Group], trace: JointTrace,
                                may_merge=None) -> list[Group]:
    """Merge a group with the next ones when it produces both a tensor that backward reads and a
    tensor that only those next forward groups read (a batch norm's output feeding a separate
    ReLU module): a planner node's output lives until its last reader, so leaving the boundary
    there would keep the forward-only tensor alive until backward, which eager PyTorch does not.
    `may_merge(groups)`, where given, may refuse a merge.
    """
    store = trace.storages()
    aliases: dict[str, list[fx.Node]] = {}
    for name, s in store.items():
        aliases.setdefault(s.root, []).append(trace.node(name))
    k = 0
    while k < len(groups):
        group_of = {name: i for i, g in enumerate(groups) for name in g.members}
        readers_after = []
        for name in groups[k].members:
            s = store.get(name)
            if s is None or s.root != name or s.nbytes == 0:
                continue
            places = {group_of.get(u.name, "backward") for a in aliases[name] for u in a.users
                      if u.op == "call_function" and not _aliases(store, u.name, name)}
            places.discard(k)
            readers_after.append(places)
        read_by_backward = any("backward" in p for p in readers_after)
        forward_only = [max(p) for p in readers_after if p and "backward" not in p]
        end = max(forward_only, default=k)
        if read_by_backward and forward_only and end - k <= MAX_MERGE_SPAN and \
                (may_merge is None or may_merge(groups[k:end + 1])):
            merged = groups[k:end + 1]
            kind = "loss" if any(g.kind == "loss" for g in merged) else "forward"
            groups[k:end + 1] = [Group(kind, merged[0].scope,
                                       [name for g in merged for name in g.members])]
            continue  # look at the merged group again
        k += 1
    return groups


def _aliases(store, name: str, root: str) -> bool:
    return name in store and store[name].root == root


def _backward_groups(ops: list[_Op], fwd_groups: list[Group]) -> list[Group]:
    group_of = {name: i for i, g in enumerate(fwd_groups) for name in g.members}
    by_seq: dict[int, int] = {}
    for op in ops:
        if not op.backward and "seq_nr" in op.node.meta:
            by_seq.setdefault(op.node.meta["seq_nr"], group_of[op.node.name])
    assigned: dict[str, int] = {}
    members: dict[int, list[_Op]] = {}
    pending: list[_Op] = []
    last = len(fwd_groups) - 1  # the loss, where backward starts
    for op in (op for op in ops if op.backward):
        if op.node.target is operator.getitem:  # unpacks the op just before it
            target = assigned.get(op.node.args[0].name)
        elif op.node.meta.get("is_gradient_acc"):  # its seq_nr is not its forward op's
            target = None
        else:
            target = by_seq.get(op.node.meta.get("seq_nr"))
        if target is None:
            pending.append(op)
            continue
        for op_ in pending + [op]:
            members.setdefault(target, []).append(op_)
            assigned[op_.node.name] = target
        pending = []
        last = target
    for op_ in pending:
        members.setdefault(last, []).append(op_)
    return _acyclic([(fwd, sorted(ops_, key=lambda o: o.position))
                     for fwd, ops_ in members.items()], fwd_groups)


def _acyclic(parts: list[tuple[int, list[_Op]]], fwd_groups: list[Group]) -> list[Group]:
    """Merge backward groups that depend on each other both ways; order the rest topologically."""
    part_of = {op.node.name: k for k, (_, ops_) in enumerate(parts) for op in ops_}
    edges: list[set[int]] = [set() for _ in parts]
    for k, (_, ops_) in enumerate(parts):
        for op in ops_:
            for dep in op.node.all_input_nodes:
                j = part_of.get(dep.name)
                if j is not None and j != k:
                    edges[j].add(k)  # j must run before k
    components = _strongly_connected(len(parts), edges)
    comp_of = {k: c for c, comp in enumerate(components) for k in comp}
    first = [min(op.position for k in comp for op in parts[k][1]) for comp in components]
    comp_edges: list[set[int]] = [set() for _ in components]
    indegree = [0] * len(components)
    for j, targets in enumerate(edges):
        for k in targets:
            a, b = comp_of[j], comp_of[k]
            if a != b and b not in comp_edges[a]:
                comp_edges[a].add(b)
                indegree[b] += 1
    ready = sorted((first[c], c) for c in range(len(components)) if indegree[c] == 0)
    out = []
    while ready:
        _, c = ready.pop(0)
        comp = components[c]
        ops_ = sorted((op for k in comp for op in parts[k][1]), key=lambda o: o.position)
        # Named after the forward layer latest in the forward order (its backward runs first).
        scope = fwd_groups[max(parts[k][0] for k in comp)].scope
        out.append(Group("backward", scope, [op.node.name for op in ops_]))
        for b in comp_edges[c]:
            indegree[b] -= 1
            if indegree[b] == 0:
                ready.append((first[b], b))
                ready.sort()
    return out


def _strongly_connected(n: int, edges: list[set[int]]) -> list[list[int]]:
    """Tarjan's algorithm, iterative (graphs here have at most a few thousand groups)."""
    index = [-1] * n
    low = [0] * n
    on_stack = [False] * n
    stack: list[int] = []
    components: list[list[int]] = []
    counter = 0
    for root in range(n):
        if index[root] != -1:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack[root] = True
        while work:
            v, children = work[-1]
            advanced = False
            for w in children:
                if index[w] == -1:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack[w] = True
                    work.append((w, iter(sorted(edges[w]))))
                    advanced = True
                    break
                if on_stack[w]:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack[w] = False
                    comp.append(w)
                    if w == v:
                        break
                components.append(sorted(comp))
    return components
