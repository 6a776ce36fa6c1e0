"""The graph format: a training graph's nodes in a valid execution order.

Node ids are whatever the graph's author chose (ints or strings); plans refer to them as they are.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

from .errors import FormatError
from .fields import (MAX_GRAPH_BYTES, Reader, check_figure, check_header, dump_json,
                     load_json)
from .graph_details import PAGE_COST_FIGURES, WEIGHT_FILE, check_capture, check_node_attrs

NodeId = Union[int, str]
KINDS = ("forward", "loss", "backward", "update", "param")
VERSIONS = (1,)
# A graph's `dtype`: the floating type most of its parameters train in, by torch's name (a
# capture's, capture/assemble.py) or ONNX's (importers/onnx_import.py); null where unknown.
DTYPES = ("float32", "float16", "bfloat16", "float64")


@dataclass
class Node:
    id: NodeId
    name: str
    kind: str
    op: str
    inputs: list[NodeId]
    out_bytes: int
    workspace_bytes: int = 0
    time_s: float | None = None
    energy_j: float | None = None
    signature: str | None = None  # canonical op signature (op + shapes + dtype) for profile lookup
    attrs: dict[str, Any] = field(default_factory=dict)  # capture details the planner ignores

    @property
    def read_from_home(self) -> bool:
        """A param node whose group lives on a page tier: a plan may read it with a `page_in`
        from "home" (formats/plan.py) instead of computing it."""
        return self.kind == "param" and "io" in self.attrs

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "name": self.name, "kind": self.kind, "op": self.op,
                               "inputs": list(self.inputs), "out_bytes": self.out_bytes,
                               "workspace_bytes": self.workspace_bytes}
        for key in ("time_s", "energy_j", "signature"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.attrs:
            out["attrs"] = self.attrs
        return out


SUMS_SUFFIX = "sums"  # an update that reads and writes its group's gradient sums at home
# gradient clipping's nodes (capture/clip_nodes.py): a group's norms, and the global norm
GROUP_NORMS_OP = "grad_norms"
CLIP_OP = "clip_grad_norm"
# accumulating without clipping, the node that adds a group's gradients into its sums
# (capture/sum_nodes.py)
GRAD_SUMS_OP = "grad_sums"


def sums_added_apart(node: Node) -> bool:
    """Whether an accumulating graph's update node finds its group's gradients in the sums,
    added by a node of their own (a sums node, or clipping's group-norm node), rather than
    adding them itself (graphs captured before sums nodes)."""
    return bool(node.attrs.get("summed_apart")) or "clip_grad_norm" in node.attrs


def update_signature(optimizer: str, elements: int, home: str | None, clipped: bool,
                     sums: bool = False) -> str:
    """An update node's profile key: its optimizer, its group's size and where the group lives
    (`ram`, or the page tier it is homed on), `:clip` where it steps clipped gradients,
    `:sums` where its group's gradient sums live at the home too (its workspace holds them)."""
    return f"{optimizer}_update:{elements}:{home or 'ram'}" + (":clip" if clipped else "") + \
        (f":{SUMS_SUFFIX}" if sums else "")


def ram_homed_signature(node: Node) -> str | None:
    """For an update node whose group lives on a page tier, the key of the same update with the
    group in RAM, and for a group-norm node that adds sums kept at the home, the key of the
    same node in RAM (None for any other node); a group in RAM keeps its sums there."""
    if node.kind != "update" or not node.signature:
        return None
    parts = node.signature.split(":")
    if node.attrs.get("home"):
        optimizer_update, elements, _home, *rest = parts
        return ":".join([optimizer_update, elements, "ram",
                         *(part for part in rest if part != SUMS_SUFFIX)])
    return ":".join(parts[:-1]) if parts[-1] == SUMS_SUFFIX else None


def homed_bytes(graph: "Graph", tier: str = "flash") -> tuple[int, int]:
    """What the parameters' home on `tier` holds: (the parameters, optimizer state and gradient
    sums kept there, the most an update writes beside them). An update writes its group's new
    versions (parameters and state; the sums apart) before it lets the old ones go, so a full
    flash leaves the group as it was (executor/updates.py ParameterHome): the home needs the
    largest group's new version on top. QA: 14.7 MB held passed the check before the first
    step on a 20 MiB folder, and step 1's update of a 12.6 MB group (weight and momentum)
    found it full. Frozen groups read from the model's weight file (`attrs.io.source`) are
    not counted: that file is in the page folder already, and the home writes none of them.
    The executor checks the free space for it and the planner holds page-outs to the flash
    capacity left beside it: one figure for both."""
    param_node = {name: node for node in graph.nodes if node.kind == "param"
                  for name in node.attrs.get("params", ())}  # a synthetic graph's: none
    held = sum(node.out_bytes for node in graph.nodes if node.kind == "param"
               and node.attrs.get("home") == tier
               and node.attrs.get("io", {}).get("source") != WEIGHT_FILE)
    written = 0
    for node in graph.nodes:
        if node.kind != "update" or node.attrs.get("home") != tier:
            continue
        state, sums = node.attrs.get("state_bytes", 0), node.attrs.get("sum_bytes", 0)
        held += state + sums
        loaded = {param_node[name].id: param_node[name].out_bytes
                  for name in node.attrs.get("params", ()) if name in param_node}
        written = max(written, sum(loaded.values()) + state, sums)
    return held, written


@dataclass
class Graph:
    nodes: list[Node]
    name: str = "graph"
    fixed_bytes: int = 0  # parameters, gradients, optimizer state: resident for the whole step
    batch: int | None = None
    dtype: str | None = None
    capture: dict[str, Any] = field(default_factory=dict)  # how it was made (tool, source file)
    cost_source: str = "unknown"  # "profile" | "estimate" | "published" | "synthetic" | "unknown"
    planning_only: bool = False  # true when the executor cannot run it (e.g. imported from ONNX)

    def __post_init__(self) -> None:
        self.index = {node.id: i for i, node in enumerate(self.nodes)}

    def __len__(self) -> int:
        return len(self.nodes)

    @property
    def replayed(self) -> bool:
        """True when the executor replays this graph's ops (it was captured from a model):
        then their order carries state the edges do not show (random draws, buffer updates,
        optimizer steps in place), and a plan keeps it."""
        return not self.planning_only and any("outputs" in node.attrs for node in self.nodes)

    def node(self, node_id: NodeId) -> Node:
        return self.nodes[self.index[node_id]]

    def stepped_by(self) -> dict[int, int]:
        """Node index -> index of the first update node that steps parameters it reads (the
        update's `param_readers`): computed after that update, it would read the new weights."""
        stepped: dict[int, int] = {}
        for u, node in enumerate(self.nodes):
            for reader in node.attrs.get("param_readers", ()):
                stepped.setdefault(self.index[reader], u)
        return stepped

    def to_dict(self) -> dict[str, Any]:
        return {"format": "edge-remat/graph", "version": 1, "name": self.name,
                "fixed_bytes": self.fixed_bytes, "batch": self.batch, "dtype": self.dtype,
                "capture": self.capture, "cost_source": self.cost_source,
                "planning_only": self.planning_only,
                "nodes": [node.to_dict() for node in self.nodes]}

    def fingerprint(self) -> str:
        """Hash of what a plan depends on: structure, sizes, costs and fixed memory."""
        content = {"fixed": self.fixed_bytes,
                   "nodes": [[n.id, n.inputs, n.out_bytes, n.workspace_bytes, n.time_s, n.energy_j]
                             for n in self.nodes]}
        return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:16]

    def save(self, path: str | Path) -> None:
        dump_json(self.to_dict(), path, finite=True)


