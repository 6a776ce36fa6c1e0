#!/usr/bin/env python3
"""The executor against plain eager PyTorch: step time and peak RSS, recompute overhead.

For each model: capture its training graph, time its nodes (the op profiler) and this machine's
flash (FlashStore, as the executor pages), plan with those costs at a budget of fixed memory +
60% of the plain schedule's activation memory with paging to flash (the solver's plan, and a
paging-only plan so that both mechanisms are measured), then run plain eager training and each
plan for --steps steps, each in a fresh process (so that none inherits another's allocator
state). Printed per run: step time (the best of the steps after the first: the first warms
caches, and on a shared machine other work only ever adds time) against plain and against the
plan's prediction; peak RSS (the largest after the first step: the planned run's first step also
holds the eager gradient check's reference) and what it saves against plain; the ledger's peak
against the plan's; recompute overhead and paging time, measured vs predicted; and whether the
first step's gradients were bitwise equal to eager.

    python benchmarks/executor.py                 # resnet18, mobilenet_v2, bert-mini
    python benchmarks/executor.py --quick         # CIFAR-size batches of 8, a minute or so
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

# Activations large enough against fixed memory (and the allocator's noise) for the resident
# peak to show what the plan saves; --quick runs the sizes the tests use.
MODELS = [("resnet18", dict(batch=64, image=32)), ("mobilenet_v2", dict(batch=32, image=64)),
          ("bert-mini", dict(batch=16, seq=256))]
QUICK = [("resnet18", dict(batch=8, image=32)), ("mobilenet_v2", dict(batch=8, image=32)),
         ("bert-mini", dict(batch=8, seq=128))]
FRACTION = 0.6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller batches")
    parser.add_argument("--models", help="comma-separated subset, e.g. resnet18,bert-mini")
    parser.add_argument("--steps", type=int, default=4, help="training steps per run")
    parser.add_argument("--page-dir", default=tempfile.gettempdir())
    parser.add_argument("--time-limit", type=float, default=10.0, help="solver seconds")
    parser.add_argument("--worker", choices=("plain", "plan"), help=argparse.SUPPRESS)
    parser.add_argument("--graph", help=argparse.SUPPRESS)
    parser.add_argument("--plan", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return _worker(args)

    from edge_remat_agent.profiler import board_identity, measure_flash
    identity = board_identity()
    print(f"# {identity['cpu']}, {identity['cpu_usable']} cores, torch {identity['torch']}, "
          f"{torch_threads()} threads; {args.steps} steps per run")
    flash = measure_flash(args.page_dir, (64 * 2**10, 2**20, 16 * 2**20), fsync=False).fit()
    print(f"# flash tier measured in {args.page_dir} (no fsync, cache dropped): read "
          f"{flash.read_bytes_per_s / 1e6:.0f} MB/s, write {flash.write_bytes_per_s / 1e6:.0f} "
          f"MB/s")
    print(f"# budget: fixed memory + {FRACTION:.0%} of the plain schedule's activation memory;"
          " RSS and time: steps after the first")
    print("# overhead: recompute time / first-compute time, measured/predicted; paging ms: "
          "measured/predicted per step; ledger - predicted: the executor's live-tensor peak "
          "against the plan's (tolerance: batch-norm statistics + 64 B); predicted s: the "
          "simulator with the op profiler's costs")
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for name, options in (QUICK if args.quick else MODELS):
            if args.models and name not in args.models.split(","):
                continue
            rows.append(_bench(name, options, flash, Path(work), args))
            _print_row(rows[-1])
    return 0


def _bench(name: str, options: dict, flash, work: Path, args) -> dict:
    from edge_remat.planner.build import build_problem, plain_peak_bytes
    from edge_remat.planner.solve import solve
    from edge_remat_agent.capture import capture_model
    from edge_remat_agent.formats import Profile
    from edge_remat_agent.profiler.ops import measure_nodes, ops_from
    captured = capture_model(name, **options)
    graph = captured.graph
    plain_peak = plain_peak_bytes(graph)
    budget = int(graph.fixed_bytes + FRACTION * (plain_peak - graph.fixed_bytes))
    # This machine's op costs (the op profiler) and flash: the plan's predictions are then this
    # machine's, not the capture's FLOP estimate. Power is not measured (time objective).
    ops = ops_from(measure_nodes(captured))
    profile = Profile("measured", {}, idle_w=0.0, active_w=1.0, tiers={"flash": flash}, ops=ops)
    problem = build_problem(graph, budget, profile, "time", None, "flash")
    graph_file = work / f"{name}.graph.json"
    graph.save(graph_file)
    row = {"name": f"{name} {_options(options)}", "plain_peak": plain_peak, "budget": budget,
           "fixed": graph.fixed_bytes, "plain": _run_worker("plain", graph_file, None, args),
           "plans": []}
    # The solver's plan, and a paging-only one (the solver rarely pages when recomputing is
    # cheaper): both mechanisms measured.
    for solver in ("auto", "heuristic:paging"):
        plan = solve(problem, solver, time_limit=args.time_limit).plan
        plan_file = work / f"{name}.{solver.replace(':', '-')}.plan.json"
        plan_dict = plan.to_dict()
        plan_dict["problem"]["tier_params"] = {"flash": flash.to_dict()}
        plan_file.write_text(json.dumps(plan_dict))
        label = f"{plan.solver.get('name')} ({plan.solver.get('status')})"
        row["plans"].append((label, _run_worker("plan", graph_file, plan_file, args)))
    return row


def _run_worker(mode: str, graph_file: Path, plan_file: Path | None, args) -> dict:
    command = [sys.executable, __file__, "--worker", mode, "--graph", str(graph_file),
               "--steps", str(args.steps), "--page-dir", args.page_dir]
    if plan_file is not None:
        command += ["--plan", str(plan_file)]
    done = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ))
    if done.returncode != 0:
        raise SystemExit(f"{mode} run failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _worker(args) -> int:
    from edge_remat_agent.executor import run_plain, run_plan
    from edge_remat_agent.formats import load_graph, load_plan
    graph = load_graph(args.graph)
    if args.worker == "plain":
        report = run_plain(graph, args.steps, seed=0)
    else:
        report = run_plan(graph, load_plan(args.plan), args.steps, args.page_dir, seed=0)
    print(json.dumps(report))
    return 0


def _steady(report: dict) -> list[dict]:
    return report["steps"][1:] or report["steps"]


def _print_row(row: dict) -> None:
    plain = row["plain"]
    best_time = lambda report: min(r["step_time_s"] for r in _steady(report))  # noqa: E731
    peak_rss = lambda report: max(r["rss_peak_bytes"] for r in _steady(report))  # noqa: E731
    print(f"\n{row['name']}: plain peak {_mib(row['plain_peak'])} (fixed {_mib(row['fixed'])}),"
          f" budget {_mib(row['budget'])}")
    print(f"  {'run':<34} {'step s':>7} {'x plain':>7} {'predicted s':>11} {'peak RSS':>11} "
          f"{'RSS saved':>10} {'ledger - predicted':>18} {'recomputes':>10} {'overhead':>15} "
          f"{'pages':>5} {'paging ms':>15}  gradients")
    print(f"  {'plain eager':<34} {best_time(plain):7.3f} {1:7.2f} {'':>11} "
          f"{_mib(peak_rss(plain)):>11}")
    for label, plan in row["plans"]:
        s, check = plan["summary"], plan["grad_check"]
        overhead = (f"{s['recompute_overhead_percent']:.1f}/"
                    f"{s['predicted_recompute_overhead_percent']:.1f}%")
        paging = f"{s['paging_s'] * 1e3:.0f}/{s['predicted_paging_s'] * 1e3:.0f}"
        ledger = f"{s['ledger_over_predicted_bytes']:+d} B"
        grads = "bitwise equal" if check["bitwise_equal"] else \
            f"DIFFER (max |diff| {check['max_abs_diff']:.3g})"
        print(f"  {'plan: ' + label:<34} {best_time(plan):7.3f} "
              f"{best_time(plan) / best_time(plain):7.2f} {s['predicted_time_s']:11.3f} "
              f"{_mib(peak_rss(plan)):>11} {_mib(peak_rss(plain) - peak_rss(plan)):>10} "
              f"{ledger:>18} {plan['recomputed']:>10} {overhead:>15} {plan['page_outs']:>5} "
              f"{paging:>15}  {grads} ({check['compared']})")


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def _options(options: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in options.items())


def torch_threads() -> int:
    import torch
    return torch.get_num_threads()


if __name__ == "__main__":
    sys.exit(main())
