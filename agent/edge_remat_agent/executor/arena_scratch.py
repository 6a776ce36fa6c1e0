"""What ATen allocates inside the arena executor's nodes, served from the arena's own free ranges
(arena_scratch.cpp).

The arena holds the plan's tensors; what ATen allocates inside a node (intermediates, kernel
scratch, results of ops without an `.out` variant) came from the process's malloc, whose free
pages the executor purged to stay near the plan's peak, each purged page faulting back at its
next use (mobilenet_v2 b8: 7,000-8,000 faults, 1.2-1.4x the glibc executor's CPU time a step).
Here a c10 CPU allocator serves them, during each compute and page-in node (not updates: the
optimizer's state outlives the node), from the arena's bytes that no planned tensor holds at
that node: pages the arena's size already counts. The executor copies what the node keeps into
its slot, so every block is free again by the node's end (checked: the next node's ranges may
hold planned tensors there).

c10::SetCPUAllocator is not reachable from Python, so the allocator is C++, built at its first
use with torch.utils.cpp_extension into the agent's work directory (kept for the next runs) and
loaded through ctypes. Where there is no C++ compiler or the build fails, or
EDGE_REMAT_ARENA_SCRATCH=off, the executor runs as before (ATen's allocations from the malloc,
purged) and the run report's `arena.scratch.unavailable` says why.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
from importlib import resources
from typing import Any, Callable

import torch

SOURCE = "arena_scratch.cpp"
SWITCH_ENV = "EDGE_REMAT_ARENA_SCRATCH"  # "off": neither built nor used
COUNT_NAMES = ("served", "served_bytes", "fallbacks", "fallback_bytes", "freed_late",
               "live_peak_bytes")


class ScratchLeak(RuntimeError):
    """A block served inside a node was still live at its end (an internal error: what the
    node keeps must have been copied out of the free ranges)."""


def build_dir():
    """Where the built library is kept: the agent's work directory (daemon/layout.py)."""
    from ..daemon.layout import Layout
    return Layout().root / "build"


@functools.lru_cache(maxsize=1)
def load_library() -> tuple[ctypes.CDLL | None, str | None]:
    """The built allocator, or None and why it is not there."""
    if os.environ.get(SWITCH_ENV, "").lower() == "off":
        return None, f"{SWITCH_ENV}=off"
    compiler = os.environ.get("CXX") or "c++"
    if shutil.which(compiler) is None:
        return None, f"no C++ compiler ({compiler}) on this machine: install g++ to build it"
    try:
        source = resources.files(__package__).joinpath(SOURCE).read_text()
    except OSError as error:
        return None, f"its source {SOURCE} is not here ({error})"
    key = hashlib.sha256(f"{source}{torch.__version__}".encode()).hexdigest()[:12]
    name = f"edge_remat_arena_scratch_{key}"
    folder = build_dir() / f"arena_scratch-{key}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        built = folder / f"{name}.so"
        if not built.is_file():
            cpp = folder / SOURCE
            cpp.write_text(source)
            from torch.utils.cpp_extension import load
            load(name=name, sources=[str(cpp)], build_directory=str(folder),
                 extra_cflags=["-O2"], is_python_module=False, verbose=False)
        library = ctypes.CDLL(str(built))
    except Exception as error:  # a failed build says why on its last lines
        lines = [line for line in str(error).strip().splitlines() if line.strip()]
        return None, f"building {SOURCE} failed: {lines[-1] if lines else type(error).__name__}"
    u64, p64 = ctypes.c_uint64, ctypes.POINTER(ctypes.c_uint64)
    library.arena_scratch_begin.argtypes = [p64, u64]
    library.arena_scratch_begin.restype = u64
    library.arena_scratch_end.argtypes = [p64, u64]
    library.arena_scratch_end.restype = u64
    library.arena_scratch_live.restype = u64
    library.arena_scratch_holds.argtypes = [u64]
    library.arena_scratch_holds.restype = ctypes.c_int
    library.arena_scratch_installs.restype = ctypes.c_int
    library.arena_scratch_counts.argtypes = [p64]
    return library, None


class ArenaScratch:
    """One run's use of the allocator: begin(t) before instruction t, end() after it, then
    check() once the node's outputs are out of the ranges."""

    def __init__(self, library: ctypes.CDLL, base: int, nbytes: int,
                 free_at: Callable[[int], list[tuple[int, int]]]):
        """`free_at(t)`: instruction t's free ranges, absolute [lo, hi) within the arena at
        `base` (asked once per instruction: the same every step)."""
        self._lib = library
        if not library.arena_scratch_installs():
            raise OSError("another CPU allocator of a higher priority is installed")
        self.lo, self.hi = base, base + nbytes
        self._free_at = free_at
        self._arrays: dict[int, tuple[Any, list[tuple[int, int]]]] = {}
        self._reached = (ctypes.c_uint64 * 1)()
        self._t: int | None = None

    def begin(self, t: int) -> None:
        found = self._arrays.get(t)
        if found is None:
            ranges = self._free_at(t)
            array = (ctypes.c_uint64 * max(2 * len(ranges), 1))(
                *[x for pair in ranges for x in pair])
            found = self._arrays[t] = (array, ranges)
            if len(ranges) > len(self._reached):
                self._reached = (ctypes.c_uint64 * len(ranges))()
        if self._lib.arena_scratch_begin(found[0], len(found[1])):
            raise ScratchLeak("internal error: blocks the arena's scratch served in the node "
                              "before were still live at the next one")
        self._t = t

    def end(self) -> list[tuple[int, int]]:
        """The previous allocator again; the [lo, hi) of each range that blocks were served
        from (its pages touched)."""
        t, self._t = self._t, None
        ranges = self._arrays[t][1] if t is not None else []
        self._lib.arena_scratch_end(self._reached, len(ranges))
        return [(lo, self._reached[i]) for i, (lo, _) in enumerate(ranges)
                if self._reached[i] > lo]

    def holds(self, tensor: torch.Tensor) -> bool:
        ptr = tensor.untyped_storage().data_ptr()
        return self.lo <= ptr < self.hi and bool(self._lib.arena_scratch_holds(ptr))

    def check(self, node: str) -> None:
        live = self._lib.arena_scratch_live()
        if live:
            raise ScratchLeak(f"internal error: {live} block(s) the arena's scratch served in "
                              f"node {node} were still live at its end (they would be "
                              "overwritten by the next node's tensors); run with "
                              f"{SWITCH_ENV}=off and report it")

    def counts(self) -> dict[str, int]:
        out = (ctypes.c_uint64 * len(COUNT_NAMES))()
        self._lib.arena_scratch_counts(out)
        return dict(zip(COUNT_NAMES, map(int, out)))


def open_scratch(base: int, nbytes: int, free_at: Callable[[int], list[tuple[int, int]]]
                 ) -> tuple[ArenaScratch | None, str | None]:
    """The allocator over the free ranges of the arena at `base` (see ArenaScratch), or None
    and why not."""
    library, reason = load_library()
    if library is None:
        return None, reason
    try:
        return ArenaScratch(library, base, nbytes, free_at), None
    except OSError as error:
        return None, str(error)
