#!/usr/bin/env python3
"""Energy with paging on POET's own MILP instances (shared/benchmarks/poet), next to POET's solver.

For every file, every budget (a fraction of the file's own `noremat_peak_bytes`) and both deadline
modes (`counted`: paging takes the time the tier says; `free`: POET's assumption), solve for the
least energy under the deadline with paging to the file's SD card / flash, and print: status,
energy and its breakdown, the lower bound and gap, recomputations, page-ins and page-outs, the time
to the first and to the returned plan. A budget no schedule fits prints the floor (the least
bytes a schedule needs); a deadline no schedule meets prints the smallest deadline that can be met.

    python benchmarks/poet_problems.py                      # all files, 30/50/70 %, 1.5x, 30 s
    python benchmarks/poet_problems.py --files vgg16__m4 --budgets 0.5 --solver milp
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
from edge_remat.planner.build import build_problem
from edge_remat.planner.problem import PAGING_TIME_MODES, InfeasibleBudget, InfeasibleDeadline
from edge_remat.planner.solve import NoPlan, solve

from arguments import (names_among, positive_float, positive_floats,  # this script's neighbour
                       positive_int)

DEFAULT_POET = Path(__file__).resolve().parents[1].parent / "shared" / "benchmarks" / "poet"

# POET + CBC on these files, from shared/benchmarks/poet/README.md (2-core machine, 1.5x).
POET_CBC = {("vgg16", 0.5): "no solution in 300 s", ("vgg16", 0.7): "no solution in 300 s",
            ("vgg16", 0.3): "proven infeasible",
            ("resnet18_cifar", 0.3): "no solution after 657 s (m4 file)",
            ("resnet18_cifar", 0.5): "no solution in 300-390 s",
            ("linear", 0.5): "optimal in 0.7-173 s", ("linear", 0.7): "optimal in 0.7-173 s"}

HEADER = (f"{'problem':<20} {'budget':>6} {'mode':<7} {'status':<10} {'energy J':>10} "
          f"{'compute':>9} {'paging':>9} {'static':>8} {'bound J':>10} {'gap %':>6} "
          f"{'recomp':>6} {'in':>4} {'out':>4} {'first s':>7} {'best s':>7} {'wall s':>6}  "
          "note")


def fmt(value, spec: str) -> str:
    return "-" if value is None or (isinstance(value, float) and not math.isfinite(value)) \
        else format(value, spec)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--poet", type=Path, default=DEFAULT_POET, help="folder of POET's files")
    ap.add_argument("--files", help="comma-separated file stems (default: all)")
    ap.add_argument("--budgets", type=positive_floats, default="0.3,0.5,0.7",
                    help="fractions of the plain peak")
    ap.add_argument("--deadline", type=positive_float, default=1.5,
                    help="x the plain compute time")
    ap.add_argument("--modes", type=names_among(PAGING_TIME_MODES, "mode"),
                    default="counted,free", help="paging-time modes")
    ap.add_argument("--solver", default="auto", help="auto | cpsat | milp | heuristic:NAME")
    ap.add_argument("--time-limit", type=positive_float, default=30.0, help="per problem, s (30)")
    ap.add_argument("--workers", type=positive_int, default=None, help="solver threads (all cores)")
    ap.add_argument("--json", type=Path, help="also write every row here")
    args = ap.parse_args(argv)

    files = sorted(p for p in args.poet.glob("*.json") if p.name != "schema.json")
    if args.files:  # the stems are known once --poet is read: checked here, not by a type
        wanted = {s.strip() for s in args.files.split(",") if s.strip()}
        unknown = sorted(wanted - {p.stem for p in files})
        if unknown and files:
            ap.error(f"argument --files: unknown file {unknown[0]!r} (known: "
                     f"{', '.join(p.stem for p in files)})")
        files = [p for p in files if p.stem in wanted]
    if not files:
        raise SystemExit(f"no POET problem files in {args.poet}")
    budgets, modes = args.budgets, args.modes
    print(f"# POET problems from {args.poet}; objective energy, deadline {args.deadline:g}x, "
          f"paging to flash; solver {args.solver}, {args.time_limit:g} s per problem, "
          f"{os.cpu_count()} cores")
    print(HEADER)
    print("-" * len(HEADER))
    rows, started = [], time.perf_counter()
    for path in files:
        graph = load_graph_file(path)
        network = path.stem.split("__")[0]
        for fraction in budgets:
            for mode in modes:
                row = {"problem": path.stem, "budget": fraction, "mode": mode}
                t0 = time.perf_counter()
                note = POET_CBC.get((network, fraction), "")
                try:
                    # POET's model: paging stops compute (compared line for line with it)
                    p = build_problem(graph, str(fraction), objective="energy",
                                      deadline=args.deadline, paging="flash", paging_time=mode,
                                      io="sync")
                    report = solve(p, args.solver, args.time_limit, workers=args.workers)
                except InfeasibleBudget as exc:
                    row.update(status="infeasible", smallest_budget_bytes=exc.smallest_bytes)
                    note = (f"needs at least {exc.smallest_bytes} B; POET: {note}"
                            if note else f"needs at least {exc.smallest_bytes} B")
                except InfeasibleDeadline as exc:
                    row.update(status="deadline", smallest_deadline=exc.smallest_deadline)
                    note = f"smallest deadline {exc.smallest_deadline:.4g}x"
                except NoPlan as exc:
                    row.update(status="no plan")
                    note = str(exc)
                else:
                    pr, s = report.plan.predicted, report.plan.solver
                    row.update(status=s["status"], solver=s["name"], energy_j=pr["energy_j"],
                               energy_compute_j=pr["energy_compute_j"],
                               energy_paging_j=pr["energy_paging_j"],
                               energy_static_j=pr["energy_static_j"], lower_bound=s["lower_bound"],
                               gap=s["gap"], recomputed=pr["recomputed"], page_ins=pr["page_ins"],
                               page_outs=pr["page_outs"], first_plan_s=s.get("first_plan_s"),
                               best_plan_s=s.get("best_plan_s"), peak_bytes=pr["peak_bytes"],
                               budget_bytes=report.plan.budget_bytes)
                    scope = s.get("bound_scope")
                    note = f"{s['name']}" + (f" (bound over {scope})" if scope and scope !=
                                             "stage model" else "") \
                        + (f"; POET + CBC: {note}" if note else "")
                row["wall_s"] = time.perf_counter() - t0
                rows.append(row)
                gap = row.get("gap")
                print(f"{path.stem:<20} {fraction:>6.2f} {mode:<7} {row['status']:<10} "
                      f"{fmt(row.get('energy_j'), '.5g'):>10} "
                      f"{fmt(row.get('energy_compute_j'), '.4g'):>9} "
                      f"{fmt(row.get('energy_paging_j'), '.4g'):>9} "
                      f"{fmt(row.get('energy_static_j'), '.3g'):>8} "
                      f"{fmt(row.get('lower_bound'), '.5g'):>10} "
                      f"{fmt(None if gap is None else 100 * gap, '.2f'):>6} "
                      f"{fmt(row.get('recomputed'), 'd'):>6} {fmt(row.get('page_ins'), 'd'):>4} "
                      f"{fmt(row.get('page_outs'), 'd'):>4} "
                      f"{fmt(row.get('first_plan_s'), '.2f'):>7} "
                      f"{fmt(row.get('best_plan_s'), '.2f'):>7} {row['wall_s']:>6.1f}  {note}")
                sys.stdout.flush()
    print(f"total wall time: {time.perf_counter() - started:.1f} s")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
