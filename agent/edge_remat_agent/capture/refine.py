"""Refine module-level groups where memory is decided, down to single ATen ops.

No schedule runs a planner node without its inputs, its output and its workspace in RAM at once,
so the node with the largest such working set sets the floor, the least budget (floor.py). A
coarse group (a whole block's backward) has a large one; the ops inside it each have a smaller
one. `refine` repeatedly splits the group with the largest working set one step finer, while the
graph stays within `max_nodes`:

  1. into the runs of its submodules (one level deeper in the module tree than all its ops
     share; a parent's glue ops join the run before them),
  2. into runs that each start at a heavy op (conv, matmul, ...),
  3. into single ops: each op that allocates memory with its getitems; ops that allocate nothing
     (views) go with the first op that reads them.

A single op that cannot be split any more may still read a producer that holds more than it
reads (a node's outputs are one planner tensor): that producer is split next. Groups that would
hold a forward-only tensor alive until backward are merged back as coarsening does
(`_merge_forward_only_outputs`). The result is the grouping with the lowest floor seen, the
first (coarsest) that reaches it: max_nodes bounds granularity and memory decides where it
goes, and a graph no finer than its floor needs keeps the solvers fast (splitting on to
max_nodes once made digits-cnn 200 nodes that CP-SAT could not prove optimal in 20 s). Among
groupings of one floor, the floor without paging (floor.no_paging_floor) decides: a plan
without paging tiers (no profile) cannot go below it, and it falls where the working-set floor
is set elsewhere, by a node no split reaches (bert-mini's word-embedding update: its forward
layers, one 42 MiB tensor each, split to 89.4 MiB from 100.1).
"""

from __future__ import annotations

import operator
from typing import Callable

from torch import fx

from ..floor import floor_node, no_paging_floor, working_sets
from ..formats import FormatError, Graph
from ..formats.graph import check_order
from .coarsen import (MAX_MERGE_SPAN, Group, _merge_forward_only_outputs, _ops,
                      _split_at_heavy_ops, op_name)
from .trace import JointTrace

BuildGraph = Callable[[list[Group]], Graph]
# A finer grouping of the same floor is kept only where its floor without paging is this much
# lower: resnet18's splits past the coarsest grouping gained it 600 bytes for 34 more nodes.
NO_PAGING_GAIN = 0.01


def refine(trace: JointTrace, groups: list[Group], max_nodes: int, build: BuildGraph
           ) -> list[Group]:
    """Split the groups with the largest working sets while the graph has at most max_nodes
    nodes; `build(groups)` assembles the planner graph (one node per group, plus nodes without
    members such as the optimizer update)."""
    splitter = _Splitter(trace)
    graph = build(groups)
    # what refinement lowers: the working-set floor, then the floor without paging
    best = ((floor_node(graph)[0], no_paging_floor(graph)), groups)
    done: set[tuple[str, ...]] = set()  # groups that cannot (or may not) be split
    while len(graph) < max_nodes:
        step = _split_one(graph, groups, splitter, done, max_nodes, build)
        if step is None:
            break
        groups, graph = step
        need = floor_node(graph)[0]
        if need <= best[0][0]:  # the game only where this grouping could be kept
            floors = (need, no_paging_floor(graph))
            if _lower(floors, best[0]):
                best = (floors, groups)
    return best[1]


def _lower(floors: tuple[int, int], best: tuple[int, int]) -> bool:
    """A lower working-set floor; or the same, and a floor without paging lower by
    NO_PAGING_GAIN at least."""
    return floors[0] < best[0] or (floors[0] == best[0]
                                   and floors[1] < best[1] * (1 - NO_PAGING_GAIN))


def _split_one(graph: Graph, groups: list[Group], splitter: "_Splitter",
               done: set[tuple[str, ...]], max_nodes: int, build: BuildGraph):
    """Split the first splittable group, by largest working set: the node itself, else the
    producers it reads from that hold more than it reads."""
    # by every member: a node may lack its group's first one (a gradient view that assemble
    # moves to the node owning its storage)
    index = {name: i for i, g in enumerate(groups) for name in g.members}
    sets = working_sets(graph)
    for k in sorted(range(len(graph)), key=lambda k: (-sets[k], k)):
        for node in [graph.nodes[k], *_wasteful_producers(graph, graph.nodes[k])]:
            members = node.attrs.get("members")
            if not members or members[0] not in index:
                continue
            i = index[members[0]]
            key = tuple(groups[i].members)
            if key in done:
                continue
            candidate = _split_group(groups, i, splitter)
            if candidate is None or len(graph) + len(candidate) - len(groups) > max_nodes:
                done.add(key)
                continue
            try:
                new_graph = build(candidate)
                check_order(new_graph, "refined graph")
            except FormatError:  # cannot happen for prefix splits; never keep a bad order
                done.add(key)
                continue
            if len(new_graph) > max_nodes:  # the split also added param and update nodes
                done.add(key)
                continue
            return candidate, new_graph
    return None