_NODE_FIELDS = {"id", "name", "kind", "op", "inputs", "out_bytes", "workspace_bytes", "time_s",
                "energy_j", "signature", "attrs"}
_GRAPH_FIELDS = {"format", "version", "name", "fixed_bytes", "batch", "dtype", "capture",
                 "cost_source", "planning_only", "nodes"}


def graph_from_dict(obj: Any, source: str = "<graph>") -> Graph:
    reader = Reader(obj, source)
    check_header(reader, "graph", VERSIONS)
    reader.reject_unknown(_GRAPH_FIELDS)
    nodes = [_node_from(reader.item("nodes", i)) for i in range(len(reader.list("nodes")))]
    capture = reader.child("capture", {})  # null or left out: {}
    check_capture(capture)
    graph = Graph(nodes=nodes, name=reader.str("name", "graph"),
                  fixed_bytes=reader.integer("fixed_bytes", 0),
                  batch=reader.integer("batch", None, minimum=1),
                  dtype=reader.str("dtype", None, choices=DTYPES),
                  capture=capture.obj,
                  cost_source=reader.str("cost_source", "unknown"),
                  planning_only=bool(reader.raw("planning_only", False)))
    check_order(graph, source)
    _check_param_readers(graph, source)
    check_bounds(graph, source)
    return graph


