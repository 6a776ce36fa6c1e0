"""The arena's physical pages follow the plan's live tensors: once touched, an arena page stays
charged to the process until it is given back, so an arena that is touched everywhere over a
step costs its whole size at every instruction, while the plan counts only the tensors live
there (plus the running node's workspace, which ATen takes from the CPU allocator). Before a
`compute`, the pages of arena ranges that hold no live block and were touched since they were
last given back are released (madvise MADV_DONTNEED: the kernel drops and uncharges them; the
next write faults in zeroed pages), when the touched bytes exceed the live ones by more than
`slack_bytes`. Only whole pages that no live block shares are released.

CPU only (the pages of a CUDA arena are the device's); where madvise cannot be called (not
Linux, no libc) nothing is released and `available` is False.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
from dataclasses import dataclass

from ..allocator import c_library

MADV_DONTNEED = 4  # Linux
PAGE = mmap.PAGESIZE


def _madvise():
    call = getattr(c_library(), "madvise", None)
    if call is None:
        return None
    call.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    call.restype = ctypes.c_int
    return call


@functools.lru_cache(maxsize=None)
def resident_reader():
    """A call that returns this process's resident bytes (/proc/self/statm, its file kept
    open for the process: about a microsecond a read, for a hot path), or None where there
    is none."""
    import os
    try:
        fd = os.open("/proc/self/statm", os.O_RDONLY)
    except OSError:
        return None
    return lambda: int(os.pread(fd, 128, 0).split()[1]) * PAGE


@dataclass(frozen=True)
class Range:
    start: int  # first instruction it is live at
    end: int  # first instruction it is no longer live at
    lo: int  # arena offsets [lo, hi)
    hi: int
    kind: str = "output"  # the layout block's: "output" | "workspace"


class PageRelease:
    """Gives back the touched pages of an arena (base address, size) that no live range holds.
    `ranges`: every block of the layout with its lifetime and offsets."""

    def __init__(self, base: int, nbytes: int, ranges: list[Range], slack_bytes: int):
        self.base, self.nbytes, self.slack = base, nbytes, slack_bytes
        self.ranges = sorted(ranges, key=lambda r: r.start)
        self._output_at = {r.start: i for i, r in enumerate(self.ranges) if r.kind == "output"}
        self._madvise = _madvise()
        self._first = -(-base // PAGE) * PAGE
        self._last = (base + nbytes) // PAGE * PAGE
        self.available = self._madvise is not None and self._first < self._last
        self.dirty: list[tuple[int, int]] = []  # absolute page-aligned [lo, hi), disjoint
        self.released_bytes = 0  # this step's, for the report
        self.releases = 0
        self._held: dict[int, tuple[list[tuple[int, int]], int]] = {}  # t -> pages, bytes

    def start_step(self) -> None:
        self.released_bytes = self.releases = 0

    def touched(self, lo: int, hi: int) -> None:
        """Arena offsets [lo, hi) are about to be written: their pages become charged."""
        if hi <= lo:
            return
        # Only whole pages inside the arena: the partial ones at its ends may hold the
        # allocator's own data (a small arena is carved from the heap), never released.
        a = max((self.base + lo) // PAGE * PAGE, self._first)
        b = min(-(-(self.base + hi) // PAGE) * PAGE, self._last)
        if a < b:
            self.dirty = _union(self.dirty, [(a, b)])

    def used(self, t: int, lo: int, hi: int) -> None:
        """Instruction t wrote only [lo, hi) of its output range starting at `lo` (what it
        left outside the arena holds nothing here): its tail is not held, and may be given
        back. Each step does the same, so the ranges are cut once."""
        i = self._output_at.get(t)
        r = self.ranges[i] if i is not None else None
        if r is not None and r.lo == lo and hi < r.hi:
            self.ranges[i] = Range(r.start, r.end, r.lo, max(r.lo, hi), r.kind)
            self._held.clear()

    def resident_bytes(self) -> int:
        return sum(hi - lo for lo, hi in self.dirty)

    def before(self, t: int) -> None:
        """At instruction t: release touched pages that no range live at t shares, when the
        touched bytes exceed the live ones by more than the slack."""
        if not self.available or not self.dirty:
            return
        held, held_bytes = self._held_at(t)
        if self.resident_bytes() - held_bytes <= self.slack:
            return
        keep: list[tuple[int, int]] = []
        for lo, hi in _minus(self.dirty, held):
            if self._madvise(lo, hi - lo, MADV_DONTNEED) == 0:
                self.released_bytes += hi - lo
                self.releases += 1
            else:
                keep.append((lo, hi))
        self.dirty = _union(_intersect(self.dirty, held), keep)

    def _held_at(self, t: int) -> tuple[list[tuple[int, int]], int]:
        """The pages of the ranges live at t (the same every step: computed once)."""
        found = self._held.get(t)
        if found is None:
            held = _union([], [((self.base + r.lo) // PAGE * PAGE,
                                -(-(self.base + r.hi) // PAGE) * PAGE)
                               for r in self.ranges if r.start <= t < r.end])
            found = self._held[t] = (held, sum(hi - lo for lo, hi in held))
        return found


def _union(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(a + b):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _intersect(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo < hi:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def _minus(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Parts of the disjoint sorted intervals `a` outside the disjoint sorted intervals `b`."""
    out = []
    for lo, hi in a:
        cursor = lo
        for blo, bhi in b:
            if bhi <= cursor or blo >= hi:
                continue
            if blo > cursor:
                out.append((cursor, blo))
            cursor = max(cursor, bhi)
        if cursor < hi:
            out.append((cursor, hi))
    return out
