#!/usr/bin/env python3
"""Writing a large flash page (FlashStore.put, fsync, page cache bypassed), the same values
from two kinds of memory, in interleaved rounds on this machine's flash:

  aligned   page-aligned memory, as a page read straight from flash has (an optimizer state
            or a parameter homed on flash, written back after the update): its whole blocks
            go to the device from where they lie
  malloc    malloc's memory, as a tensor computed in RAM has: copied through the 1 MiB
            staging buffer, as every page was before 2026-12-06

Both include the page's CRC32 (encode). Printed per size: each median (MB/s), and their ratio.

    python benchmarks/page_writes.py --quick
    python benchmarks/page_writes.py --page-dir /mnt/nvme/pages
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import torch

from edge_remat_agent.pages import FlashStore
from edge_remat_agent.pages.codec import STRAIGHT_READ_BYTES
from edge_remat_agent.profiler.tiers import random_tensor
from arguments import existing_folder, positive_int  # this script's neighbours
from size_rounds import MiB, median_row, timed

SIZES = [32 * MiB, 64 * MiB, 256 * MiB]
QUICK = SIZES[:2]
WAYS = ("aligned", "malloc")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="32 and 64 MiB, 3 rounds")
    parser.add_argument("--rounds", type=positive_int, default=5,
                        help="interleaved rounds (default 5; --quick always runs 3)")
    parser.add_argument("--page-dir", type=existing_folder, default=None,
                        help="a folder on the flash to measure")
    args = parser.parse_args()
    sizes, rounds = (QUICK, 3) if args.quick else (SIZES, args.rounds)
    times = {(way, n): [] for way in WAYS for n in sizes}
    with tempfile.TemporaryDirectory(dir=args.page_dir, prefix="page-writes-") as folder, \
            FlashStore(os.path.join(folder, "pages"), fsync=True, drop_cache=True) as store:
        sources = {}
        for n in sizes:
            assert n >= STRAIGHT_READ_BYTES  # read back straight: page-aligned memory
            store.put(("seed", n), random_tensor(n))
            aligned = store.get(("seed", n))
            if aligned.data_ptr() % 4096:
                print("this filesystem refuses O_DIRECT: no page is read straight here",
                      file=sys.stderr)
                return 1
            sources[n] = {"aligned": aligned, "malloc": aligned.clone()}
        for _ in range(rounds):
            for n in sizes:
                for way in WAYS:
                    times[way, n].append(timed(lambda: store.put((way, n), sources[n][way])))
        for n in sizes:  # the same bytes either way
            assert torch.equal(store.get(("aligned", n)), store.get(("malloc", n)))
    print(f"flash in {args.page_dir or tempfile.gettempdir()}, {rounds} interleaved rounds, "
          "median FlashStore.put with fsync (MB/s)")
    print(f"{'size':>8} " + " ".join(f"{way:>20}" for way in WAYS) + f" {'malloc/aligned':>15}")
    for n in sizes:
        medians, cells = median_row(times, WAYS, n)
        print(f"{n // MiB:>5} MiB {cells} {medians['malloc'] / medians['aligned']:15.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