def check_bounds(graph: Graph, source: str) -> None:
    """The graph's sizes, times, energies and FLOPs within MAX_GRAPH_BYTES and MAX_FIGURE
    (fields.py, see there why): a FormatError naming the field that passes them. Every reader
    of a graph file (our format, the published dialects: importers/graph_import.py) runs it."""
    sizes = [("fixed_bytes", graph.fixed_bytes)]
    for i, node in enumerate(graph.nodes):
        sizes += [(f"nodes[{i}].out_bytes", node.out_bytes),
                  (f"nodes[{i}].workspace_bytes", node.workspace_bytes)]
        if "home" in node.attrs:
            sizes.append((f"nodes[{i}].attrs.state_bytes", node.attrs.get("state_bytes", 0)))
    total = 0
    for where, value in sizes:
        total += value
        if total > MAX_GRAPH_BYTES:
            raise FormatError(source, where, "the graph's sizes (fixed_bytes, every node's "
                              "out_bytes and workspace_bytes) to add up to at most 2**53 bytes "
                              "(8 PiB, far more than any board's memory; byte counts stay "
                              "exact as floats below it)", value,
                              "" if total == value else
                              f"the sizes up to this one add up to {total} bytes")
    for i, node in enumerate(graph.nodes):
        figures = [("time_s", node.time_s), ("energy_j", node.energy_j)]
        for tier, costs in (node.attrs.get("page_costs") or {}).items():
            figures += [(f"attrs.page_costs.{tier}.{key}", costs[key])
                        for key in PAGE_COST_FIGURES if key in costs]
        for key, value in figures:
            check_figure(source, f"nodes[{i}].{key}", value, "s" if key.endswith("_s") else "J",
                         " a node")
        flops = node.attrs.get("flops")  # a board's roofline divides it (costs.board_roofline)
        if isinstance(flops, (int, float)) and not isinstance(flops, bool):
            check_figure(source, f"nodes[{i}].attrs.flops", flops, "FLOPs", " a node")


def _check_param_readers(graph: Graph, source: str) -> None:
    """An update's `param_readers` name nodes of this graph (`Graph.stepped_by` looks them up)."""
    for position, node in enumerate(graph.nodes):
        for i, reader in enumerate(node.attrs.get("param_readers", ())):
            if reader not in graph.index:
                raise FormatError(source, f"nodes[{position}].attrs.param_readers[{i}]",
                                  "ids of nodes in this graph", reader)


def _node_from(r: Reader) -> Node:
    r.reject_unknown(_NODE_FIELDS)
    node_id = r.raw("id")
    if isinstance(node_id, bool) or not isinstance(node_id, (int, str)):
        raise r.error("id", "an integer or a string", node_id)
    inputs = r.list("inputs", [])
    for i, dep in enumerate(inputs):
        if isinstance(dep, bool) or not isinstance(dep, (int, str)):
            raise r.error(f"inputs[{i}]", "a node id (integer or string)", dep)
    attrs = r.child("attrs", {})  # null or left out: {}
    check_node_attrs(attrs)
    return Node(id=node_id, name=r.str("name", str(node_id)), kind=r.str("kind", "forward", KINDS),
                op=r.str("op", "unknown"), inputs=list(inputs), out_bytes=r.integer("out_bytes"),
                workspace_bytes=r.integer("workspace_bytes", 0), time_s=r.number("time_s", None),
                energy_j=r.number("energy_j", None), signature=r.str("signature", None),
                attrs=attrs.obj)


def check_order(graph: Graph, source: str, inputs_field: str = "inputs") -> None:
    """Ids unique, inputs known and earlier in the order (which also rules out cycles).
    `inputs_field`: what the file calls a node's inputs (POET's `preds`), for the errors."""
    if not graph.nodes:
        raise FormatError(source, "nodes", "at least one node")
    seen: set[NodeId] = set()
    for position, node in enumerate(graph.nodes):
        where = f"nodes[{position}]"
        if node.id in seen:
            raise FormatError(source, f"{where}.id", "a unique node id", node.id)
        for dep in node.inputs:
            if dep == node.id:
                raise FormatError(source, f"{where}.{inputs_field}", "no self-loop", dep)
            if dep not in graph.index:
                raise FormatError(source, f"{where}.{inputs_field}", "ids of nodes in this graph", dep)
            if dep not in seen:
                raise FormatError(source, f"{where}.{inputs_field}",
                                  "inputs that come earlier in the node order (a cycle, or nodes "
                                  "out of execution order)", dep)
        if len(set(node.inputs)) != len(node.inputs):
            raise FormatError(source, f"{where}.{inputs_field}", "each input once", node.inputs)
        seen.add(node.id)


def load_graph(path: str | Path) -> Graph:
    return graph_from_dict(load_json(path), str(path))
