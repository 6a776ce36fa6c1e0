"""A heap for what ATen allocates inside the arena executor's nodes (arena_heap.cpp).

The arena holds the plan's tensors; what ATen allocates inside a node (intermediates, kernel
scratch, results it keeps where it put them) came from the process's malloc, whose free pages
the executor had to purge to stay near the plan's peak, and every purged page faulted back
in at its next use (mobilenet_v2 b8 at its floor: 8,000 faults and 1.3x the glibc executor's
CPU time a step). Here a c10 CPU allocator serves them from one region, reserved once per run
and never given back while the run lasts: a freed block is served again from pages already
resident, so nothing needs purging. It is installed around each compute and page-in node only
(parameters, optimizer state and what the runner keeps to the step's end come from the
allocator before it), and the region is unmapped once the run has ended and its last block is
freed, so a tensor that outlives the run stays valid.

The allocator is C++ (c10::SetCPUAllocator is not reachable from Python): built at its first
use with torch.utils.cpp_extension into the agent's work directory (kept there for the next
runs), loaded through ctypes. Where there is no C++ compiler or the build fails, the executor
runs as before (its malloc, purged) and the run report's `arena.heap.unavailable` says why.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import torch

SOURCE = "arena_heap.cpp"
BUILD_ENV = "EDGE_REMAT_ARENA_HEAP"  # "off": do not build or use it (the malloc's path)
COUNT_NAMES = ("allocations", "allocated_bytes", "fallbacks", "fallback_bytes", "frees",
               "high_water_bytes", "live_bytes", "regions")


@dataclass
class HeapLibrary:
    library: ctypes.CDLL
    path: str


def build_dir() -> Path:
    """Where the built library is kept: the agent's work directory (daemon/layout.py)."""
    from ..daemon.layout import Layout
    return Layout().root / "build"


@functools.lru_cache(maxsize=1)
def load_heap() -> tuple[HeapLibrary | None, str | None]:
    """The built allocator, or None and why it is not there."""
    if os.environ.get(BUILD_ENV, "").lower() == "off":
        return None, f"{BUILD_ENV}=off"
    compiler = os.environ.get("CXX") or "c++"
    if shutil.which(compiler) is None:
        return None, f"no C++ compiler ({compiler}) on this machine: install g++ to build it"
    try:
        source = resources.files(__package__).joinpath(SOURCE).read_text()
    except OSError as error:
        return None, f"its source {SOURCE} is not here ({error})"
    # One build per source and torch version, kept in the work directory.
    key = hashlib.sha256(f"{source}{torch.__version__}".encode()).hexdigest()[:12]
    folder = build_dir() / f"arena_heap-{key}"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        cpp = folder / SOURCE
        if not cpp.is_file() or cpp.read_text() != source:
            cpp.write_text(source)
        from torch.utils.cpp_extension import load
        path = load(name=f"edge_remat_arena_heap_{key}", sources=[str(cpp)],
                    build_directory=str(folder), extra_cflags=["-O2"],
                    is_python_module=False, verbose=False)
        library = ctypes.CDLL(str(path) if path else str(folder / f"edge_remat_arena_heap_{key}.so"))
    except Exception as error:  # a failed build says why on its last lines
        lines = [line for line in str(error).strip().splitlines() if line.strip()]
        return None, f"building {SOURCE} failed: {lines[-1] if lines else type(error).__name__}"
    library.arena_heap_open.argtypes = [ctypes.c_uint64]
    library.arena_heap_open.restype = ctypes.c_int
    library.arena_heap_install.restype = ctypes.c_int
    library.arena_heap_trim.restype = ctypes.c_uint64
    library.arena_heap_counts.argtypes = [ctypes.POINTER(ctypes.c_uint64)]
    return HeapLibrary(library, str(path)), None


class RegionHeap:
    """One run's region: open() reserves it, install()/uninstall() around a node, close() at
    the run's end (the region goes once its last block is freed)."""

    def __init__(self, heap: HeapLibrary, region_bytes: int):
        self.heap, self.region_bytes = heap, region_bytes
        self._lib = heap.library
        failed = self._lib.arena_heap_open(region_bytes)
        if failed:
            raise OSError(failed, f"reserving {region_bytes} bytes for the arena's heap")
        self.install, self.uninstall = self._lib.arena_heap_install, self._lib.arena_heap_uninstall
        if not self.install():
            self.close()
            raise OSError("another CPU allocator of a higher priority is installed")
        self.uninstall()

    def counts(self) -> dict[str, int]:
        out = (ctypes.c_uint64 * len(COUNT_NAMES))()
        self._lib.arena_heap_counts(out)
        return dict(zip(COUNT_NAMES, map(int, out)))

    def trim(self) -> int:
        """Give back the region's free whole pages now; the bytes given back."""
        return self._lib.arena_heap_trim()

    def close(self) -> None:
        self.uninstall()
        self._lib.arena_heap_close()


def open_heap(region_bytes: int) -> tuple[RegionHeap | None, str | None]:
    """A region heap of `region_bytes` (address space; pages are charged once touched), or
    None and why not."""
    heap, reason = load_heap()
    if heap is None:
        return None, reason
    try:
        return RegionHeap(heap, region_bytes), None
    except OSError as error:
        return None, str(error)
