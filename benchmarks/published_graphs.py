#!/usr/bin/env python3
"""Run the planner on the published rematerialization benchmark graphs, next to the published numbers.

For each graph in shared/benchmarks/graphs (and, on request, random layered graphs of any size)
and each budget (ceil(multiplier x plain peak), the published definition; CM1 also at its two
absolute budgets), run every baseline and then the planner with each chosen solver (CP-SAT by
default; each solve starts from the best baseline and its time limit includes the baselines),
validate every plan with the simulator, and print one row per (graph, budget, method): status,
TDI %, peak / budget, wall time, time to the first and to the best plan, the lower bound as a
TDI % and the gap, next to the published figures.

    python benchmarks/published_graphs.py --time-limit 10 --graphs rl100,CM1
    python benchmarks/published_graphs.py --graphs rl250 --budgets 0.8 --time-limit 60
    python benchmarks/published_graphs.py --graphs none --random-layered 1000 --budgets 0.8
    python benchmarks/published_graphs.py --solvers cpsat,milp --backend highs --json out.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

from edge_remat.importers.graph_import import load_graph_file
from edge_remat.planner.baselines import BASELINES
from edge_remat.planner.build import plain_peak_bytes
from edge_remat.planner.evaluate import evaluate
from edge_remat.planner.milp import BACKENDS
from edge_remat.planner.problem import InfeasibleBudget, Problem
from edge_remat.planner.solve import NoPlan, solve
from edge_remat.synthetic import published_w, random_layered
from edge_remat_agent.costs import build_costs

from arguments import (comma_list, int_at_least, non_negative_int,  # this script's neighbour
                       positive_float, positive_floats, positive_int)

DEFAULT_SHARED = Path(__file__).resolve().parents[1].parent / "shared"

# The published graphs' short names (shared/benchmarks/README.md).
ALIASES = {"RL1": "rl100", "RL2": "rl250", "CM1": "fcn8_vgg_train"}

# Absolute budgets the papers report for some graphs, besides the multipliers. Their "GB" are
# binary: 11.3 GiB and 10.0 GiB are 0.90x and 0.80x of CM1's plain peak (13.48e9 bytes), the
# multipliers the table pairs them with; decimal GB would be 0.84x and 0.74x.
ABSOLUTE_BUDGETS = {"fcn8_vgg_train": [("11.3 GB", 11.3 * 2**30), ("10.0 GB", 10.0 * 2**30)]}

# Published results, from the table in shared/benchmarks/README.md (Moccasin, ICML 2023; the
# Checkmate MILP as run by the Moccasin authors). Key: (graph file stem, budget label);
# value: (Checkmate MILP, Moccasin CP-SAT), each (TDI %, solve time s) or None (no solution).
PUBLISHED: dict[tuple[str, str], tuple[tuple[float, float] | None, tuple[float, float] | None]] = {
    ("rl100", "0.9x"): ((0.8, 18.5), (0.8, 9.3)),
    ("rl100", "0.8x"): ((2.3, 22.7), (2.3, 9.5)),
    ("rl250", "0.9x"): ((0.9, 685.0), (0.9, 55.0)),
    ("rl250", "0.8x"): (None, (4.9, 640.0)),  # Checkmate: no solution within the limit
    ("fcn8_vgg_train", "11.3 GB"): ((0.0, 6.3), (0.0, 3.1)),
    ("fcn8_vgg_train", "10.0 GB"): ((0.1, 5.6), (0.1, 3.1)),
}

COLUMNS = [  # (header, width, align)
    ("graph", 15, "<"), ("budget", 8, "<"), ("method", 10, "<"), ("status", 12, "<"),
    ("TDI %", 7, ">"), ("peak/B", 7, ">"), ("time s", 8, ">"), ("first s", 7, ">"),
    ("best s", 7, ">"), ("LB TDI %", 9, ">"),
    ("gap %", 7, ">"), ("published: Checkmate | Moccasin / note", 0, "<"),
]


def fmt_row(values: list[str]) -> str:
    cells = []
    for (_, width, align), value in zip(COLUMNS, values):
        cells.append(f"{value:{align}{width}}" if width else value)
    return "  ".join(cells).rstrip()


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None or not math.isfinite(value) else format(value, spec)


def budget_label(mult: float) -> str:
    return f"{mult:g}x"


def published_text(stem: str, label: str) -> str:
    entry = PUBLISHED.get((stem, label))
    if entry is None:
        return ""

    def one(x):
        return "no solution" if x is None else f"{x[0]:.1f}% / {x[1]:g} s"
    return f"{one(entry[0])} | {one(entry[1])}"


def parse_graphs(text: str | None, available: list[Path]) -> list[Path]:
    if not text:
        return available
    by_stem = {p.stem: p for p in available}
    chosen = []
    for name in (s.strip() for s in text.split(",") if s.strip()):
        stem = ALIASES.get(name.upper(), name).removesuffix(".json")
        if stem not in by_stem:
            raise SystemExit(f"unknown graph {name!r} (have: {', '.join(by_stem)}; "
                             f"aliases: {', '.join(f'{k}={v}' for k, v in ALIASES.items())})")
        chosen.append(by_stem[stem])
    return chosen


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graphs", help="comma-separated subset, by file stem or alias "
                    "(rl100,rl250,fcn8_vgg_train,vgg16_train or RL1,RL2,CM1); default all")
    ap.add_argument("--budgets", type=positive_floats, default="0.9,0.8,0.7",
                    help="comma-separated multipliers of the plain peak (default 0.9,0.8,0.7)")
    ap.add_argument("--time-limit", type=positive_float, default=60.0,
                    help="time limit of each solve, s, baselines included (60)")
    ap.add_argument("--solvers", default="cpsat",
                    help="comma-separated: cpsat, milp, auto (default cpsat)")
    ap.add_argument("--backend", choices=BACKENDS, default="cbc", help="MILP backend (cbc)")
    ap.add_argument("--workers", "--threads", type=positive_int, default=None,
                    help="solver threads (default: all cores)")
    ap.add_argument("--random-layered", default="",  # 3 nodes: the least random_layered takes
                    type=comma_list(int_at_least(3), allow_empty=True),
                    help="also plan random layered graphs of these sizes, e.g. 1000 "
                         "(edge_remat.synthetic, seed 1, the published w of the nearest size)")
    ap.add_argument("--milp-max-nodes", type=non_negative_int, default=150,
                    help="skip the MILP on graphs with more nodes than this (150)")
    ap.add_argument("--shared", type=Path, default=DEFAULT_SHARED,
                    help=f"the shared/ folder (default {DEFAULT_SHARED})")
    ap.add_argument("--json", type=Path, help="also write every row to this JSON file")
    args = ap.parse_args(argv)

    graph_dir = args.shared / "benchmarks" / "graphs"
    available = sorted(graph_dir.glob("*.json"))
    if not available:
        raise SystemExit(f"error: no graphs in {graph_dir}: give --shared, the folder that "
                         "holds benchmarks/graphs (the project's ../shared)")
    paths = parse_graphs(args.graphs, available) if args.graphs != "none" else []
    solvers = [x.strip() for x in args.solvers.split(",") if x.strip()]
    sizes, multipliers = args.random_layered, args.budgets

    started = time.perf_counter()
    rows: list[dict] = []
    invalid = 0
    print(f"# graphs from {graph_dir}; solvers {', '.join(solvers)} (MILP backend "
          f"{args.backend}, skipped above {args.milp_max_nodes} nodes); time limit "
          f"{args.time_limit:g} s per solve; {os.cpu_count()} cores")
    print("# TDI % = compute of the schedule / sum of node costs - 1; LB TDI % = the solver's "
          "lower bound / sum of node costs - 1; gap = (value - bound) / value; first s / best s "
          "= time to the first / the returned plan")
    header = fmt_row([h for h, _, _ in COLUMNS])
    print(header)
    print("-" * len(header))
    sys.stdout.flush()

    def emit(row: dict, note: str = "") -> None:
        rows.append(row)
        print(fmt_row([row["graph"], row["budget"], row["method"], row["status"],
                       fmt(row.get("tdi_percent"), ".2f"), fmt(row.get("peak_over_budget"), ".3f"),
                       fmt(row.get("time_s"), ".2f"), fmt(row.get("first_plan_s"), ".2f"),
                       fmt(row.get("best_plan_s"), ".2f"),
                       fmt(row.get("lb_tdi_percent"), ".2f")
                       + ("*" if row.get("bound_corrected") else ""),
                       fmt(None if row.get("gap") is None else 100 * row["gap"], ".2f"),
                       note]))
        sys.stdout.flush()

    sources = [(path.stem, path) for path in paths] + [(f"rl-synth{n}", n) for n in sizes]
    for stem, source in sources:
        graph = load_graph_file(source) if isinstance(source, Path) else \
            random_layered(source, seed=1, w=published_w(source))
        t0 = time.perf_counter()
        peak = plain_peak_bytes(graph)
        costs = build_costs(graph)
        total_cost = sum(costs.time_s)
        print(f"# {stem}: {len(graph)} nodes, plain peak {peak} bytes "
              f"({time.perf_counter() - t0:.2f} s), sum of node costs {total_cost:g}")
        budgets = [(budget_label(m), math.ceil(m * peak)) for m in multipliers]
        budgets += [(label, int(b)) for label, b in ABSOLUTE_BUDGETS.get(stem, [])]

        for label, budget in budgets:
            pub = published_text(stem, label)
            first = [True]

            def note(extra: str = "") -> str:
                text = pub if first[0] else ""
                first[0] = False
                return " ; ".join(x for x in (text, extra) if x)

            base = {"graph": stem, "budget": label, "budget_bytes": budget,
                    "budget_multiplier": budget / peak, "plain_peak_bytes": peak,
                    "nodes": len(graph), "published": PUBLISHED.get((stem, label))}
            p = Problem(graph, costs, budget)
            try:
                p.check_budget()
            except InfeasibleBudget as e:
                smallest = e.smallest_bytes
                mult = smallest / peak if smallest else None
                emit({**base, "method": "-", "status": "infeasible",
                      "smallest_budget_bytes": smallest, "smallest_multiplier": mult},
                     note(f"infeasible: needs at least {fmt(mult, '.3f')}x plain peak"
                          f" ({smallest} bytes)"))
                continue

            best = None  # (objective, decisions) of the best feasible baseline
            for name, baseline in BASELINES.items():
                t1 = time.perf_counter()
                decisions = baseline(p)
                ev = evaluate(p, decisions) if decisions is not None else None
                elapsed = time.perf_counter() - t1
                if ev is None:
                    emit({**base, "method": name, "status": "no plan", "time_s": elapsed},
                         note("no tiers to page to" if name == "paging" and not p.tiers else ""))
                    continue
                status = "feasible" if ev.feasible else "over budget"
                emit({**base, "method": name, "status": status,
                      "tdi_percent": 100 * (ev.sim.compute_time_s / total_cost - 1),
                      "peak_over_budget": ev.sim.peak_bytes / budget, "time_s": elapsed,
                      "recomputed": ev.sim.recomputed}, note())
                if ev.feasible and (best is None or ev.objective < best[0]):
                    best = (ev.objective, decisions)

            for solver in solvers:
                if solver == "milp" and p.n > args.milp_max_nodes:
                    emit({**base, "method": solver, "status": "skipped"},
                         note(f"MILP skipped: {p.n} nodes (use --milp-max-nodes)"))
                    continue
                t1 = time.perf_counter()
                try:
                    report = solve(p, solver, args.time_limit, args.backend, args.workers)
                except NoPlan as exc:
                    emit({**base, "method": solver, "status": "no plan",
                          "time_s": time.perf_counter() - t1}, note(str(exc)))
                    continue
                elapsed = time.perf_counter() - t1
                ev, info = report.evaluation, report.plan.solver
                bound = info["lower_bound"]
                row = {**base, "method": solver, "status": info["status"], "time_s": elapsed,
                       "first_plan_s": info.get("first_plan_s"),
                       "best_plan_s": info.get("best_plan_s"), "lower_bound": bound,
                       "lb_tdi_percent": None if bound is None else 100 * (bound / total_cost - 1),
                       "gap": info["gap"], "tdi_percent": 100 * (ev.sim.compute_time_s / total_cost - 1),
                       "peak_over_budget": ev.sim.peak_bytes / budget,
                       "recomputed": ev.sim.recomputed, "valid": ev.feasible,
                       "plan_from": info["name"], "bound_scope": info.get("bound_scope")}
                extra = [f"plan from {info['name']}"] if info["name"] != solver.split(":")[0] \
                    and not info["name"].startswith(solver) else []
                if not ev.feasible:
                    invalid += 1
                    row["status"] = "INVALID"
                    extra.insert(0, f"!!! INVALID: plan peaks at {ev.sim.peak_bytes} bytes > "
                                 f"budget {budget} !!!")
                emit(row, note(" ; ".join(extra)))

    total = time.perf_counter() - started
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "total_wall_s": total,
                                         "time_limit_s": args.time_limit,
                                         "solvers": solvers, "backend": args.backend},
                                        indent=2, default=str))
    if invalid:
        print(f"!!! {invalid} INVALID MILP plan(s): the simulator rejects them !!!")
    print(f"total wall time: {total:.1f} s")
    return 1 if invalid else 0


if __name__ == "__main__":
    sys.exit(main())
