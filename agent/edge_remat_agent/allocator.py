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

Without that setting (`map_large_allocations=False`, `--keep-malloc-defaults`), glibc's dynamic
policy is pinned at the state it converges to, so that steady steps do not fault: blocks up to
32 MiB from the heap (where its dynamic mmap threshold tops out), and the heap's freed top kept
rather than trimmed. Left dynamic, the trim threshold is twice the mmap threshold (64 MiB), and a
step's last frees leave more than that at the top of the heap in some steps: glibc returned it
and the next step faulted it back (bert-mini at batch 8, seq 64, 20 steady steps of the
keep-all plan in a loop: 17,000-19,000 minor faults in 10 of them, eager 0-260; pinned, one
step of 20 faulted, and the executor's CPU time a step fell 150 -> 133 ms). The trimmed
pages were ones the next step reaches again, so keeping them raises no step's peak;
give_back_freed_memory() still returns them on request. These settings are process-wide: in a
benchmark, eager and every peer in the same process run under them too.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any, Callable

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameter numbers
MMAP_THRESHOLD_BYTES = 2**20  # 64 KiB..4 MiB measured: 1 MiB kept RSS low at the least cost
STEADY_MMAP_THRESHOLD_BYTES = 32 * 2**20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
NEVER_TRIM = -1  # mallopt(M_TRIM_THRESHOLD, -1): no automatic trimming (glibc's mallopt(3))


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


def steady_heap() -> dict[str, Any] | None:
    """Pin glibc's dynamic policy at its steady state (see the module docstring); None where it
    cannot be set."""
    libc = _glibc()
    if libc is None or not libc.mallopt(M_MMAP_THRESHOLD, STEADY_MMAP_THRESHOLD_BYTES) \
            or not libc.mallopt(M_TRIM_THRESHOLD, NEVER_TRIM):
        return None
    return {"malloc": "glibc", "mmap_threshold_bytes": STEADY_MMAP_THRESHOLD_BYTES,
            "trim": False}


def give_back_freed_memory() -> bool:
    """Return the heap's freed memory to the system now (glibc malloc_trim). True if done."""
    trim = heap_trimmer()
    if trim is None:
        return False
    trim()
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