def split_to_ops(trace: JointTrace, groups: list[Group]) -> list[Group]:
    """Every group split down to single ATen ops (the operator-level graph): each op that
    allocates is a node with its getitems and the views it reads first; only the merges that
    keep a forward-only tensor from living until backward remain (as in `refine`)."""
    splitter = _Splitter(trace)
    i = 0
    while i < len(groups):
        candidate = _split_group(groups, i, splitter)
        if candidate is None:
            i += 1
        else:  # part i may split further; each split adds a group, so this ends
            groups = candidate
    return groups


def _wasteful_producers(graph: Graph, node) -> list:
    """Input nodes that hold values this node does not read (their output is one tensor to the
    planner, so this node's working set counts all of it), largest first."""
    reads = set(node.attrs.get("reads", {}))
    producers = [graph.node(d) for d in node.inputs]
    wasteful = [p for p in producers if set(p.attrs.get("outputs", [])) - reads]
    return sorted(wasteful, key=lambda p: -p.out_bytes)


def _split_group(groups: list[Group], i: int, splitter: "_Splitter") -> list[Group] | None:
    """The groups with group i split one step finer, or None when that gains no node. When the
    one-step split is merged back (a norm's part holds both its forward-only output and the
    statistics backward reads, until they are apart), single ops are tried."""
    for finest in (False, True):
        parts = splitter.split(groups[i], finest)
        if len(parts) < 2:
            continue
        if groups[i].kind == "backward":
            return groups[:i] + parts + groups[i + 1:]
        following = []
        for group in groups[i + 1:i + 1 + MAX_MERGE_SPAN]:
            if group.kind == "backward":
                break
            following.append(group)
        # A part must not hold a forward-only tensor alive until backward: merge as coarsening
        # does. Values read outside this window count as read by backward, which only ever
        # merges more than coarsening would.
        window = _merge_forward_only_outputs(parts + following, splitter.trace)
        candidate = groups[:i] + window + groups[i + 1 + len(following):]
        if len(candidate) > len(groups):
            return candidate
    return None


def name_ops(trace: JointTrace, graph: Graph) -> None:
    """Record in each node's attrs the ATen ops it runs that allocate memory (`ops`): what a
    floor message names."""
    splitter = _Splitter(trace)
    for node in graph.nodes:
        members = node.attrs.get("members")
        if members:
            node.attrs["ops"] = [op_name(trace.node(m)) for m in members
                                 if m in splitter.allocates
                                 and trace.node(m).target is not operator.getitem]


# Ops that allocate without writing (dropout's empty_like before its bernoulli): apart from the
# op that fills them they would be nodes whose recomputation gives other (garbage) values.
UNINITIALIZED = ("empty", "empty_like", "new_empty", "empty_strided")


def _uninitialized(op) -> bool:
    packet = getattr(op.node.target, "overloadpacket", None)
    return packet is not None and packet.__name__ in UNINITIALIZED


