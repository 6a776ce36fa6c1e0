#!/usr/bin/env python3
"""Reading a flash page back: the ways a page's payload can come off the device, in
interleaved rounds on this machine's flash, page cache bypassed (O_DIRECT) in each.

  staged        every byte through the reader's 1 MiB staging buffer, copied out into a new
                tensor, then the CRC32 over it: how FlashStore.get read each page before
                2026-12-06 (and still reads pages under codec.STRAIGHT_READ_BYTES)
  straight      straight from the device into memory of the page's own (O_DIRECT, one call,
                no copy), then the CRC32 over it: how FlashStore.get reads a page of
                codec.STRAIGHT_READ_BYTES or more now (here at every size, to show where it pays)
  no crc        the payload straight in, no header, no check: the weight file's read, the floor

Printed per size: each way's median (MB/s), and staged / straight.

    python benchmarks/page_reads.py --quick
    python benchmarks/page_reads.py --page-dir /mnt/nvme/pages
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import torch

from edge_remat_agent.pages import codec
from edge_remat_agent.pages.codec import encode, read_from
from edge_remat_agent.pages.direct import open_direct, read_aligned, write_direct
from edge_remat_agent.profiler.tiers import random_tensor
from arguments import existing_folder, positive_floats, positive_int  # this script's neighbours
from size_rounds import MiB, median_row, timed

SIZES = [MiB, 8 * MiB, 16 * MiB, 32 * MiB, 64 * MiB, 256 * MiB]
QUICK = [MiB, 16 * MiB, 64 * MiB]
WAYS = ("staged", "straight", "no crc")
STRAIGHT_FROM = codec.STRAIGHT_READ_BYTES  # FlashStore.get's; main times 'straight' at every size


class StagedOnly:
    """A direct reader without read_aligned: read_from then takes the staging path."""

    def __init__(self, reader):
        self._reader = reader

    def __getattr__(self, name):
        if name == "read_aligned":
            raise AttributeError(name)
        return getattr(self._reader, name)


def write_page(path: str, value: torch.Tensor) -> int:
    """One page file, its payload on a block boundary; returns where the payload starts."""
    page = encode(value).aligned_at(0)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        if not write_direct(fd, [page.header, page.payload], page.total_bytes):
            raise SystemExit("this filesystem refuses O_DIRECT: give --page-dir on the flash")
        os.fsync(fd)
    finally:
        os.close(fd)
    return len(page.header)


def read_page(path: str, staged: bool) -> torch.Tensor:
    with open_direct(path) as reader:
        if staged:
            return read_from(StagedOnly(reader), "bench", path)
        return read_from(reader, "bench", path)  # straight where the size allows


def read_payload(path: str, start: int, nbytes: int) -> torch.Tensor:
    with open_direct(path) as reader:
        return read_aligned(reader.fd, start, nbytes)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1, 16 and 64 MiB, 3 rounds")
    parser.add_argument("--rounds", type=positive_int, default=5,
                        help="interleaved rounds (default 5; --quick always runs 3)")
    parser.add_argument("--sizes", type=positive_floats, default=None,
                        help="MiB, comma-separated (default "
                        + ",".join(str(n // MiB) for n in SIZES) + ")")
    parser.add_argument("--page-dir", type=existing_folder, default=None,
                        help="a folder on the flash to measure")
    args = parser.parse_args()
    sizes, rounds = (QUICK, 3) if args.quick else (SIZES, args.rounds)
    if args.sizes:
        sizes = [int(mib * MiB) for mib in args.sizes]
    codec.STRAIGHT_READ_BYTES = 1  # 'straight' at every size, to show where it pays
    times = {(way, n): [] for way in WAYS for n in sizes}
    with tempfile.TemporaryDirectory(dir=args.page_dir, prefix="page-reads-") as folder:
        files = {}
        for n in sizes:
            value = random_tensor(n)
            path = os.path.join(folder, f"{n}.page")
            files[n] = path, write_page(path, value)
            for staged in (True, False):  # the same bytes each way
                assert torch.equal(read_page(path, staged), value)
            assert torch.equal(read_payload(path, files[n][1], n), value)
        for _ in range(rounds):
            for n, (path, start) in files.items():
                times["staged", n].append(timed(lambda: read_page(path, staged=True)))
                times["straight", n].append(timed(lambda: read_page(path, staged=False)))
                times["no crc", n].append(timed(lambda: read_payload(path, start, n)))
    print(f"flash in {args.page_dir or tempfile.gettempdir()}, {rounds} interleaved rounds, "
          f"median read (MB/s); FlashStore.get reads straight from "
          f"{STRAIGHT_FROM // MiB} MiB on")
    print(f"{'size':>8} " + " ".join(f"{way:>20}" for way in WAYS) + f" {'staged/straight':>16}")
    for n in sizes:
        medians, cells = median_row(times, WAYS, n)
        print(f"{n // MiB:>5} MiB {cells} {medians['staged'] / medians['straight']:16.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
