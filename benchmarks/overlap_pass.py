#!/usr/bin/env python3
"""The overlap post-pass's speed: each page-in's trial issue points scored from the base's
timeline state (planner/overlap.py's `_Trials`), against each trial run as a whole step (the
reference, `schedule_io(..., whole_runs=True)`), in one process, on the same schedules.

For each case the schedule is Belady's paging plan (`heuristic:paging`, what `auto` returns
where recomputation alone does not fit), lowered, before the post-pass; both ways then place
its page-ins and page-outs, alternately, `--repeats` times each. Printed per case: page-ins,
instructions, the median seconds of each way, their ratio, whether the two placed schedules
are identical, and the placed schedule's overlapped step time against the unplaced one's, with
the issue points the pass tries (planner/overlap.py's NEAR_ISSUE_POINTS nearest computes, then
powers of two) and with powers of two alone (the 1st, 2nd, 4th, ... compute before the use);
then, as solve() does to the plan it returns, with the page-outs delayed
(overlap.delay_page_outs): that step against the unplaced one's, and the seconds it took.

Cases: random layered graphs (edge_remat.synthetic, the published family, w 0.31) at 35% of
the plain peak with a flash of 90 MB/s reads and 40 MB/s writes, and operator-level GPT-2
small and ResNet-50 (batch 8, 64x64; `edge-remat graph --operator-level --params-home flash`,
captured once into --cache) at 25% with profiles/rpi4.json's flash.

    python benchmarks/overlap_pass.py
    python benchmarks/overlap_pass.py --sizes 500,1000 --models none --repeats 1
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from arguments import names_among, none_or, positive_int  # noqa: E402
from planner_scaling import LAYERED_SIZES, capture  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MODEL_BUDGETS = {"gpt2-small": "25%", "resnet50": "25%", "resnet18": "25%"}


def random_case(n: int):
    from edge_remat.planner.build import build_problem
    from edge_remat.synthetic import random_layered
    from edge_remat_agent.formats import Tier
    flash = Tier(read_bytes_per_s=90e6, write_bytes_per_s=40e6)
    return build_problem(random_layered(n, seed=1, w=0.31), "0.35", paging="flash",
                         tiers={"flash": flash})


def model_case(name: str, cache: Path):
    from edge_remat.planner.build import build_problem
    from edge_remat_agent.formats.graph import load_graph
    from edge_remat_agent.formats.profile import load_profile
    return build_problem(load_graph(capture(name, cache)), MODEL_BUDGETS[name],
                         load_profile(ROOT / "profiles" / "rpi4.json"), paging="flash")


def measure(label: str, p, repeats: int) -> None:
    from edge_remat.planner.baselines import belady_paging
    from edge_remat.planner import overlap
    from edge_remat.planner.overlap import schedule_io
    from edge_remat.planner.stages import lower
    from edge_remat_agent.simulate import simulate
    decisions = belady_paging(p)
    if decisions is None:
        print(f"{label:<22} Belady's paging found no plan at this budget")
        return
    stages, _ = lower(p, decisions)
    page_ins = sum(ins.op == "page_in" for stage in stages for ins in stage)
    times: dict[bool, list[float]] = {True: [], False: []}
    placed = {}
    for _ in range(repeats):
        for whole in (True, False):
            started = time.perf_counter()
            placed[whole] = schedule_io(p, stages, whole_runs=whole)
            times[whole].append(time.perf_counter() - started)
    whole, trials = statistics.median(times[True]), statistics.median(times[False])

    started = time.perf_counter()
    delayed = overlap.delay_page_outs(p, placed[False])
    delaying = time.perf_counter() - started
    near, overlap.NEAR_ISSUE_POINTS = overlap.NEAR_ISSUE_POINTS, 1
    try:  # issue points before the 1st, 2nd, 4th, 8th, ... compute only
        sparse = schedule_io(p, stages)
    finally:
        overlap.NEAR_ISSUE_POINTS = near

    def step(s):
        return simulate(p.graph, p.costs, s, p.budget_bytes, io="overlap").time_s
    before = step(stages)
    print(f"{label:<22} {page_ins:>8} {sum(map(len, stages)):>7} {whole:>9.2f} {trials:>8.2f} "
          f"{whole / trials:>7.1f}x {str(placed[True] == placed[False]):>6} "
          f"{step(placed[False]) / before:>10.4f} {step(sparse) / before:>10.4f} "
          f"{step(delayed) / before:>10.4f} {delaying:>8.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=none_or(LAYERED_SIZES), default="500,1000,2000",
                        help="random layered graph sizes (comma-separated; 'none')")
    parser.add_argument("--models", type=none_or(names_among(MODEL_BUDGETS, "model")),
                        default="gpt2-small,resnet50",
                        help=f"operator-level models: {', '.join(MODEL_BUDGETS)} or 'none'")
    parser.add_argument("--repeats", type=positive_int, default=3,
                        help="runs of each way per case")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir())
                        / "edge-remat-bench-graphs", help="where captured graphs are kept")
    args = parser.parse_args()
    sizes, models = args.sizes, args.models
    print(f"{'case':<22} {'page-ins':>8} {'instrs':>7} {'whole s':>9} {'trials s':>8} "
          f"{'ratio':>8} {'same':>6} {'step/unplaced':>10} {'powers of 2':>10} "
          f"{'delayed':>10} {'delay s':>8}")
    for n in sizes:
        measure(f"random layered {n}", random_case(n), args.repeats)
    for name in models:
        measure(f"{name} ({MODEL_BUDGETS[name]})", model_case(name, args.cache), args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
