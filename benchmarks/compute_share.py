#!/usr/bin/env python3
"""The flash tier's compute_share measured again and again on this machine, as the profiler
measures it (profiler/contention.py: FlashStore with fsync, a 1 MiB page, --share-s 4 s): each
run's share, which figure it is (pooled pairs, or the fallback), the pooled figure's interval,
the IO thread's CPU per IO second, and the spread of the shares over the runs.

    python benchmarks/compute_share.py                      # 10 runs, torch's own threads
    python benchmarks/compute_share.py --load 2 --threads 1 # beside 2 busy processes

--load N starts N busy Python processes for the runs (and stops them after), a host as loaded
as a shared one. Runs against an older agent too (PYTHONPATH=OLD/agent): what it lacks
(the figure's source, its interval) prints as "-".
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from edge_remat_agent.pages import FlashStore
from edge_remat_agent.profiler.contention import MAX_S, measure_compute_share

from arguments import existing_folder, non_negative_int, positive_float, positive_int


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=positive_int, default=10)
    parser.add_argument("--threads", type=positive_int, default=None,
                        help="torch's intra-op threads (default: torch's own)")
    parser.add_argument("--load", type=non_negative_int, default=0,
                        help="busy Python processes to run beside the measurements")
    parser.add_argument("--share-s", type=positive_float, default=MAX_S)
    parser.add_argument("--page-dir", type=existing_folder, default=tempfile.gettempdir())
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(args.load)]
    try:
        time.sleep(2 if busy else 0)  # the load under way before the first run
        print(f"# {args.runs} runs, {torch.get_num_threads()} torch threads, {args.load} busy "
              f"processes beside, load average {os.getloadavg()[0]:.1f} at the start")
        shares = [run(i, args) for i in range(args.runs)]
    finally:
        for process in busy:
            process.kill()
            process.wait()
    known = [s for s in shares if s is not None]
    print(f"# shares {min(known, default=0):.2f} to {max(known, default=0):.2f} (spread "
          f"{max(known, default=0) - min(known, default=0):.2f}), median "
          f"{statistics.median(known) if known else 0:.2f}; load average "
          f"{os.getloadavg()[0]:.1f} at the end")


def run(i: int, args) -> float | None:
    with tempfile.TemporaryDirectory(dir=args.page_dir) as folder:
        with FlashStore(folder, fsync=True, drop_cache=True) as store:
            measured = measure_compute_share(store, max_s=args.share_s)
    interval = getattr(measured, "interval", None)

    def num(value) -> str:
        return "-" if value is None else f"{value:.2f}"
    print(f"{i}: share {num(measured.share)} ({getattr(measured, 'source', '-')}), pooled "
          f"{num(getattr(measured, 'measured', None))}, 90% interval "
          f"{num(interval[0]) if interval else '-'} to {num(interval[1]) if interval else '-'}, "
          f"{len(measured.rounds)} pairs (ratios {num(min(measured.rounds, default=None))} to "
          f"{num(max(measured.rounds, default=None))}), IO thread CPU "
          f"{num(measured.io_cpu_per_io_s)} s per IO s", flush=True)
    return measured.share


if __name__ == "__main__":
    main()
