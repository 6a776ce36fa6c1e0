"""Read POET's own MILP instances (`poet-benchmark-problem/1`, shared/benchmarks/poet/schema.json).

Per-node compute time and energy, output bytes, and page-in/page-out time and energy become the
graph's costs and a `flash` paging tier; `totals.noremat_peak_bytes` is the reference for
fractional budgets. POET's RAM budget covers activations only, so fixed memory is 0 here.
"""

from __future__ import annotations

from typing import Any

from edge_remat_agent.formats import Graph, Node
from edge_remat_agent.formats.fields import Reader
from edge_remat_agent.formats.graph import check_order


def graph_from_poet(obj: dict[str, Any], source: str) -> Graph:
    r = Reader(obj, source)
    nodes = []
    for k, _ in enumerate(r.list("nodes")):
        n = r.item("nodes", k)
        preds = n.list("preds")
        page = {"in_time_s": n.number("pagein_time_s", 0.0),
                "in_energy_j": n.number("pagein_energy_j"),
                "out_time_s": n.number("pageout_time_s", 0.0),
                "out_energy_j": n.number("pageout_energy_j")}
        nodes.append(Node(id=n.integer("id"), name=n.str("name"),
                          kind="backward" if n.raw("backward") else "forward",
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
    check_order(graph, source)
    return graph
