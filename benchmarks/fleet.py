"""Fleet planning: Ray's local instance against the sequential in-process path (`--no-ray`).

    python benchmarks/fleet.py [--time-limit 6] [--budgets 55%,65%] [--batches 4,8]

The tasks are solver-bound: digits-cnn graphs (captured once, before timing) planned for two
boards at budgets where CP-SAT runs to its time limit, so each task takes the same time
whatever runs it. The sequential path gives each solve every core (cores / 1 task in flight);
Ray runs as many tasks at once as there are cores, one solver thread each. Both use the same
code (`fleet.runner.run_fleet`), the same manifest, in this one process.

On a cluster the same manifest spreads further: each plan task asks Ray for as many CPUs as its
solver has threads, so N cores in all run about N / threads tasks at once, and the wall time
falls to about (tasks / in-flight) x the time limit until there are fewer tasks than slots.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "host"), str(REPO / "agent")]

from arguments import checked_by, comma_list, positive_float, positive_ints  # noqa: E402
from edge_remat.units import parse_budget  # noqa: E402

BOARDS = {"rpi4": REPO / "profiles" / "rpi4.json",
          "orin-nano": REPO / "profiles" / "jetson-orin-nano.json"}


def write_manifest(folder: Path, batches: list[int], budgets: list[str],
                   time_limit: float) -> Path:
    from edge_remat_agent.capture import capture_model

    lines = [f"budgets = {budgets!r}".replace("'", '"'),
             f"[plan]\nobjective = \"energy\"\ntime_limit = {time_limit}"]
    for batch in batches:
        graph = folder / f"digits-cnn-b{batch}.json"
        capture_model("digits-cnn", batch=batch, image=8).graph.save(graph)
        lines.append(f"[[models]]\ngraph = \"{graph}\"")
    for name, profile in BOARDS.items():
        lines.append(f"[[boards]]\nprofile = \"{profile}\"\nname = \"{name}\"")
    path = folder / "fleet.toml"
    path.write_text("\n\n".join(lines) + "\n")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--time-limit", type=positive_float, default=6.0)
    # the budgets go into the manifest as written: read here as the manifest will read them
    parser.add_argument("--budgets", type=comma_list(checked_by(parse_budget)),
                        default="55%,65%")
    parser.add_argument("--batches", type=positive_ints, default="4,8")
    args = parser.parse_args()

    from edge_remat.fleet.backends import InProcess, RayBackend
    from edge_remat.fleet.manifest import load_manifest
    from edge_remat.fleet.runner import run_fleet

    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as tmp:
        folder = Path(tmp)
        manifest = load_manifest(write_manifest(
            folder, args.batches, args.budgets, args.time_limit))
        tasks = len(manifest.models) * len(manifest.boards) * len(manifest.budgets)
        print(f"{tasks} plan tasks ({len(manifest.models)} graphs x {len(manifest.boards)} "
              f"boards x {len(manifest.budgets)} budgets), CP-SAT time limit "
              f"{args.time_limit:g} s each")

        sequential = run_fleet(manifest, folder / "sequential", InProcess())

        clock = time.perf_counter()
        backend = RayBackend()
        ray_start = time.perf_counter() - clock
        try:
            parallel = run_fleet(manifest, folder / "ray", backend)
        finally:
            backend.close()

        for name, result in (("sequential (in-process)", sequential),
                             ("Ray local instance", parallel)):
            statuses = sorted({row["status"] for row in result.rows})
            energy = sum(row["energy_j"] or 0.0 for row in result.rows)
            print(f"{name:<24} {result.seconds:7.1f} s  ({result.in_flight} at a time, "
                  f"{result.workers} solver thread{'s' if result.workers > 1 else ''} each; "
                  f"statuses {', '.join(statuses)}; energy summed over plans {energy:.5g} J)")
        print(f"Ray start: {ray_start:.1f} s")
        print(f"speed-up of Ray over sequential: {sequential.seconds / parallel.seconds:.2f}x "
              f"(planning), {sequential.seconds / (parallel.seconds + ray_start):.2f}x "
              f"(counting Ray's start)")


if __name__ == "__main__":
    main()
