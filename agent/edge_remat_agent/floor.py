"""The memory floor of a graph: no schedule runs a node without its inputs, its output and its
workspace in RAM at once, so the largest such working set (plus fixed memory) bounds every
budget from below. The planner reports it; capture refines the graph where it is set."""

from __future__ import annotations

import math

from .formats import Graph
from .pebbling import pebbling_floor
from .units import format_size


def working_sets(graph: Graph, workspace: list[int] | None = None) -> list[int]:
    """Per node: its inputs' output bytes + its own output bytes + its workspace (the graph's,
    or `workspace` where a profile measured it)."""
    space = workspace if workspace is not None else [n.workspace_bytes for n in graph.nodes]
    return [sum(graph.node(d).out_bytes for d in node.inputs) + node.out_bytes + space[k]
            for k, node in enumerate(graph.nodes)]


def floor_node(graph: Graph, workspace: list[int] | None = None) -> tuple[int, int]:
    """(largest working set in bytes, fixed memory not included; index of the node with it).
    Among equal working sets the node of fewest captured ops: the finest name for the floor."""
    sets = working_sets(graph, workspace)
    k = max(range(len(sets)), key=lambda k: (sets[k], -len(graph.nodes[k].attrs.get("members")
                                                            or ()), -k))
    return sets[k], k


# Positions the game may visit for no_paging_floor (capture runs it at every refinement step):
# resnet18, mobilenet_v2 and bert-mini's refinements need at most 5,000 a graph, while an
# uncapped game on a 500-node random layered graph visited 43,000 in 0.9 s.
NO_PAGING_VISITS = 20_000


def no_paging_floor(graph: Graph) -> int:
    """The floor without paging in bytes, fixed memory not included: the pebbling game's
    (pebbling.py) where it is above the largest working set. Capped by positions visited, not
    by a clock, so one graph always gives one floor (capture's refinement compares groupings by
    it, and a recapture on the board must give the same graph)."""
    need, _ = floor_node(graph)
    game = pebbling_floor([node.out_bytes for node in graph.nodes],
                          [[graph.index[d] for d in node.inputs] for node in graph.nodes],
                          [node.workspace_bytes for node in graph.nodes], need, math.inf,
                          NO_PAGING_VISITS)
    return need if game is None else game.bytes


def describe_floor(graph: Graph, k: int, workspace: list[int] | None = None) -> str:
    """What node k holds at once, e.g. "node 113 (stages.0.conv2.1.backward:
    native_batch_norm_backward) needs 67.11 MB at once: inputs 50.33 MB (node 5
    stages.0.conv2.0 16.78 MB, ...), output 16.78 MB, workspace 0 B"."""
    node = graph.nodes[k]
    space = workspace[k] if workspace is not None else node.workspace_bytes
    inputs = sorted((graph.node(d) for d in node.inputs), key=lambda n: -n.out_bytes)
    held = sum(n.out_bytes for n in inputs)
    name = node_label(node)
    listed = ", ".join(f"node {n.id} {n.name} {format_size(n.out_bytes)}" for n in inputs[:4])
    more = f", {len(inputs) - 4} more" if len(inputs) > 4 else ""
    return (f"node {node.id!r} ({name}) needs {format_size(held + node.out_bytes + space)} at "
            f"once: inputs {format_size(held)}" + (f" ({listed}{more})" if inputs else "")
            + f", output {format_size(node.out_bytes)}, workspace {format_size(space)}")


def node_label(node) -> str:
    """A node's name with the ops it runs, e.g. "stages.0.conv2.1.backward:
    native_batch_norm_backward" or "layer1: 3 ops convolution, add, relu"."""
    ops = node.attrs.get("ops")
    if not ops:  # a graph that does not list its ops
        return f"{node.name}, main op {node.op}"
    if len(ops) == 1:
        return node.name if ops[0] in node.name else f"{node.name}: the op {ops[0]}"
    return f"{node.name}: {len(ops)} ops {', '.join(ops[:4])}" + (", ..." if len(ops) > 4
                                                                 else "")
