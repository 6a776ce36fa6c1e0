#!/usr/bin/env python3
"""How the planner scales: random layered graphs of 100 ... 5000 nodes at a budget multiplier,
and operator-level training graphs of real models.

For each size, in a fresh process (so that its peak RSS is the planner's for that size alone):
generate the graph (edge_remat.synthetic.random_layered, the published RL family; one graph per
seed of `--seeds`, 1 by default; width parameter w of the published graph nearest in size,
`--w` to set it), plan it with `--solver` (auto by default) within the time
limit, validate the plan in the simulator, and print the time to the first and to the returned
plan, the TDI, the lower bound (as a TDI) with its scope, the gap, and the process's peak RSS
(RSS MiB: this process's or its largest child's; tree MiB: the peak while planning of this
process and its children summed, since the planner runs other orders and LNS seeds beside
itself where cores are spare; base MiB: its RSS before planning); with several seeds, the
median TDI per size.
Draws time against n on log-log axes to a PNG.

`--graphs resnet50,gpt2-small` adds operator-level graphs (`edge-remat graph --operator-level
--params-home flash`: one node per ATen op that allocates; the shapes of issue 9), captured once
into `--cache` and planned the same way, in the same table.

    python benchmarks/planner_scaling.py --sizes 100,250,500,1000 --time-limit 90
    python benchmarks/planner_scaling.py --sizes 2000,5000 --time-limit 60 --png scaling.png
    python benchmarks/planner_scaling.py --graphs resnet50,gpt2-small --budget 0.25 --time-limit 60
    python benchmarks/planner_scaling.py --sizes 2000,5000 --frontier 25

`--paging-cost R` also lets the planner page to a flash tier, as POET's joint problem does:
each way, the graph's mean tensor takes R times its mean node's compute (random layered graphs
cost 1..999 units, not seconds, so a measured bandwidth would make paging free there). Where
recomputation alone cannot meet a budget, paging can, down to the floor.

    python benchmarks/planner_scaling.py --sizes 5000 --seeds 1 --time-limit 60 --paging-cost 1

`--frontier S` adds, per random layered graph, the lowest budget at which the feasibility phase
finds a plan within S seconds (bisection between the floor and 1.0, FRONTIER_STEPS tries): where
the asked budget gets no plan, how far above it the planner's reach ends.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# The neighbour arguments.py, also where a test loads this file by path (appended: the folder's
# script names must not shadow installed modules in that process).
if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.append(str(Path(__file__).resolve().parent))
from arguments import (comma_list, int_at_least, names_among, non_negative_int,  # noqa: E402
                       positive_float)

# Operator-level graphs: the zoo model and the `edge-remat graph` options (issue 9's shapes).
# Parameters live on flash, so that a budget below parameters + optimizer state is plannable.
MODEL_GRAPHS = {
    "resnet50": ["--batch", "8", "--image", "64"],
    "gpt2-small": [],
    "resnet18": ["--batch", "8", "--image", "32"],
}
CAPTURE_OPTIONS = ["--operator-level", "--params-home", "flash"]
# Random layered graphs: the sizes planned by default, and what --sizes takes (3 nodes, the
# least random_layered makes: source, sink and one more).
DEFAULT_SIZES = [100, 250, 500, 1000, 2000, 5000]
LAYERED_SIZES = comma_list(int_at_least(3))

FRONTIER_STEPS = 6  # bisection tries of --frontier: the multiplier to within (1 - floor) / 64

COLUMNS = ("graph", "nodes", "edges", "status", "plan from", "first s", "best s", "total s", "TDI %",
           "LB TDI %", "gap %", "RSS MiB", "tree MiB", "base MiB", "bound scope")
ALIGNED = len(COLUMNS) - 1  # right-aligned cells; the last (bound scope or note) runs on


def peak_rss_mib() -> float:
    """This process's peak RSS, or a solver child's (planner/isolated.py) if that was larger."""
    return max(resource.getrusage(who).ru_maxrss
               for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)) / 1024


class TreeRss:
    """The peak of this process's RSS plus its children's, summed, sampled every INTERVAL_S
    on a thread: the planner runs other orders and LNS seeds in child processes beside
    itself, and getrusage gives only the largest single process."""

    INTERVAL_S = 0.05

    def __init__(self):
        import threading
        self.peak, self._stop = 0, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        import psutil
        me = psutil.Process()
        while not self._stop.is_set():
            total = me.memory_info().rss
            for child in me.children(recursive=True):
                try:
                    total += child.memory_info().rss
                except psutil.Error:  # it ended between the listing and the reading
                    pass
            self.peak = max(self.peak, total)
            self._stop.wait(self.INTERVAL_S)

    def stop(self) -> float:
        """The peak seen, MiB."""
        self._stop.set()
        self._thread.join()
        return self.peak / 2**20


def capture(name: str, cache: Path) -> Path:
    """The operator-level graph of a zoo model, captured once into `cache` (a fresh process);
    its capture time is kept beside it."""
    if name not in MODEL_GRAPHS:
        raise SystemExit(f"error: unknown graph {name!r}: use one of {', '.join(MODEL_GRAPHS)}")
    path = cache / f"{name}-op.json"
    if not path.exists():
        cache.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        child = subprocess.run([sys.executable, "-m", "edge_remat", "graph", "--model", name,
                                *MODEL_GRAPHS[name], *CAPTURE_OPTIONS, "-o", str(path),
                                "--force", "--json"], capture_output=True, text=True)
        if child.returncode != 0:
            raise SystemExit(f"error: capturing {name} failed:\n{child.stderr[-2000:]}")
        summary = json.loads(child.stdout)
        summary["wall_s"] = time.perf_counter() - started
        path.with_suffix(".capture.json").write_text(json.dumps(summary))
    return path


def one(n: int | None, budget: float, time_limit: float, solver: str, seed: int,
        graph_file: Path | None = None, frontier_s: float | None = None,
        order: str = "auto", w: float | None = None,
        paging_cost: float | None = None) -> dict:
    """Plan one size (or one captured graph) in this process; the row as a dict."""
    from edge_remat.planner.build import build_problem
    from edge_remat.planner.ordering import ORDER_SHARE
    from edge_remat.planner.solve import NoPlan, solve
    from edge_remat.synthetic import published_w, random_layered

    if graph_file is None:
        w = published_w(n) if w is None else w
        graph, label = random_layered(n, seed=seed, w=w), "rl"
    else:
        from edge_remat_agent.formats.graph import load_graph
        graph, label = load_graph(graph_file), graph_file.stem.removesuffix("-op")
    base_rss = peak_rss_mib()
    row = {"graph": label, "nodes": len(graph), "w": w if graph_file is None else None,
           "paging_cost": paging_cost,
           "edges": sum(len(node.inputs) for node in graph.nodes), "base_rss_mib": base_rss}
    started, tree = time.perf_counter(), TreeRss()
    paging = {} if paging_cost is None else \
        {"paging": "flash", "tiers": flash_at_cost(graph, paging_cost)}
    problem = build_problem(graph, str(budget), order=order,
                            order_time_s=ORDER_SHARE * time_limit, **paging)
    row["order"] = "given" if problem.given_graph is None else "memory"
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
                   order_seed=info.get("order_seed"),
                   orders_tried=len(info.get("orders_tried") or ()),
                   valid=ev.feasible, peak_over_budget=ev.sim.peak_bytes / problem.budget_bytes,
                   page_ins=ev.sim.page_ins, recomputed=ev.sim.recomputed,
                   step_increase_percent=100 * (ev.sim.time_s / problem.plain_time - 1))
    row["rss_mib"], row["tree_rss_mib"] = peak_rss_mib(), tree.stop()
    if frontier_s and graph_file is None:
        row.update(frontier(graph, frontier_s, order))
    return row


def flash_at_cost(graph, ratio: float) -> dict:
    """A flash tier on which the graph's mean tensor takes `ratio` times its mean node's
    compute time to move, each way (no latency)."""
    from edge_remat_agent.formats import Tier
    computed = [node for node in graph.nodes if node.time_s > 0]
    mean_bytes = sum(node.out_bytes for node in computed) / len(computed)
    mean_time = sum(node.time_s for node in computed) / len(computed)
    rate = mean_bytes / (ratio * mean_time)
    return {"flash": Tier(read_bytes_per_s=rate, write_bytes_per_s=rate, latency_s=0.0)}


def frontier(graph, seconds: float, order: str) -> dict:
    """The lowest budget multiplier (of FRONTIER_STEPS bisection tries) at which the feasibility
    phase finds a plan within `seconds`, and the floor it starts from."""
    from edge_remat.planner.build import build_problem
    from edge_remat.planner.solve import feasibility_plans_at

    plain = build_problem(graph, "1.0", order=order)
    floor = plain.smallest_budget()[0] / plain.budget_bytes
    low, high = floor, 1.0  # no schedule below the floor
    for _ in range(FRONTIER_STEPS):
        mid = (low + high) / 2
        if feasibility_plans_at(plain, int(mid * plain.budget_bytes),
                                time.perf_counter() + seconds):
            high = mid
        else:
            low = mid
    return {"frontier": high, "frontier_floor": floor, "frontier_s": seconds}


def fmt(value, spec: str) -> str:
    return "-" if value is None or (isinstance(value, float) and not math.isfinite(value)) \
        else format(value, spec)


def print_row(row: dict) -> None:
    graph = row.get("graph", "rl")
    if row.get("w") is not None:
        graph += f" w{row['w']:g}"
    if row.get("seed") is not None:
        graph += f" s{row['seed']}"
    cells = [graph, str(row["nodes"]), str(row.get("edges", "-")), row["status"],
             row.get("plan_from", "-"), fmt(row.get("first_plan_s"), ".2f"),
             fmt(row.get("best_plan_s"), ".2f"), fmt(row.get("total_s"), ".1f"),
             fmt(row.get("tdi_percent"), ".2f"), fmt(row.get("lb_tdi_percent"), ".2f"),
             fmt(None if row.get("gap") is None else 100 * row["gap"], ".1f"),
             fmt(row.get("rss_mib"), ".0f"), fmt(row.get("tree_rss_mib"), ".0f"),
             fmt(row.get("base_rss_mib"), ".0f"),
             row.get("bound_scope") or row.get("note", "")]
    if row.get("paging_cost") and row.get("page_ins") is not None:
        cells[-1] += (f"  [flash at {row['paging_cost']:g}x a node's cost: "
                      f"{row['page_ins']} page-ins, {row['recomputed']} recomputations; "
                      f"step +{row['step_increase_percent']:.2f}% with paging's time]")
    if row.get("frontier") is not None:
        cells[-1] += (f"  [lowest budget planned: {row['frontier']:.3f}x plain peak, "
                      f"{row['frontier_s']:g} s a try; floor {row['frontier_floor']:.3f}x]")
    print("  ".join(f"{c:>10}" if k < ALIGNED else c for k, c in enumerate(cells)))
    sys.stdout.flush()


def print_medians(rows: list[dict]) -> None:
    """Per random layered size: the median TDI over its seeds, and how many were planned."""
    for n in sorted({r["nodes"] for r in rows if r["graph"] == "rl"}):
        own = [r for r in rows if r["graph"] == "rl" and r["nodes"] == n]
        planned = sorted(r["tdi_percent"] for r in own if r.get("tdi_percent") is not None)
        median = statistics.median(planned) if planned else None
        print(f"# {n} nodes: {len(planned)} of {len(own)} seeds planned; TDI % by seed "
              + ", ".join(f"{r['seed']}: {fmt(r.get('tdi_percent'), '.2f')}" for r in own)
              + f"; median of those planned {fmt(median, '.2f')}")


def draw(rows: list[dict], path: Path, budget: float, time_limit: float) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4.2))
    for key, label, marker in (("first_plan_s", "time to first plan", "o"),
                               ("best_plan_s", "time to best plan", "s")):
        points = [(r["nodes"], r[key]) for r in rows if r.get(key) and r["graph"] == "rl"]
        if points:
            ax.plot(*zip(*points), marker=marker, label=label)
        named = [r for r in rows if r.get(key) and r["graph"] != "rl"]
        for k, r in enumerate(named):  # operator-level graphs: single points, named
            ax.scatter([r["nodes"]], [r[key]], marker=marker, color="black", zorder=3,
                       label=f"{label}, operator-level" if k == 0 else None)
            ax.annotate(r["graph"], (r["nodes"], r[key]), fontsize=7,
                        xytext=(4, 2), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("nodes (random layered graphs; black: operator-level models)")
    ax.set_ylabel("seconds")
    ax.set_title(f"planner scaling, budget {budget:g}x plain peak, limit {time_limit:g} s")
    ax.grid(True, which="both", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=LAYERED_SIZES, help="random layered graphs' node counts "
                    "(default 100,250,500,1000,2000,5000; none when only --graphs is given)")
    ap.add_argument("--graphs", type=names_among(MODEL_GRAPHS, "model"), default=[],
                    help="operator-level graphs of zoo models, e.g. "
                    f"resnet50,gpt2-small (known: {', '.join(MODEL_GRAPHS)})")
    ap.add_argument("--cache", type=Path,
                    default=Path(tempfile.gettempdir()) / "edge-remat-planner-scaling",
                    help="where captured graphs are kept between runs")
    ap.add_argument("--budget", type=positive_float, default=0.8,
                    help="multiplier of the plain peak")
    ap.add_argument("--time-limit", type=positive_float, default=90.0, help="per size, s (90)")
    ap.add_argument("--solver", default="auto")
    ap.add_argument("--order", default="auto", choices=("auto", "given", "memory"),
                    help="execution order of the random layered graphs (planner/ordering.py): "
                         "given keeps the published order, as Checkmate's and Moccasin's "
                         "problem does")
    ap.add_argument("--w", type=positive_float,
                    help="random layered graphs' width parameter (default: the published "
                    "graph's of the nearest size, edge_remat.synthetic.published_w: 500 nodes "
                    "0.36, 1000 and up 0.31)")
    ap.add_argument("--seed", type=int, default=1, help=argparse.SUPPRESS)  # the child's
    ap.add_argument("--seeds", type=comma_list(non_negative_int), default="1",
                    help="random layered graphs' seeds, e.g. 0,1,2,3,4: each size is planned "
                    "once per seed, and the median TDI per size printed")
    ap.add_argument("--png", type=Path, default=Path("planner_scaling.png"))
    ap.add_argument("--json", type=Path, help="also write the rows here")
    ap.add_argument("--frontier", type=positive_float, metavar="S",
                    help="also find the lowest budget planned within S s a try (rl graphs)")
    ap.add_argument("--paging-cost", type=positive_float, metavar="R",
                    help="also page to a flash tier where the mean tensor takes R times the "
                         "mean node's compute, each way")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # the child process's size
    ap.add_argument("--one-graph", type=Path, help=argparse.SUPPRESS)  # or its graph file
    args = ap.parse_args(argv)

    if args.one is not None or args.one_graph is not None:
        print(json.dumps(one(args.one, args.budget, args.time_limit, args.solver, args.seed,
                             args.one_graph, args.frontier, args.order, args.w,
                             args.paging_cost)))
        return 0

    names, seeds = args.graphs, args.seeds
    sizes = args.sizes if args.sizes is not None else [] if names else DEFAULT_SIZES
    jobs = [(f"{n} seed {seed}", ["--one", str(n), "--seed", str(seed)])
            for n in sizes for seed in seeds]
    for name in names:
        path = capture(name, args.cache)
        info = json.loads(path.with_suffix(".capture.json").read_text())
        print(f"# {name}: operator-level graph ({' '.join(MODEL_GRAPHS[name] + CAPTURE_OPTIONS)})"
              f", {info['nodes']} planner nodes from {info['captured_nodes']} ATen nodes, "
              f"captured in {info['capture_s']:.1f} s ({info['wall_s']:.1f} s with the process), "
              f"plain peak {info['plain_peak_bytes'] / 2**20:.1f} MiB; {path}")
        jobs.append((name, ["--one-graph", str(path)]))
    widths = "published by size" if args.w is None else f"{args.w:g}"
    print(f"# graph rl: random layered (seeds {','.join(map(str, seeds))}, w {widths}); "
          f"budget {args.budget:g}x plain peak, "
          f"solver {args.solver}, order {args.order}, time limit {args.time_limit:g} s per graph, "
          f"{os.cpu_count()} cores; each graph in a fresh process")
    print("# first/best s: time to the first / the returned plan; LB TDI: the lower bound as a "
          "TDI; RSS: the process's peak; base: its peak before planning (imports, graph)")
    print("  ".join(f"{c:>10}" if k < ALIGNED else c for k, c in enumerate(COLUMNS)))
    rows, failed = [], 0
    for label, which in jobs:
        child = subprocess.run(
            [sys.executable, __file__, *which, "--budget", str(args.budget),
             "--time-limit", str(args.time_limit), "--solver", args.solver,
             "--order", args.order, *(["--w", str(args.w)] if args.w is not None else []),
             *(["--frontier", str(args.frontier)] if args.frontier else []),
             *(["--paging-cost", str(args.paging_cost)] if args.paging_cost else [])],
            capture_output=True, text=True,
            timeout=args.time_limit * 3 + 120 + (args.frontier or 0) * FRONTIER_STEPS * 1.5)
        if child.returncode != 0:
            print(f"{label}: the planner process failed:\n{child.stderr[-2000:]}")
            failed += 1
            continue
        row = json.loads(child.stdout.strip().splitlines()[-1])
        row["seed"] = int(which[-1]) if which[0] == "--one" else None
        failed += row.get("valid") is False
        rows.append(row)
        print_row(row)
    if len(seeds) > 1:
        print_medians(rows)
    if rows:
        draw(rows, args.png, args.budget, args.time_limit)
        print(f"# plot: {args.png}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
