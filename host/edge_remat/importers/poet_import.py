"""Read POET's own MILP instances (`poet-benchmark-problem/1`, shared/benchmarks/poet/schema.json).

Per-node compute time and energy, output bytes, and page-in/page-out time and energy become the
graph's costs and a `flash` paging tier; `totals.noremat_peak_bytes` is the reference for
fractional budgets. POET's RAM budget covers activations only, so fixed memory is 0 here.
The graph's edges are the nodes' `preds`; the file's `edges` list must say the same.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from edge_remat_agent.formats import Graph, Node
from edge_remat_agent.formats.fields import Reader
from edge_remat_agent.formats.graph import check_order


def graph_from_poet(obj: dict[str, Any], source: str) -> Graph:
    r = Reader(obj, source)
    nodes, read = [], []  # read: (pred, node) for every pred, repeats kept as in `edges`
    for k, _ in enumerate(r.list("nodes")):
        n = r.item("nodes", k)
        preds = n.list("preds")
        for j, pred in enumerate(preds):
            if isinstance(pred, bool) or not isinstance(pred, int):
                raise n.error(f"preds[{j}]", "a node id (an integer)", pred)
        read += [(pred, n.raw("id")) for pred in preds]
        page = {"in_time_s": n.number("pagein_time_s", 0.0),
                "in_energy_j": n.number("pagein_energy_j"),
                "out_time_s": n.number("pageout_time_s", 0.0),
                "out_energy_j": n.number("pageout_energy_j")}
        nodes.append(Node(id=n.integer("id"), name=n.str("name"),
                          kind="backward" if n.boolean("backward") else "forward",
                          op=n.str("layer_type", "layer"),
                          inputs=list(dict.fromkeys(preds)),  # POET repeats multi-edges
                          out_bytes=n.integer("mem_bytes"), time_s=n.number("runtime_s"),
                          energy_j=n.number("compute_energy_j"),
                          attrs={"page_costs": {"flash": page}}))
    totals = r.child("totals")
    graph = Graph(nodes=nodes, name=f"poet:{obj.get('model')}/{obj.get('platform')}",
                  capture={"tool": "POET benchmark problem", "file": source,
                           "reference_peak_bytes": totals.integer("noremat_peak_bytes")},
                  cost_source="published (POET device model)", planning_only=True)
    check_order(graph, source, "preds")  # the nodes' own faults (ids, preds, order) first
    _check_edges(r, read)
    return graph


def _check_edges(r: Reader, from_preds: list[tuple[int, int]]) -> None:
    """The file's `edges` against the nodes' `preds`, which the graph is built from: an edge
    edited in one only (a cycle, a node reading itself, a node that is not there) was planned
    without a word, as if never made."""
    edges = []
    for k, edge in enumerate(r.list("edges")):
        if not (isinstance(edge, list) and len(edge) == 2 and
                all(isinstance(v, int) and not isinstance(v, bool) for v in edge)):
            raise r.error(f"edges[{k}]", "a pair of node ids [u, v]", edge)
        edges.append(tuple(edge))
    listed, built = Counter(edges), Counter(from_preds)
    if listed != built:
        only_edges, only_preds = sorted(listed - built), sorted(built - listed)
        u, v = (only_edges or only_preds)[0]
        where = "in 'edges' but not in node {v}'s preds" if only_edges else \
            "in node {v}'s preds but not in 'edges'"
        raise r.error("edges", "the edges the nodes' preds give (the graph is built from "
                      "preds: edit both alike)", f"[{u}, {v}] " + where.format(v=v))
