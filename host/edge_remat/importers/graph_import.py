"""Read a graph file: our own format, or the networkx node-link files of the published benchmarks.

Node-link dialects (shared/benchmarks/README.md):
  - `duration` / `out_cost`, links keyed "0" -> "1" (the random layered graphs);
  - `cost_cpu` / `cost_ram` / `backward`, links `source` -> `target` (Checkmate's Keras graphs).
A node's id is its `id` field, else its `name`; the graph attribute `order`, when present, is the
execution order of the plain schedule, else a topological order that keeps the file's node order.
"""

from __future__ import annotations

import heapq
from pathlib import Path
from typing import Any

from edge_remat_agent.formats import FormatError, Graph, Node, graph_from_dict
from edge_remat_agent.formats.fields import Reader, load_json
from edge_remat_agent.formats.graph import check_bounds, check_order

_COST_KEYS = ("duration", "cost_cpu")
_SIZE_KEYS = ("out_cost", "cost_ram")


def load_graph_file(path: str | Path) -> Graph:
    """The graph in `path`, whatever its dialect, within the bounds of what a graph may hold
    (formats/graph.py check_bounds)."""
    graph = _load_any(path)
    check_bounds(graph, str(path))  # the published dialects' too (our format's on load)
    return graph


def _load_any(path: str | Path) -> Graph:
    source = str(path)
    obj = load_json(path)
    if not isinstance(obj, dict):
        raise FormatError(source, "<root>", "a JSON object", type(obj).__name__)
    if obj.get("format") == "edge-remat/graph":
        return graph_from_dict(obj, source)
    if obj.get("format") == "poet-benchmark-problem/1":
        from .poet_import import graph_from_poet
        return graph_from_poet(obj, source)
    if "format" not in obj and "nodes" in obj and ("links" in obj or "edges" in obj):
        return graph_from_node_link(obj, source)
    raise FormatError(source, "format", "'edge-remat/graph', 'poet-benchmark-problem/1', or a "
                      "networkx node-link graph (with 'nodes' and 'links')", obj.get("format"))


def graph_from_node_link(obj: dict[str, Any], source: str) -> Graph:
    r = Reader(obj, source)
    raw_nodes = r.list("nodes")
    raw_links = r.list("links" if "links" in obj else "edges")
    attrs = obj.get("graph") or {}
    nodes: dict[Any, dict[str, Any]] = {}
    for k, _ in enumerate(raw_nodes):
        n = r.item("nodes", k)
        node_id = n.raw("id") if "id" in n.obj else n.raw("name")
        if isinstance(node_id, bool) or not isinstance(node_id, (int, str)):
            raise n.error("id", "an integer or string node id", node_id)
        if node_id in nodes:
            raise n.error("id", "a unique node id", node_id)
        cost_key = next((key for key in _COST_KEYS if key in n.obj), None)
        size_key = next((key for key in _SIZE_KEYS if key in n.obj), None)
        if size_key is None:
            raise n.error("out_cost", "an output size ('out_cost' or 'cost_ram')")
        nodes[node_id] = {
            "id": node_id, "name": str(n.obj.get("name", node_id)),
            "time_s": None if cost_key is None else float(n.number(cost_key)),
            "out_bytes": n.integer(size_key),
            "kind": "backward" if n.boolean("backward", False) else "forward", "inputs": []}
    for k, link in enumerate(raw_links):
        lr = Reader(link, source, f"links[{k}]")
        src_key, dst_key = ("source", "target") if "source" in link else ("0", "1")
        src, dst = lr.raw(src_key), lr.raw(dst_key)
        for key, end in ((src_key, src), (dst_key, dst)):
            if not isinstance(end, (int, str)) or isinstance(end, bool) or end not in nodes:
                raise lr.error(key, "the id of a node in this graph", end)
        if src == dst:
            raise lr.error(dst_key, "an edge between two different nodes (a self-loop)", dst)
        if src not in nodes[dst]["inputs"]:
            nodes[dst]["inputs"].append(src)
    order = attrs.get("order") if isinstance(attrs, dict) else None
    topological = _topological(nodes, source)  # a cycle is the links' fault, whatever the order
    if order is not None:
        if not isinstance(order, list) or sorted(map(repr, order)) != sorted(map(repr, nodes)):
            raise FormatError(source, "graph.order", "every node id exactly once")
        _check_given_order(nodes, order, source)
    else:
        order = topological
    graph = Graph(nodes=[Node(op=nodes[i]["name"], **nodes[i]) for i in order],
                  name=str(attrs.get("name", Path(source).stem)) if isinstance(attrs, dict)
                  else Path(source).stem, capture={"tool": "networkx node-link", "file": source},
                  cost_source="published")
    check_order(graph, source)
    return graph


def _check_given_order(nodes: dict[Any, dict[str, Any]], order: list[Any], source: str) -> None:
    """The file's execution order runs every node after its inputs (said of graph.order, the
    field the file has, not of the nodes list our format would build from it)."""
    done = set()
    for node_id in order:
        late = [dep for dep in nodes[node_id]["inputs"] if dep not in done]
        if late:
            raise FormatError(source, "graph.order", "an execution order that runs every node "
                              f"after its inputs (node {node_id!r} comes before its input "
                              f"{late[0]!r})")
        done.add(node_id)


def _topological(nodes: dict[Any, dict[str, Any]], source: str) -> list[Any]:
    """Kahn's algorithm, taking ready nodes in file order so that ties keep the author's order."""
    position = {node_id: k for k, node_id in enumerate(nodes)}
    indegree = {node_id: len(n["inputs"]) for node_id, n in nodes.items()}
    users: dict[Any, list[Any]] = {node_id: [] for node_id in nodes}
    for node_id, n in nodes.items():
        for dep in n["inputs"]:
            users[dep].append(node_id)
    ready = [(position[i], i) for i, d in indegree.items() if d == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, node_id = heapq.heappop(ready)
        order.append(node_id)
        for user in users[node_id]:
            indegree[user] -= 1
            if indegree[user] == 0:
                heapq.heappush(ready, (position[user], user))
    if len(order) < len(nodes):
        raise FormatError(source, "links", "an acyclic graph (it has the cycle "
                          + " -> ".join(map(repr, _a_cycle(nodes, indegree))) + ")")
    return order


def _a_cycle(nodes: dict[Any, dict[str, Any]], indegree: dict[Any, int]) -> list[Any]:
    """One cycle among the nodes Kahn's algorithm left (each of them has an input left too):
    walk back through such inputs until a node repeats."""
    stuck = {i for i, d in indegree.items() if d > 0}
    path, seen, node_id = [], {}, next(iter(stuck))
    while node_id not in seen:
        seen[node_id] = len(path)
        path.append(node_id)
        node_id = next(dep for dep in nodes[node_id]["inputs"] if dep in stuck)
    cycle = path[seen[node_id]:][::-1]  # inputs first: the direction of the links
    return cycle + [cycle[0]]
