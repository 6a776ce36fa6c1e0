"""Make freed tensor memory leave the resident set, so that RSS follows what the plan holds.

glibc serves a block from its own mmap only above a threshold that starts at 128 KiB and grows
(up to 32 MiB) each time such a block is freed. After a few steps, activations of a few MiB are
carved from the heap, whose freed parts mostly stay resident: measured here, resnet18 (batch
64) peaked ~230 MiB above its live tensors in plain training and ~300 MiB with a plan, which
hid what the plan saves. A fixed threshold keeps every tensor above it in its own mapping,
returned to the system the moment it is freed. Other C libraries are left as they are.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number
MMAP_THRESHOLD_BYTES = 64 * 2**10


def _libc():
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "mallopt") else None


def map_large_blocks(threshold_bytes: int = MMAP_THRESHOLD_BYTES) -> dict[str, Any] | None:
    """Fix glibc's mmap threshold for the rest of the process; None where it cannot be set."""
    libc = _libc()
    if libc is None or not libc.mallopt(M_MMAP_THRESHOLD, threshold_bytes):
        return None
    return {"malloc": "glibc", "mmap_threshold_bytes": threshold_bytes}


def give_back_freed_memory() -> bool:
    """Return the heap's freed memory to the system now (glibc malloc_trim). True if done."""
    libc = _libc()
    if libc is None or not hasattr(libc, "malloc_trim"):
        return False
    libc.malloc_trim(0)
    return True
