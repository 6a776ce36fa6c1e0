"""Graph granularity against the memory floor: what `--max-nodes` buys.

For each model and node budget: ATen ops captured, planner nodes, capture time, the plain
schedule's peak, the floor, the least budget (what `edge-remat plan --budget 1000` names), as
bytes and as a share of the plain peak, the activation-only floor (smallest budget minus fixed
memory, against the plain peak minus fixed memory) and the node that sets it. `module` is the
grouping capture made before refinement (the finest module level within 200 nodes): the
baseline.

    python benchmarks/granularity.py                 # the issue's three models
    python benchmarks/granularity.py --quick         # small sizes, seconds
    python benchmarks/granularity.py --max-nodes 100,200,2000
"""

from __future__ import annotations

import argparse
import sys
import time

from edge_remat_agent.capture import DEFAULT_MAX_NODES, capture_model
from edge_remat_agent.floor import floor_node
from edge_remat.planner.build import plain_peak_bytes

from arguments import positive_ints  # this script's neighbour

FULL = [("resnet18", dict(batch=64, image=32)), ("mobilenet_v2", dict(batch=32, image=64)),
        ("bert-mini", dict(batch=16, seq=128))]
QUICK = [("resnet18", dict(batch=4, image=32)), ("mobilenet_v2", dict(batch=4, image=32)),
         ("bert-mini", dict(batch=2, seq=32))]


def row(model: str, sizes: dict, max_nodes: int | None) -> dict:
    start = time.perf_counter()
    if max_nodes is None:
        graph = capture_model(model, refined=False, **sizes).graph
    else:
        graph = capture_model(model, max_nodes=max_nodes, **sizes).graph
    seconds = time.perf_counter() - start
    peak = plain_peak_bytes(graph)
    need, k = floor_node(graph)
    node = graph.nodes[k]
    ops = node.attrs.get("ops") or [node.op]
    return {"model": model, "max_nodes": max_nodes, "ops": graph.capture["captured_nodes"],
            "nodes": len(graph), "capture_s": seconds, "plain_peak": peak,
            "fixed": graph.fixed_bytes, "floor": graph.fixed_bytes + need, "activation_floor": need,
            "set_by": f"{node.name} ({len(ops)} op{'s' if len(ops) > 1 else ''})"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes")
    parser.add_argument("--max-nodes", type=positive_ints,
                        default=f"{DEFAULT_MAX_NODES},2000",
                        help="node budgets to compare with the module-level grouping")
    args = parser.parse_args()
    budgets = [None] + args.max_nodes
    mb = 1e6
    print(f"{'model':<13} {'max_nodes':>9} {'ops':>5} {'nodes':>5} {'capture':>8} "
          f"{'plain MB':>9} {'fixed MB':>9} {'floor MB':>9} {'floor':>6} {'act MB':>7} "
          f"{'act':>6}  set by")
    for model, sizes in (QUICK if args.quick else FULL):
        for max_nodes in budgets:
            r = row(model, sizes, max_nodes)
            activations = r["plain_peak"] - r["fixed"]
            print(f"{model:<13} {max_nodes or 'module':>9} {r['ops']:>5} {r['nodes']:>5} "
                  f"{r['capture_s']:>7.1f}s {r['plain_peak'] / mb:>9.1f} {r['fixed'] / mb:>9.1f} "
                  f"{r['floor'] / mb:>9.1f} {r['floor'] / r['plain_peak']:>6.1%} "
                  f"{r['activation_floor'] / mb:>7.1f} "
                  f"{r['activation_floor'] / activations:>6.1%}  {r['set_by']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