class _Splitter:
    def __init__(self, trace: JointTrace):
        self.trace = trace
        self.ops = {op.node.name: op for op in _ops(trace)}
        store = trace.storages()
        self.roots = {name: s.root for name, s in store.items()}
        self.allocates = {name for name, s in store.items() if s.root == name}
        for node in trace.compute_nodes:  # an op with several results allocates through them
            if node.target is operator.getitem and node.name in self.allocates:
                parent = node.args[0]
                if isinstance(parent, fx.Node):
                    self.allocates.add(parent.name)

    def split(self, group: Group, finest: bool = False) -> list[Group]:
        ops = sorted((self.ops[name] for name in group.members), key=lambda op: op.position)
        strategies = (self._single_ops,) if finest else \
            (self._by_submodule, _split_at_heavy_ops, self._single_ops)
        for strategy in strategies:
            runs = [run for run in strategy(ops) if run]
            if len(runs) > 1:
                parts = self._rehome(ops, runs)
                if len(parts) > 1:
                    return [self._group(group, part) for part in parts]
        return [group]

    @staticmethod
    def _by_submodule(ops: list) -> list[list]:
        paths = [op.scope.split(".") if op.scope else [] for op in ops]
        common = _common_prefix(paths)
        depth = len(common) + 1
        if not any(len(p) >= depth for p in paths):
            return [ops]
        runs: list[tuple[str | None, list]] = []
        for op, path in zip(ops, paths):
            key = ".".join(path[:depth]) if len(path) >= depth else None  # None: parent glue
            if runs and (key is None or runs[-1][0] in (key, None)):
                runs[-1][1].append(op)
                if runs[-1][0] is None:
                    runs[-1] = (key, runs[-1][1])
            else:
                runs.append((key, [op]))
        return [run for _, run in runs]

    @staticmethod
    def _single_ops(ops: list) -> list[list]:
        return [[op] for op in ops]

    def _rehome(self, ops: list, runs: list[list]) -> list[list]:
        """Getitems join the op they unpack; ops that allocate nothing (views) or allocate
        without writing (empty_like) join the first part that reads them; parts left with nothing that allocates join their neighbour."""
        part_of = {op.node.name: k for k, run in enumerate(runs) for op in run}

        def parent(op):
            arg = op.node.args[0] if op.node.target is operator.getitem else None
            return arg.name if isinstance(arg, fx.Node) and arg.name in part_of else None

        for op in ops:
            if parent(op) is not None:
                part_of[op.node.name] = part_of[parent(op)]
        for op in reversed(ops):
            name = op.node.name
            if parent(op) is not None or (name in self.allocates and not _uninitialized(op)):
                continue
            readers = [u for u in op.node.users if u.name in part_of]
            # A view op with several results (split) is read through its getitems.
            readers += [r for u in readers if u.target is operator.getitem
                        for r in u.users if r.name in part_of]
            later = [part_of[u.name] for u in readers if u.target is not operator.getitem]
            root = self.roots.get(name)
            if not later and root != name and root in part_of:
                # A view no op here reads (a gradient taken as the transpose of a mm) stays
                # with the op that owns its storage: apart, the node holding the view would
                # keep the owner's storage alive after the owner is freed or paged out.
                later = [part_of[root]]
            if later:
                part_of[name] = min(later)
                for u in readers:
                    if u.target is operator.getitem:
                        part_of[u.name] = part_of[name]
        parts: list[list] = [[] for _ in runs]
        for op in ops:
            parts[part_of[op.node.name]].append(op)
        merged: list[list] = []
        for part in parts:
            if not part:
                continue
            if merged and not any(op.node.name in self.allocates for op in part):
                merged[-1].extend(part)
            else:
                merged.append(part)
        if len(merged) > 1 and not any(op.node.name in self.allocates for op in merged[0]):
            leading = merged.pop(0)  # views only: they join the part that reads them
            merged[0] = leading + merged[0]
        return [sorted(part, key=lambda op: op.position) for part in merged]

    def _group(self, whole: Group, part: list) -> Group:
        kind = whole.kind
        if kind == "loss" and self.trace.loss not in {op.node.name for op in part}:
            kind = "forward"
        scope = _common_scope([op.scope for op in part if op.node.name in self.allocates]
                              or [op.scope for op in part])
        group = Group(kind, scope, [op.node.name for op in part])
        anchors = [op for op in part if op.node.name in self.allocates
                   and op.node.target is not operator.getitem]
        if len(anchors) == 1:  # one op: name it, so that a floor it sets names it
            where = scope or "model"
            suffix = ".backward" if kind == "backward" else ""
            group.label = f"{where}{suffix}:{op_name(anchors[0].node)}"
        return group


def _common_scope(scopes: list[str]) -> str:
    return ".".join(_common_prefix([s.split(".") if s else [] for s in scopes]))


def _common_prefix(paths: list[list[str]]) -> list[str]:
    common = paths[0]
    for path in paths[1:]:
        n = 0
        while n < min(len(common), len(path)) and common[n] == path[n]:
            n += 1
        common = common[:n]
    return common
