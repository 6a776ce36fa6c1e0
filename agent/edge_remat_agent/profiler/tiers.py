"""Storage tiers: time writes and reads at sizes 4 KiB .. 64 MiB, fit latency + bandwidth, and
keep the measured times, from which the planner reads a transfer's cost (Tier's curves).

    flash = measure_flash("/data/pages")                       # FlashStore, fsync, cache dropped
    host = measure_link(send, fetch, drop)                     # any transport's byte callables
    tier = flash.fit()                                         # -> formats.profile.Tier

A store's measurement also runs its IO beside a compute loop (contention.py): the tier's
compute_share, what its IO costs compute where no core is spare. The flash's also times reads
of a weight file (weights/store.py), the way a model's frozen weights come back: its
weights_read_curve.

Each size is repeated until the timed operations add up to `min_window_s` (10 ms by default),
so a 4 KiB write is not one clock tick of noise. Payloads are random bytes, so a compressing
or deduplicating filesystem cannot make them look faster than a tensor would be.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Hashable, Sequence

import torch

from ..formats.profile import Tier, TransferCurve
from ..pages import FlashStore, PageStore
from ..pages.errors import PageStoreFull, full_remedy
from .contention import MAX_S, ComputeShare, measure_compute_share
from .fit import LineFit, fit_line

KiB, MiB = 2**10, 2**20
DEFAULT_SIZES = tuple(4 * KiB * 4**i for i in range(8))  # 4 KiB, 16 KiB, ... 64 MiB
MIN_WINDOW_S = 0.010
MAX_REPEATS = 100_000  # a guard against an operation that takes no measurable time


def sizes_between(smallest: int, largest: int, factor: int = 4) -> tuple[int, ...]:
    """smallest, smallest*factor, ... up to largest (largest itself included)."""
    if smallest <= 0 or largest < smallest or factor < 2:
        raise ValueError(f"need 0 < smallest <= largest and factor >= 2, got "
                         f"{smallest}, {largest}, {factor}")
    sizes = []
    size = smallest
    while size < largest:
        sizes.append(size)
        size *= factor
    sizes.append(largest)
    return tuple(sizes)


@dataclass
class SizePoint:
    nbytes: int
    write_s: float  # mean time of one write of `nbytes`
    read_s: float
    writes: int  # how many were timed
    reads: int


@dataclass
class ReadPoint:
    nbytes: int
    read_s: float  # mean time of one read of `nbytes`
    reads: int  # how many were timed


@dataclass
class TierMeasurement:
    name: str  # "flash" or "host"
    method: str  # what exactly was timed, for the profile's record
    points: list[SizePoint] = field(default_factory=list)
    capacity_bytes: int | None = None
    contention: ComputeShare | None = None  # None (or its share None): not measured, share 0
    weight_reads: list[ReadPoint] | None = None  # flash: reads of a weight file

    def write_line(self) -> LineFit:
        return fit_line([p.nbytes for p in self.points], [p.write_s for p in self.points])

    def read_line(self) -> LineFit:
        return fit_line([p.nbytes for p in self.points], [p.read_s for p in self.points])

    def fit(self) -> Tier:
        write, read = self.write_line(), self.read_line()
        return Tier(read_bytes_per_s=read.bytes_per_s, write_bytes_per_s=write.bytes_per_s,
                    # For readers that know one latency only: the smaller, never double-counted.
                    latency_s=min(read.latency_s, write.latency_s),
                    read_latency_s=read.latency_s, write_latency_s=write.latency_s,
                    capacity_bytes=self.capacity_bytes,
                    compute_share=(self.contention.share or 0.0) if self.contention else 0.0,
                    write_curve=TransferCurve.measured([p.nbytes for p in self.points],
                                                       [p.write_s for p in self.points]),
                    read_curve=TransferCurve.measured([p.nbytes for p in self.points],
                                                      [p.read_s for p in self.points]),
                    weights_read_curve=TransferCurve.measured(
                        [p.nbytes for p in self.weight_reads],
                        [p.read_s for p in self.weight_reads]) if self.weight_reads else None)

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "points": [asdict(p) for p in self.points],
                "write_fit": asdict(self.write_line()), "read_fit": asdict(self.read_line()),
                "capacity_bytes": self.capacity_bytes,
                **({"compute_share": self.contention.to_dict()} if self.contention else {}),
                **({"weight_reads": [asdict(p) for p in self.weight_reads]}
                   if self.weight_reads else {})}


def time_repeated(operation: Callable[[int], object], min_window_s: float,
                  after: Callable[[int], object] | None = None) -> tuple[float, int]:
    """(mean seconds per call, calls): operation(i) is timed, after(i) runs untimed."""
    total, calls = 0.0, 0
    while total < min_window_s and calls < MAX_REPEATS:
        start = time.perf_counter()
        operation(calls)
        total += time.perf_counter() - start
        if after is not None:
            after(calls)
        calls += 1
    return total / calls, calls


def measure_round_trips(write: Callable[[Hashable, Any], object], read: Callable[[Hashable], object],
                        remove: Callable[[Hashable], object], make_payload: Callable[[int], Any],
                        sizes: Sequence[int], min_window_s: float) -> list[SizePoint]:
    """Time write(key, payload) and read(key) at each size; nothing is left behind."""
    if not sizes:
        raise ValueError("no sizes to measure")
    warm = make_payload(min(sizes))  # first touches (directory, connection) are not a tier's cost
    write("probe-warm-up", warm)
    read("probe-warm-up")
    remove("probe-warm-up")
    points = []
    for nbytes in sizes:
        payload = make_payload(nbytes)
        write_s, writes = time_repeated(lambda i: write(f"probe-w-{nbytes}-{i}", payload),
                                        min_window_s, after=lambda i: remove(f"probe-w-{nbytes}-{i}"))
        key = f"probe-r-{nbytes}"  # strings: a transport may carry keys as JSON
        write(key, payload)
        try:
            read_s, reads = time_repeated(lambda i: read(key), min_window_s)
        finally:
            remove(key)
        points.append(SizePoint(nbytes, write_s, read_s, writes, reads))
    return points


def random_tensor(nbytes: int) -> torch.Tensor:
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8)


def measure_store(store: PageStore, sizes: Sequence[int] = DEFAULT_SIZES,
                  min_window_s: float = MIN_WINDOW_S, method: str | None = None,
                  share_s: float = MAX_S) -> TierMeasurement:
    """A PageStore's put/get, as the executor will pay them (encoding and CRC32 included), and
    what they cost compute beside them on this process's torch threads, measured for at most
    share_s seconds (0: not measured)."""
    points = measure_round_trips(store.put, store.get, store.discard, random_tensor, sizes,
                                 min_window_s)
    share = measure_compute_share(store, max_s=share_s) if share_s > 0 else None
    return TierMeasurement(store.tier, method or f"{type(store).__name__} put/get", points,
                           store.capacity_bytes, share)


def measure_flash(page_dir: str | os.PathLike, sizes: Sequence[int] = DEFAULT_SIZES,
                  min_window_s: float = MIN_WINDOW_S, fsync: bool = True,
                  capacity_bytes: int | None = None, share_s: float = MAX_S) -> TierMeasurement:
    """The board's flash through a FlashStore in `page_dir`.

    With fsync every write is on the device before it counts as done. The page cache is dropped
    after each write and read (posix_fadvise DONTNEED, after the fsync because dirty pages
    cannot be dropped), so reads come from the device rather than from RAM. O_DIRECT would
    bypass the cache outright, but needs aligned buffers and is refused by some filesystems
    (tmpfs, some FUSE/overlay setups), and the executor will not use it either. Capacity is
    the free space on that filesystem unless given.
    """
    with FlashStore(page_dir, fsync=fsync, drop_cache=True) as store:
        free = store.free_bytes()
        sizes, bounded = sizes_that_fit(sizes, free, str(store.page_dir))
        method = (f"FlashStore put/get in {store.page_dir}, "
                  f"{'fsync after each write' if fsync else 'no fsync'}, page cache dropped "
                  f"after each write and read (posix_fadvise DONTNEED"
                  f"{'' if hasattr(os, 'posix_fadvise') else ': not available here'})"
                  + bounded)
        measurement = measure_store(store, sizes, min_window_s, method, share_s)
        # the weight file holds one tensor of each size at once
        in_file = [n for k, n in enumerate(sizes) if free is None or
                   sum(sizes[:k + 1]) <= free // FREE_SHARE]
        measurement.weight_reads = measure_weight_reads(store.directory, in_file or sizes[:1],
                                                        min_window_s)
    measurement.capacity_bytes = capacity_bytes if capacity_bytes is not None else free
    return measurement


FREE_SHARE = 2  # the probes take at most 1/FREE_SHARE of the page folder's free space


def sizes_that_fit(sizes: Sequence[int], free: int | None,
                   where: str) -> tuple[tuple[int, ...], str]:
    """The probe sizes a page folder with `free` bytes holds (one page of each at a time, with
    room to spare), and words for the profile's method where that left some out. QA: a page
    folder on a 2 MiB filesystem failed `profile` with PageStoreFull at its 4 MiB probe, while
    `run` planned for that board."""
    if free is None:
        return tuple(sizes), ""
    kept = tuple(n for n in sizes if n <= free // FREE_SHARE)
    if not kept:
        raise PageStoreFull("(the flash probes)", where, min(sizes), free_bytes=free,
                            cause="measuring the flash tier",
                            remedy=full_remedy("leave page_dir out of the device config to "
                                               "profile without a flash tier"))
    if len(kept) == len(sizes):
        return kept, ""
    return kept, (f"; sizes up to {kept[-1]} bytes, the page folder having {free} bytes "
                  "free")


def measure_weight_reads(folder: str, sizes: Sequence[int],
                         min_window_s: float = MIN_WINDOW_S) -> list[ReadPoint]:
    """Reads of a weight file in `folder`, one tensor of each size, as a run reads a model's
    frozen weights (WeightFile.read: O_DIRECT where the filesystem takes it, else pread with
    the cache dropped); the file is removed after."""
    from ..weights.store import WeightFile, write_weight_file
    if not sizes:
        raise ValueError("no sizes to measure")
    path = os.path.join(folder, "probe-weights")
    tensors = [(f"probe-{nbytes}", (nbytes,), torch.uint8) for nbytes in sizes]
    try:
        write_weight_file(path, "probe", tensors, _slices_of(random_tensor(max(sizes))))
        file = WeightFile(path)
        try:
            file.read(tensors[0][0])  # first touches are not the tier's cost
            points = []
            for name, (nbytes,), _ in tensors:
                read_s, reads = time_repeated(lambda i: file.read(name), min_window_s)
                points.append(ReadPoint(nbytes, read_s, reads))
        finally:
            file.close()
    finally:
        if os.path.exists(path):
            os.remove(path)
    return points


def _slices_of(payload: torch.Tensor):
    """A weight file's `make`: each tensor the start of one payload (one allocation, not one
    a size: the profile job keeps no more heap after the probe)."""
    return lambda name, shape, dtype: payload[:shape[0]]


def measure_link(send: Callable[[Hashable, bytes], object], fetch: Callable[[Hashable], object],
                 drop: Callable[[Hashable], object], sizes: Sequence[int] = DEFAULT_SIZES,
                 min_window_s: float = MIN_WINDOW_S, capacity_bytes: int | None = None,
                 method: str = "link send/fetch round trips") -> TierMeasurement:
    """The link to the host, through the same byte callables a LinkStore is given.

    A write is send(key, bytes) until it returns (the transport decides whether that waits for
    the host's acknowledgement); a read is fetch(key) until the bytes are here.
    """
    points = measure_round_trips(send, fetch, drop, os.urandom, sizes, min_window_s)
    return TierMeasurement("host", method, points, capacity_bytes)
