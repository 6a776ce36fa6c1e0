"""The arena's pages given back: free ranges' touched pages leave the resident set (mincore
says so), live ranges keep their bytes, and nothing is released within the slack."""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

import pytest
import torch

from edge_remat_agent.executor.arena_pages import PAGE, PageRelease, Range, _minus, _union

MIB = 2 ** 20
linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise, mincore")


def resident_pages(address: int, nbytes: int) -> list[bool]:
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    pages = nbytes // PAGE
    vector = (ctypes.c_ubyte * pages)()
    assert libc.mincore(address, nbytes, vector) == 0
    return [bool(v & 1) for v in vector]


def test_interval_arithmetic():
    assert _union([(0, 4)], [(2, 6), (8, 9)]) == [(0, 6), (8, 9)]
    assert _minus([(0, 10), (20, 30)], [(2, 4), (8, 22)]) == [(0, 2), (4, 8), (22, 30)]
    assert _minus([(0, 10)], []) == [(0, 10)]


@linux
def test_free_ranges_leave_the_resident_set_and_live_ones_keep_their_bytes():
    memory = torch.full((4 * MIB + PAGE,), 7, dtype=torch.uint8)
    base = memory.data_ptr()
    skip = -(-base // PAGE) * PAGE - base  # offsets of whole pages start here
    live = Range(0, 10, skip + 2 * MIB, skip + 3 * MIB)
    dead = Range(0, 2, skip, skip + MIB)
    pages = PageRelease(base, memory.numel(), [dead, live], slack_bytes=0)
    assert pages.available
    pages.touched(0, memory.numel())
    pages.before(1)  # both live: nothing free but the untouched-by-ranges tail and middle
    released_first = pages.released_bytes
    pages.before(5)  # only `live` is live now
    whole = base + skip
    resident = resident_pages(whole, 4 * MIB)
    per_mib = MIB // PAGE
    assert not any(resident[:per_mib]), "the dead range's pages are still resident"
    assert all(resident[2 * per_mib:3 * per_mib]), "the live range lost pages"
    assert bool((memory[skip + 2 * MIB:skip + 3 * MIB] == 7).all())
    assert bool((memory[skip:skip + MIB] == 0).all())  # released pages read back zeroed
    assert pages.released_bytes - released_first >= MIB
    assert pages.resident_bytes() <= MIB + 2 * PAGE  # the live range and partial end pages
    # Bytes outside the arena's whole pages are never released (where the tensor starts on a
    # page boundary, as a heap block can, its last page is whole and may be).
    end = (base + memory.numel()) // PAGE * PAGE - base
    assert memory[:skip].eq(7).all() and memory[end:].eq(7).all()


@linux
def test_nothing_is_released_within_the_slack():
    memory = torch.full((2 * MIB,), 1, dtype=torch.uint8)
    pages = PageRelease(memory.data_ptr(), memory.numel(), [Range(0, 1, 0, MIB)],
                        slack_bytes=4 * MIB)
    pages.touched(0, memory.numel())
    pages.before(3)
    assert pages.released_bytes == 0 and bool(memory.eq(1).all())


@linux
def test_the_unused_tail_of_an_output_range_is_given_back():
    # An instruction that left part of its outputs outside the arena wrote only the head of
    # its range: the touched tail holds nothing and goes back while the range is live.
    memory = torch.full((3 * MIB,), 3, dtype=torch.uint8)
    base = memory.data_ptr()
    skip = -(-base // PAGE) * PAGE - base
    pages = PageRelease(base, memory.numel(), [Range(1, 9, skip, skip + 2 * MIB)],
                        slack_bytes=0)
    pages.touched(skip, skip + 2 * MIB)
    pages.before(2)
    assert pages.released_bytes == 0
    pages.used(1, skip, skip + MIB)
    pages.before(3)
    assert pages.released_bytes >= MIB
    per_mib = MIB // PAGE
    resident = resident_pages(base + skip, 2 * MIB)
    assert all(resident[:per_mib]) and not any(resident[per_mib:])
    assert bool(memory[skip:skip + MIB].eq(3).all())


def anonymous_bytes() -> int:
    with open("/proc/self/smaps_rollup") as rollup:
        for line in rollup:
            if line.startswith("Anonymous:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no Anonymous line in smaps_rollup")


@linux
def test_the_heaps_free_chunks_leave_the_resident_set_when_trimmed():
    """What ATen allocates below the mmap threshold comes from glibc's heap, whose freed
    chunks stay charged until trimmed (executor/arena.py trims before nodes near the peak)."""
    from edge_remat_agent.allocator import heap_trimmer
    trim = heap_trimmer()
    if trim is None:
        pytest.skip("no glibc malloc_trim")
    # 64 KiB blocks (below any mmap threshold) filled, then every other one freed: the free
    # chunks lie between live ones, so only trimming (not the heap's top) gives them back.
    blocks = [torch.ones(16 * 1024) for _ in range(640)]
    del blocks[::2]  # 20 MiB of free chunks, their pages written, so resident
    before = anonymous_bytes()
    trim()
    given_back = before - anonymous_bytes()
    assert given_back >= 10 * MIB, (before, given_back)
    assert len(blocks) == 320


def test_the_heap_is_trimmed_only_where_it_would_pass_the_plans_peak():
    from edge_remat_agent.executor.arena import _trim_thresholds
    from edge_remat_agent.lifetimes import Block
    blocks = [Block(0, 0, "output", 0, 4, 10), Block(1, 1, "output", 1, 3, 30),
              Block(3, 2, "output", 3, 5, 5)]
    # live bytes at instructions 0..5: 10, 40, 40, 15, 5, 0 (peak 40); opened at 0, 1, 3
    assert _trim_thresholds(blocks, 0) == [30, 10, 40, 35, 40, 40]
    assert _trim_thresholds(blocks, 20) == [50, 30, 60, 55, 60, 60]
    assert _trim_thresholds([], 20) == []
