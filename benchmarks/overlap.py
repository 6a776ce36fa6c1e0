#!/usr/bin/env python3
"""Overlapped paging against synchronous paging, planned and measured, in one process.

For ResNet-18 and BERT-mini: this machine's op costs (profiler.ops) and its flash (a
FlashStore in --page-dir, fsync after each write and the page cache dropped, as the executor
runs it) go into one profile; the plan is made at --fraction (default 30%) of plain eager
PyTorch's activation peak (measured as benchmarks/end_to_end.py measures it) with paging to
flash and the IO timeline in the cost model (`io="overlap"`: CP-SAT or the best heuristic
decides what to page, the overlap post-pass when to issue it). Below the planner's smallest
feasible budget it plans at that budget and says so.

The same plan then runs, in interleaved rounds with plain eager PyTorch:
  sync     every page-in and page-out stops compute (run_plan(paging_io="sync"))
  overlap  page-ins prefetched where the plan issues them, page-outs written behind, on the
           executor's IO thread (run_plan(paging_io="overlap"))
Each timed sample is the second step of a two-step run_plan. Printed: median step times, each
against eager, predicted against measured (sync: compute + paging; overlap: the IO timeline's
makespan), and the share of paging hidden behind compute, planned (the timeline) and measured
(1 - time the step waited on the IO thread / the IO thread's busy time; and, from the two
runs, (sync - overlap) / the sync run's paging time). Gradients of the overlapped run are
checked bit for bit against eager.

    python benchmarks/overlap.py --quick
    python benchmarks/overlap.py            # ResNet-18 b16 64x64, BERT-mini b16 seq 128
    python benchmarks/overlap.py --threads 1   # on a loaded machine
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from end_to_end import MODELS, QUICK, MiB, eager_like, new_model  # noqa: E402
from arguments import (existing_folder, names_among, non_negative_float,  # noqa: E402
                       positive_float, positive_int)

FLASH_SIZES = (64 * 2**10, 2**20, 16 * 2**20)


def plan_at(graph, fraction: float, plain: int, profile, time_limit: float):
    """The plan at fixed + fraction x eager's activation peak, or at the floor (the
    least a schedule needs) when that is below it; (plan, problem, note)."""
    from edge_remat.planner.build import build_problem
    from edge_remat.planner.problem import InfeasibleBudget, ProblemError
    from edge_remat.planner.solve import NoPlan, solve
    budget = int(graph.fixed_bytes + fraction * plain)
    note = ""
    try:
        problem = build_problem(graph, f"{budget}B", profile, "time", None, "flash", io="overlap")
        return solve(problem, "auto", time_limit=time_limit).plan, problem, note
    except InfeasibleBudget as error:
        smallest = error.smallest_bytes
    for extra in (0.0, 0.05, 0.1, 0.2):  # the floor is necessary, not sufficient
        budget = int(smallest + extra * (smallest - graph.fixed_bytes))
        note = (f"{fraction:.0%} is below the floor (the least a schedule needs); planned at fixed + "
                f"{(budget - graph.fixed_bytes) / MiB:.1f} MiB "
                f"({(budget - graph.fixed_bytes) / plain:.0%} of eager's activation peak)")
        try:
            problem = build_problem(graph, f"{budget}B", profile, "time", None, "flash",
                                    io="overlap")
            return solve(problem, "auto", time_limit=time_limit).plan, problem, note
        except (ProblemError, NoPlan):
            if extra == 0.2:
                raise


def run_ours(graph, plan, captured, page_dir: str, paging_io: str) -> dict:
    from edge_remat_agent.executor import run_plan
    report = run_plan(graph, plan, 2, page_dir, check_gradients=False, captured=captured,
                      map_large_allocations=False, paging_io=paging_io)
    return report["steps"][1]


def bench_model(name: str, options: dict, args, log) -> dict:
    from edge_remat_agent.capture import capture_model
    from edge_remat_agent.executor import run_plan
    from edge_remat_agent.formats import Profile
    from edge_remat_agent.profiler import measure_flash
    from edge_remat_agent.profiler.ops import measure_nodes, ops_from
    from edge_remat_agent.simulate import simulate

    title = f"{name} ({', '.join(f'{k} {v}' for k, v in options.items())})"
    log(f"\n== {title}")
    captured = capture_model(name, **options)
    graph = captured.graph
    module, batch, optimizer = new_model(name, options, graph.capture.get("optimizer", "sgd"))
    eager = eager_like("eager", "no memory limit", module, optimizer, lambda: module(*batch))
    eager.run()
    plain = eager.measure().activation
    ops = ops_from(measure_nodes(captured, map_large_allocations=False,
                                 context_steps=args.context_steps))
    flash = measure_flash(args.page_dir, FLASH_SIZES, fsync=True).fit()
    profile = Profile("measured", {}, idle_w=0.0, active_w=1.0, tiers={"flash": flash}, ops=ops)
    log(f"  eager activation peak {plain / MiB:.1f} MiB; flash here: read "
        f"{flash.read_bytes_per_s / 1e6:.0f} MB/s, write {flash.write_bytes_per_s / 1e6:.0f} MB/s")
    plan, problem, note = plan_at(graph, args.fraction, plain, profile, args.time_limit)
    plan.problem["tier_params"] = {"flash": flash.to_dict()}
    planned_sync = simulate(graph, problem.costs, plan.stages, io="sync")
    predicted = plan.predicted
    log(f"  plan: {plan.solver['name']} ({plan.solver['status']}), {predicted['recomputed']} "
        f"recomputes, {predicted['page_outs']} page-outs, {predicted['page_ins']} page-ins"
        + (f"; {note}" if note else ""))
    check = run_plan(graph, plan, 1, args.page_dir, check_gradients=True, captured=captured,
                     map_large_allocations=False, paging_io="overlap")["grad_check"]
    grads = "bitwise equal" if check["bitwise_equal"] else \
        f"DIFFER (max |diff| {check['max_abs_diff']:.3g})"

    runs = {"eager": [], "sync": [], "overlap": []}
    records: dict[str, list[dict]] = {"sync": [], "overlap": []}
    for mode in ("sync", "overlap"):  # warm-up
        run_ours(graph, plan, captured, args.page_dir, mode)
    for r in range(args.rounds):
        order = ["eager", "sync", "overlap"]
        order = order[r % 3:] + order[: r % 3]
        for method in order:
            if method == "eager":
                runs["eager"].append(eager.run())
            else:
                record = run_ours(graph, plan, captured, args.page_dir, method)
                records[method].append(record)
                runs[method].append(record["step_time_s"])
    median = {k: statistics.median(v) for k, v in runs.items()}
    io_busy = statistics.median(r["page_in_s"] + r["page_out_s"] for r in records["overlap"])
    io_wait = statistics.median(r["io_wait_s"] for r in records["overlap"])
    sync_paging = statistics.median(r["page_in_s"] + r["page_out_s"] for r in records["sync"])
    row = {
        "model": title, "budget_bytes": plan.budget_bytes, "fixed_bytes": graph.fixed_bytes,
        "eager_activation_peak_bytes": plain, "plan_note": note,
        "solver": plan.solver["name"], "recomputed": predicted["recomputed"],
        "page_outs": predicted["page_outs"], "page_ins": predicted["page_ins"],
        "eager_s": median["eager"], "sync_s": median["sync"], "overlap_s": median["overlap"],
        "predicted_sync_s": planned_sync.time_s, "predicted_overlap_s": predicted["time_s"],
        "planned_paging_s": predicted["io_busy_s"],
        "planned_hidden_share": predicted["paging_hidden_share"],
        "measured_io_busy_s": io_busy, "measured_io_wait_s": io_wait,
        "measured_hidden_share": (1.0 - io_wait / io_busy) if io_busy > 0 else None,
        "measured_sync_paging_s": sync_paging,
        "measured_saved_share": ((median["sync"] - median["overlap"]) / sync_paging
                                 if sync_paging > 0 else None),
        "grad_check": grads, "step_times_s": runs,
    }
    return row


def _share(value) -> str:
    return "n/a" if value is None else f"{value:.0%}"


def print_row(row: dict) -> None:
    e = row["eager_s"]
    print(f"\n{row['model']}: budget fixed + "
          f"{(row['budget_bytes'] - row['fixed_bytes']) / MiB:.1f} MiB of eager's "
          f"{row['eager_activation_peak_bytes'] / MiB:.1f} MiB activation peak"
          + (f" ({row['plan_note']})" if row["plan_note"] else ""))
    print(f"  plan: {row['solver']}, {row['recomputed']} recomputes, {row['page_outs']} "
          f"page-outs, {row['page_ins']} page-ins to flash; gradients {row['grad_check']}")
    print(f"  {'':10} {'step s':>8} {'x eager':>8} {'predicted s':>12} {'pred/meas':>10}")
    print(f"  {'eager':10} {e:8.3f} {1.0:8.2f}")
    for mode in ("sync", "overlap"):
        measured, predicted = row[f"{mode}_s"], row[f"predicted_{mode}_s"]
        print(f"  {mode:10} {measured:8.3f} {measured / e:8.2f} {predicted:12.3f} "
              f"{predicted / measured:10.2f}")
    print(f"  paging hidden behind compute: planned {_share(row['planned_hidden_share'])} of "
          f"{row['planned_paging_s']:.3f} s; measured {_share(row['measured_hidden_share'])} "
          f"(waited {row['measured_io_wait_s']:.3f} s of the IO thread's "
          f"{row['measured_io_busy_s']:.3f} s); sync - overlap = "
          f"{_share(row['measured_saved_share'])} of the sync run's "
          f"{row['measured_sync_paging_s']:.3f} s paging")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, fewer rounds")
    parser.add_argument("--models", type=names_among((name for name, _ in MODELS), "model"),
                        help="comma-separated subset: resnet18,bert-mini")
    parser.add_argument("--fraction", type=non_negative_float, default=0.3,
                        help="budget: fixed memory + this share of eager's activation peak")
    parser.add_argument("--rounds", type=positive_int, help="timed rounds (default 7; --quick 5)")
    parser.add_argument("--time-limit", type=positive_float,
                        help="solver seconds (default 20; quick 5)")
    parser.add_argument("--context-steps", type=positive_int, help="op profiler steps (default 3)")
    parser.add_argument("--page-dir", type=existing_folder, default=tempfile.gettempdir())
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--threads", type=positive_int,
                        help="torch's intra-op threads (default: torch's own; 1 on a loaded "
                             "machine, where spinning threads wait on each other)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    args.rounds = args.rounds or (5 if args.quick else 7)
    args.time_limit = args.time_limit or (5.0 if args.quick else 20.0)
    args.context_steps = args.context_steps or (2 if args.quick else 3)
    from edge_remat_agent.profiler import board_identity
    identity = board_identity()
    log = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731 - progress
    print(f"# {identity['cpu']}, {identity['cpu_usable']} cores, torch {torch.__version__} "
          f"({torch.get_num_threads()} threads); "
          f"pages to flash in {args.page_dir} (fsync, page cache dropped); budget "
          f"{args.fraction:.0%} of eager's activation peak")
    started = time.perf_counter()
    rows = []
    for name, options in (QUICK if args.quick else MODELS):
        if args.models and name not in args.models:
            continue
        rows.append(bench_model(name, options, args, log))
        print_row(rows[-1])
        sys.stdout.flush()
    print(f"\n# {time.perf_counter() - started:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
