#!/usr/bin/env python3
"""Parameters read from their home ahead of use, against read where their param node computes,
planned and measured, in one process.

Each model is captured with its parameters and optimizer state homed on flash (`params_home=
"flash"`, operator-level), and costed with this machine's op costs (profiler.ops) and its flash
(a FlashStore in --page-dir: fsync, page cache dropped, as the parameter home reads it). Two
plans at --fraction of plain PyTorch's peak, without paging activations:

  in place  planned with io="sync": each param node computes (reads its group) where the
            solver put it, stopping compute (the planner before reads from home existed)
  ahead     planned with io="overlap": each param node's compute is a page_in from "home",
            hoisted ahead of its first use by the overlap post-pass

They run in interleaved rounds, `ahead` twice: with the reads on the executor's IO thread
(run_plan(paging_io="overlap")) and synchronous where the plan issues them ("ahead, sync": what
the IO thread saves). Each timed sample is the second step of a two-step run_plan. Printed:
median step times, each against `in place`, predicted against measured, the share of the reads'
time hidden behind compute (planned: the IO timeline; measured: 1 - the step's wait for the IO
thread / the IO thread's time), and the gradients of `ahead` against eager, bit for bit.

    python benchmarks/home_reads.py --quick
    python benchmarks/home_reads.py        # resnet18 b16 64x64 and bert-mini b16 seq 128
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from end_to_end import MODELS, QUICK  # noqa: E402
from overlap import FLASH_SIZES, _share  # noqa: E402
from arguments import (existing_folder, names_among, positive_float,  # noqa: E402
                       positive_int)

RUNS = ("in place", "ahead, sync", "ahead")


def run_step(captured, plan, page_dir: str, paging_io: str) -> dict:
    from edge_remat_agent.capture.pipeline import recapture
    from edge_remat_agent.executor import run_plan
    report = run_plan(captured.graph, plan, 2, page_dir, check_gradients=False,
                      captured=recapture(captured.graph), map_large_allocations=False,
                      paging_io=paging_io)
    return report["steps"][1]


def bench_model(name: str, options: dict, args, log) -> dict:
    from edge_remat.planner.build import build_problem
    from edge_remat.planner.problem import InfeasibleBudget
    from edge_remat.planner.solve import solve
    from edge_remat_agent.capture import capture_model
    from edge_remat_agent.capture.pipeline import recapture, recapture_in_ram
    from edge_remat_agent.executor import run_plan
    from edge_remat_agent.formats import Profile
    from edge_remat_agent.profiler import measure_flash
    from edge_remat_agent.profiler.ops import measure_nodes, ops_from

    title = f"{name} ({', '.join(f'{k} {v}' for k, v in options.items())})"
    log(f"\n== {title}")
    captured = capture_model(name, params_home="flash", operator_level=True, **options)
    graph = captured.graph
    # timed as a board's profile job times it: plain steps, the parameters in RAM
    ops = ops_from(measure_nodes(recapture_in_ram(graph), map_large_allocations=False,
                                 context_steps=args.context_steps))
    flash = measure_flash(args.page_dir, FLASH_SIZES, fsync=True).fit()
    profile = Profile("measured", {}, idle_w=0.0, active_w=1.0, tiers={"flash": flash}, ops=ops)
    log(f"  {len(graph)} nodes, {sum(n.read_from_home for n in graph.nodes)} param nodes; "
        f"flash here: read {flash.read_bytes_per_s / 1e6:.0f} MB/s, write "
        f"{flash.write_bytes_per_s / 1e6:.0f} MB/s")
    budget = args.fraction
    try:
        build_problem(graph, budget, profile, "time", None, "none").check_budget()
    except InfeasibleBudget as error:  # plan a little above the floor instead, and say so
        budget = int(error.smallest_bytes * 1.05)
        log(f"  {args.fraction:.0%} is below the floor: planned at {budget / 2**20:.1f} MiB")
    plans = {}
    for label, io in (("in place", "sync"), ("ahead", "overlap")):
        problem = build_problem(graph, budget, profile, "time", None, "none", io=io)
        plans[label] = solve(problem, "auto", time_limit=args.time_limit).plan
    plans["ahead, sync"] = plans["ahead"]
    ahead = plans["ahead"].predicted
    check = run_plan(graph, plans["ahead"], 1, args.page_dir, check_gradients=True,
                     captured=recapture(graph), map_large_allocations=False,
                     paging_io="overlap")["grad_check"]
    grads = "bitwise equal" if check["bitwise_equal"] else \
        f"DIFFER (max |diff| {check['max_abs_diff']:.3g})"
    io_modes = {"in place": "sync", "ahead, sync": "sync", "ahead": "overlap"}
    for label in RUNS:  # warm-up
        run_step(captured, plans[label], args.page_dir, io_modes[label])
    records: dict[str, list[dict]] = {label: [] for label in RUNS}
    for r in range(args.rounds):
        order = RUNS[r % 3:] + RUNS[:r % 3]
        for label in order:
            records[label].append(run_step(captured, plans[label], args.page_dir,
                                           io_modes[label]))
    median = {label: statistics.median(x["step_time_s"] for x in rows)
              for label, rows in records.items()}
    read_s = statistics.median(x["home_read_s"] for x in records["ahead"])
    waited = statistics.median(x["io_wait_s"] for x in records["ahead"])
    return {
        "model": title, "budget_bytes": plans["ahead"].budget_bytes,
        "reads": ahead["home_reads"], "recomputed": {k: plans[k].predicted["recomputed"]
                                                     for k in ("in place", "ahead")},
        "measured_s": median,
        "predicted_s": {"in place": plans["in place"].predicted["time_s"],
                        "ahead, sync": plans["ahead"].predicted["compute_time_s"],
                        "ahead": ahead["time_s"]},
        "planned_hidden_share": ahead["paging_hidden_share"],
        "measured_read_s": read_s, "measured_wait_s": waited,
        "measured_hidden_share": (1.0 - waited / read_s) if read_s > 0 else None,
        "grad_check": grads,
    }


def print_row(row: dict) -> None:
    base = row["measured_s"]["in place"]
    print(f"\n{row['model']}: budget {row['budget_bytes'] / 2**20:.1f} MiB; {row['reads']} reads "
          f"from home; recomputations {row['recomputed']['in place']} in place, "
          f"{row['recomputed']['ahead']} ahead; gradients (ahead) {row['grad_check']}")
    print(f"  {'':12} {'step s':>8} {'x in place':>11} {'predicted s':>12} {'pred/meas':>10}")
    for label in RUNS:
        measured, predicted = row["measured_s"][label], row["predicted_s"][label]
        print(f"  {label:12} {measured:8.3f} {measured / base:11.3f} {predicted:12.3f} "
              f"{predicted / measured:10.2f}")
    print(f"  reads hidden behind compute: planned {_share(row['planned_hidden_share'])}; "
          f"measured {_share(row['measured_hidden_share'])} (waited "
          f"{row['measured_wait_s']:.3f} s of the IO thread's {row['measured_read_s']:.3f} s)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, fewer rounds")
    parser.add_argument("--models", type=names_among((name for name, _ in MODELS), "model"),
                        help="comma-separated subset: resnet18,bert-mini")
    parser.add_argument("--fraction", type=positive_float, default=0.4,
                        help="budget: this share of plain PyTorch's peak (default 0.4)")
    parser.add_argument("--rounds", type=positive_int, help="timed rounds (default 7; --quick 3)")
    parser.add_argument("--time-limit", type=positive_float,
                        help="solver seconds (default 20; quick 5)")
    parser.add_argument("--context-steps", type=positive_int, help="op profiler steps (default 3)")
    parser.add_argument("--page-dir", type=existing_folder, default=tempfile.gettempdir())
    parser.add_argument("--threads", type=positive_int, help="torch's intra-op threads")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    args.rounds = args.rounds or (3 if args.quick else 7)
    args.time_limit = args.time_limit or (5.0 if args.quick else 20.0)
    args.context_steps = args.context_steps or (2 if args.quick else 3)
    log = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731 - progress
    print(f"# torch {torch.__version__} ({torch.get_num_threads()} threads); parameters homed "
          f"on flash in {args.page_dir} (fsync, page cache dropped); budget "
          f"{args.fraction:.0%} of plain PyTorch's peak")
    started = time.perf_counter()
    for name, options in (QUICK if args.quick else MODELS):
        if args.models and name not in args.models:
            continue
        print_row(bench_model(name, options, args, log))
        sys.stdout.flush()
    print(f"\n# {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
