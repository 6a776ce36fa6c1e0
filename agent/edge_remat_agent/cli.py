"""`edge-remat-agent`: the board-side command. Standard library only (torch where it runs models)."""

from __future__ import annotations

import argparse
import json
import sys

from . import __version__


def _check_plan(args: argparse.Namespace) -> int:
    from .costs import build_costs
    from .formats import FormatError, load_graph, load_plan
    from .simulate import PlanError, simulate
    try:
        graph, plan = load_graph(args.graph), load_plan(args.plan)
        if plan.graph_fingerprint and plan.graph_fingerprint != graph.fingerprint():
            raise FormatError(args.plan, "graph_fingerprint",
                              f"{graph.fingerprint()} (the graph on this board)",
                              plan.graph_fingerprint)
        result = simulate(graph, build_costs(graph), plan.stages, plan.budget_bytes)
    except (FormatError, PlanError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({"valid": True, "fits_budget": result.fits_budget,
                      "peak_bytes": result.peak_bytes, "budget_bytes": plan.budget_bytes}))
    return 0 if result.fits_budget else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="edge-remat-agent",
                                     description="The edge-remat agent that runs on the board.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("version", help="print the agent's version")
    check = sub.add_parser("check-plan", help="validate a plan against a graph on this board")
    check.add_argument("plan")
    check.add_argument("--graph", required=True)
    args = parser.parse_args(argv)
    if args.command == "version":
        print(__version__)
        return 0
    return _check_plan(args)


if __name__ == "__main__":
    sys.exit(main())
