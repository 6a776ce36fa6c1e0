#!/usr/bin/env python3
"""How the planner scales: random layered graphs of 100 ... 5000 nodes at a budget multiplier.

For each size, in a fresh process (so that its peak RSS is the planner's for that size alone):
generate the graph (edge_remat.synthetic.random_layered, seed 1, the published RL family), plan
it with `--solver` (auto by default) within the time limit, validate the plan in the simulator,
and print the time to the first and to the returned plan, the TDI, the lower bound (as a TDI)
with its scope, the gap, and the process's peak RSS (and its RSS before planning). Draws time
against n on log-log axes to a PNG.

    python benchmarks/planner_scaling.py --sizes 100,250,500,1000 --time-limit 90
    python benchmarks/planner_scaling.py --sizes 2000,5000 --time-limit 60 --png scaling.png
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

COLUMNS = ("nodes", "edges", "status", "plan from", "first s", "best s", "total s", "TDI %",
           "LB TDI %", "gap %", "RSS MiB", "base MiB", "bound scope")


def one(n: int, budget: float, time_limit: float, solver: str, seed: int) -> dict:
    """Plan one size in this process; the row as a dict."""
    from edge_remat.planner.build import build_problem
    from edge_remat.planner.solve import NoPlan, solve
    from edge_remat.synthetic import random_layered

    graph = random_layered(n, seed=seed)
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    row = {"nodes": n, "edges": sum(len(node.inputs) for node in graph.nodes),
           "base_rss_mib": base_rss}
    started = time.perf_counter()
    problem = build_problem(graph, str(budget))
    try:
        report = solve(problem, solver, time_limit)
    except NoPlan as exc:
        row.update(status="no plan", note=str(exc), total_s=time.perf_counter() - started)
    else:
        info, ev = report.plan.solver, report.evaluation
        bound = info.get("lower_bound")
        row.update(status=info["status"] if ev.feasible else "INVALID", plan_from=info["name"],
                   first_plan_s=info.get("first_plan_s"), best_plan_s=info.get("best_plan_s"),
                   total_s=time.perf_counter() - started,
                   tdi_percent=report.plan.predicted["tdi_percent"],
                   lb_tdi_percent=None if bound is None else 100 * (bound / problem.plain_time - 1),
                   gap=info.get("gap"), bound_scope=info.get("bound_scope"),
                   valid=ev.feasible, peak_over_budget=ev.sim.peak_bytes / problem.budget_bytes)
    row["rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return row


def fmt(value, spec: str) -> str:
    return "-" if value is None or (isinstance(value, float) and not math.isfinite(value)) \
        else format(value, spec)


def print_row(row: dict) -> None:
    cells = [str(row["nodes"]), str(row.get("edges", "-")), row["status"],
             row.get("plan_from", "-"), fmt(row.get("first_plan_s"), ".2f"),
             fmt(row.get("best_plan_s"), ".2f"), fmt(row.get("total_s"), ".1f"),
             fmt(row.get("tdi_percent"), ".2f"), fmt(row.get("lb_tdi_percent"), ".2f"),
             fmt(None if row.get("gap") is None else 100 * row["gap"], ".1f"),
             fmt(row.get("rss_mib"), ".0f"), fmt(row.get("base_rss_mib"), ".0f"),
             row.get("bound_scope") or row.get("note", "")]
    print("  ".join(f"{c:>9}" if k < 12 else c for k, c in enumerate(cells)))
    sys.stdout.flush()


def draw(rows: list[dict], path: Path, budget: float, time_limit: float) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4.2))
    for key, label, marker in (("first_plan_s", "time to first plan", "o"),
                               ("best_plan_s", "time to best plan", "s")):
        points = [(r["nodes"], r[key]) for r in rows if r.get(key)]
        if points:
            ax.plot(*zip(*points), marker=marker, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("nodes (random layered graphs)")
    ax.set_ylabel("seconds")
    ax.set_title(f"planner scaling, budget {budget:g}x plain peak, limit {time_limit:g} s")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="100,250,500,1000,2000,5000")
    ap.add_argument("--budget", type=float, default=0.8, help="multiplier of the plain peak")
    ap.add_argument("--time-limit", type=float, default=90.0, help="per size, s (90)")
    ap.add_argument("--solver", default="auto")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--png", type=Path, default=Path("planner_scaling.png"))
    ap.add_argument("--json", type=Path, help="also write the rows here")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # the child process's size
    args = ap.parse_args(argv)

    if args.one is not None:
        print(json.dumps(one(args.one, args.budget, args.time_limit, args.solver, args.seed)))
        return 0

    sizes = [int(x) for x in args.sizes.split(",") if x.strip()]
    print(f"# random layered graphs (seed {args.seed}), budget {args.budget:g}x plain peak, "
          f"solver {args.solver}, time limit {args.time_limit:g} s per size, "
          f"{os.cpu_count()} cores; each size in a fresh process")
    print("# first/best s: time to the first / the returned plan; LB TDI: the lower bound as a "
          "TDI; RSS: the process's peak; base: its peak before planning (imports, graph)")
    print("  ".join(f"{c:>9}" if k < 12 else c for k, c in enumerate(COLUMNS)))
    rows, failed = [], 0
    for n in sizes:
        child = subprocess.run(
            [sys.executable, __file__, "--one", str(n), "--budget", str(args.budget),
             "--time-limit", str(args.time_limit), "--solver", args.solver,
             "--seed", str(args.seed)], capture_output=True, text=True,
            timeout=args.time_limit * 3 + 120)
        if child.returncode != 0:
            print(f"size {n}: the planner process failed:\n{child.stderr[-2000:]}")
            failed += 1
            continue
        row = json.loads(child.stdout.strip().splitlines()[-1])
        failed += row.get("valid") is False
        rows.append(row)
        print_row(row)
    if rows:
        draw(rows, args.png, args.budget, args.time_limit)
        print(f"# plot: {args.png}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
