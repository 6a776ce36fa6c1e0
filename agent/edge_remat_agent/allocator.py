"""Make freed tensor memory leave the resident set, so that RSS follows what a plan holds.

glibc serves a block from its own mmap only above a threshold that starts at 128 KiB and grows
(up to 32 MiB) each time such a block is freed. After a few steps, activations of a few MiB are
carved from the heap, whose freed parts stay resident: measured here (2-core x86, torch 2.13),
plain training of resnet18 at batch 64 peaked at 992 MiB RSS with glibc's default and 727 MiB
with a fixed 1 MiB threshold, and a plan's savings were hidden by the heap's slack. The price is
a page fault for each page of each new tensor: steps took 1.5-2x longer there (resnet18 batch
64: 0.76 -> 1.38 s; mobilenet_v2 batch 32 at 64x64: 0.18 -> 0.33 s). The executor and the op
profiler both set it (their timings then agree), unless asked not to. Other C libraries are
left as they are.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any, Callable

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number
MMAP_THRESHOLD_BYTES = 2**20  # 64 KiB..4 MiB measured: 1 MiB kept RSS low at the least cost


def c_library() -> ctypes.CDLL | None:
    """The process's C library through ctypes, or None where there is none to load; callers
    check for the function they need (glibc's mallopt, madvise, ...)."""
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


def _glibc() -> ctypes.CDLL | None:
    libc = c_library()
    return libc if libc is not None and hasattr(libc, "mallopt") else None


def map_large_blocks(threshold_bytes: int = MMAP_THRESHOLD_BYTES) -> dict[str, Any] | None:
    """Fix glibc's mmap threshold for the rest of the process; None where it cannot be set."""
    libc = _glibc()
    if libc is None or not libc.mallopt(M_MMAP_THRESHOLD, threshold_bytes):
        return None
    return {"malloc": "glibc", "mmap_threshold_bytes": threshold_bytes}


def give_back_freed_memory() -> bool:
    """Return the heap's freed memory to the system now (glibc malloc_trim). True if done."""
    libc = _glibc()
    if libc is None or not hasattr(libc, "malloc_trim"):
        return False
    libc.malloc_trim(0)
    return True


def heap_trimmer() -> Callable[[], int] | None:
    """A call that returns the heap's free pages to the system now (glibc malloc_trim(0):
    the free chunks inside every arena are madvised away, not only the heap's top), resolved
    once for a hot path; None where there is no glibc."""
    libc = _glibc()
    trim = getattr(libc, "malloc_trim", None) if libc is not None else None
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: trim(0)
