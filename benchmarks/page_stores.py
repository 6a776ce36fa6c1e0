#!/usr/bin/env python3
"""Page-store speed on this machine: flash (FlashStore, fsync, page cache dropped) and host
memory (MemoryStore), write and read at each size from 4 KiB to 64 MiB, then the fitted
latency + bandwidth lines that go into a profile's tiers.

Times are per operation, as the executor pays them: encoding, CRC32 and file handling included.

    python benchmarks/page_stores.py
    python benchmarks/page_stores.py --page-dir /mnt/sd/pages --max-size 16MiB --no-fsync
"""

from __future__ import annotations

import argparse
import tempfile

from edge_remat_agent.pages import MemoryStore
from edge_remat_agent.profiler import measure_flash, measure_store, sizes_between
from edge_remat_agent.profiler.identity import board_identity
from edge_remat_agent.units import format_size

from arguments import existing_folder, positive_float, positive_size  # this script's neighbour

MB = 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--page-dir", type=existing_folder, default=tempfile.gettempdir(),
                        help="directory on the filesystem to measure (default: the temp dir)")
    parser.add_argument("--min-size", type=positive_size, default=4 * 2**10)
    parser.add_argument("--max-size", type=positive_size, default=64 * 2**20)
    parser.add_argument("--window-s", type=positive_float, default=0.01)
    parser.add_argument("--no-fsync", action="store_true")
    args = parser.parse_args()
    if args.min_size > args.max_size:
        parser.error(f"--min-size {args.min_size} B is above --max-size {args.max_size} B")
    sizes = sizes_between(args.min_size, args.max_size)

    identity = board_identity()
    print(f"# {identity['cpu']}, {identity['cpu_usable']} cores, {identity['os_release']}, "
          f"kernel {identity['kernel']}, torch {identity['torch']}")
    flash = measure_flash(args.page_dir, sizes, args.window_s, fsync=not args.no_fsync)
    memory = measure_store(MemoryStore(), sizes, args.window_s)
    print(f"# flash: {flash.method}")
    print(f"# host:  {memory.method} (in-process; a real link adds its transport)")
    print()
    header = (f"{'size':>8} | {'flash write':>11} {'MB/s':>8} {'n':>4} | {'flash read':>11} "
              f"{'MB/s':>8} {'n':>4} | {'mem write':>10} {'MB/s':>8} | {'mem read':>10} {'MB/s':>8}")
    print(header)
    print("-" * len(header))
    for f, m in zip(flash.points, memory.points):
        print(f"{format_size(f.nbytes):>8} | {_ms(f.write_s):>11} {f.nbytes / f.write_s / MB:8.1f} "
              f"{f.writes:4d} | {_ms(f.read_s):>11} {f.nbytes / f.read_s / MB:8.1f} {f.reads:4d} | "
              f"{_ms(m.write_s):>10} {m.nbytes / m.write_s / MB:8.1f} | "
              f"{_ms(m.read_s):>10} {m.nbytes / m.read_s / MB:8.1f}")
    print()
    print("fitted: time = latency + bytes / bandwidth (relative least squares)")
    for name, measurement in (("flash", flash), ("host (memory)", memory)):
        for direction, line in (("write", measurement.write_line()),
                                ("read", measurement.read_line())):
            print(f"  {name:>13} {direction:<5}  latency {line.latency_s * 1e6:9.1f} us   "
                  f"bandwidth {line.bytes_per_s / MB:9.1f} MB/s   worst point off by "
                  f"{line.max_relative_error * 100:5.1f}%")


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"


if __name__ == "__main__":
    main()
