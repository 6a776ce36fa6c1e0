#!/usr/bin/env python3
"""Reading a model's frozen weights back from flash: the weight file's reads against the two
ways they could go, in interleaved rounds on this machine's flash.

  weight file  WeightFile.read: O_DIRECT straight into the tensor's own page-aligned memory
  staged       O_DIRECT into an 8 MiB aligned staging buffer, copied out into the tensor: how
               WeightFile read before 2026-12-05 (written out here as the baseline)
  page         the same bytes as a flash page (FlashStore.get, page cache bypassed): a header,
               a CRC32 over the payload and, under 32 MiB, a 1 MiB staging copy (from
               2026-12-06 larger pages are read straight in); what the plan charged frozen
               weights at before the profile timed the weight file

Printed per size: the median read of each way, its rate, the staged / weight-file ratio, and
what a profile measured in this invocation charges a read of that size (the flash tier's
weights_read_curve, and its page read_curve).

    python benchmarks/weight_reads.py --quick
    python benchmarks/weight_reads.py --page-dir /mnt/sd/pages
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import torch

from edge_remat_agent.pages import FlashStore
from edge_remat_agent.profiler import measure_flash
from edge_remat_agent.profiler.tiers import random_tensor
from arguments import existing_folder, positive_int  # this script's neighbours
from size_rounds import MiB, median_row, timed
from edge_remat_agent.weights.store import ALIGN, WeightFile, write_weight_file

SIZES = [MiB, 8 * MiB, 64 * MiB, 256 * MiB]
QUICK = SIZES[:3]
STAGING = 8 * MiB
WAYS = ("weight file", "staged", "page")


def staged_read(file: WeightFile, name: str, staging: memoryview) -> torch.Tensor:
    """The baseline: whole aligned blocks into `staging`, each copied out into the tensor."""
    row = file.index[name]
    nbytes, offset = row["nbytes"], row["offset"]
    value = torch.empty(nbytes, dtype=torch.uint8)
    target = memoryview(value.numpy()).cast("B")
    done = 0
    while done < nbytes:
        covering = -(-(nbytes - done) // ALIGN) * ALIGN  # whole blocks, no more
        count = os.preadv(file.fd, [staging[:min(STAGING, covering)]], offset + done)
        take = min(nbytes - done, count)
        target[done:done + take] = staging[:take]
        done += take
    return value



def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1, 8 and 64 MiB, 3 rounds")
    parser.add_argument("--rounds", type=positive_int, default=5,
                        help="interleaved rounds (default 5; --quick always runs 3)")
    parser.add_argument("--page-dir", type=existing_folder, default=None,
                        help="a folder on the flash to measure")
    args = parser.parse_args()
    sizes, rounds = (QUICK, 3) if args.quick else (SIZES, args.rounds)
    with tempfile.TemporaryDirectory(dir=args.page_dir, prefix="weight-reads-") as folder:
        tier = measure_flash(os.path.join(folder, "profile"), share_s=0).fit()
        path = os.path.join(folder, "weights")
        tensors = [(f"w{n}", (n,), torch.uint8) for n in sizes]
        values = {name: random_tensor(shape[0]) for name, shape, _ in tensors}
        write_weight_file(path, "bench", tensors, lambda name, shape, dtype: values[name])
        file = WeightFile(path)
        if not file.direct:
            print("this filesystem refuses O_DIRECT: the weight file reads with pread here, "
                  "and 'staged' does not apply", file=sys.stderr)
            return 1
        raw = torch.empty(STAGING + ALIGN, dtype=torch.uint8)
        skip = (-raw.data_ptr()) % ALIGN
        staging = memoryview(raw[skip:skip + STAGING].numpy()).cast("B")
        times = {(way, n): [] for way in WAYS for n in sizes}
        with FlashStore(os.path.join(folder, "pages"), drop_cache=True) as pages:
            for name, _, _ in tensors:
                pages.put(name, values[name])
            for name, (n,), _ in tensors:  # the same bytes each way
                assert torch.equal(file.read(name), values[name])
                assert torch.equal(staged_read(file, name, staging), values[name])
            for _ in range(rounds):
                for name, (n,), _ in tensors:
                    times["weight file", n].append(timed(lambda: file.read(name)))
                    times["staged", n].append(timed(lambda: staged_read(file, name, staging)))
                    times["page", n].append(timed(lambda: pages.get(name)))
        file.close()
    print(f"flash in {args.page_dir or tempfile.gettempdir()}, {rounds} interleaved rounds, "
          "median read (MB/s); the profile's charge for the same size")
    print(f"{'size':>8} {'weight file':>20} {'staged':>20} {'page':>20} {'staged/file':>12} "
          f"{'charged: file':>14} {'page':>9}")
    for n in sizes:
        medians, cells = median_row(times, WAYS, n)
        print(f"{n // MiB:>5} MiB {cells} {medians['staged'] / medians['weight file']:12.2f} "
              f"{tier.weights_read_cost(n)[0] * 1e3:11.1f} ms {tier.read_cost(n)[0] * 1e3:6.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
