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

A process may run under another malloc, preloaded (LD_PRELOAD) at its start: jemalloc or
tcmalloc (`running_malloc()` says which, from the library `malloc` resolves to). glibc's
mallopt and malloc_trim would then tune and trim a heap nothing allocates from, so the settings
above are not made there, and giving freed memory back is that allocator's own purge.
`preload_environment()` is what starts a child under one (executor/arena's `malloc=`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from pathlib import Path
from typing import Any, Callable

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameter numbers
MMAP_THRESHOLD_BYTES = 2**20  # 64 KiB..4 MiB measured: 1 MiB kept RSS low at the least cost
STEADY_MMAP_THRESHOLD_BYTES = 32 * 2**20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
NEVER_TRIM = -1  # mallopt(M_TRIM_THRESHOLD, -1): no automatic trimming (glibc's mallopt(3))


# Once a process: find_library runs `ldconfig -p` at each call (4 ms here, 25 ms under
# qemu-user), and the profiler gives freed memory back several times a node.
@functools.lru_cache(maxsize=1)
def c_library() -> ctypes.CDLL | None:
    """The process's C library through ctypes, or None where there is none to load; callers
    check for the function they need (glibc's mallopt, madvise, ...)."""
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


def _glibc() -> ctypes.CDLL | None:
    """glibc, where it is the malloc this process runs under."""
    libc = c_library()
    if libc is None or not hasattr(libc, "mallopt") or running_malloc() != "glibc":
        return None
    return libc


# The mallocs a process can be started under, and their libraries' names (Debian, Ubuntu,
# Termux: packages libjemalloc2 and libtcmalloc-minimal4).
PRELOADABLE = {"jemalloc": ("libjemalloc.so.2", "libjemalloc.so"),
               "tcmalloc": ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4")}
MALLOCS = ("glibc", *PRELOADABLE)
PACKAGES = {"jemalloc": "libjemalloc2", "tcmalloc": "libtcmalloc-minimal4"}  # Debian's
JEMALLOC_ALL_ARENAS = 4096  # MALLCTL_ARENAS_ALL in jemalloc 5: "arena.4096.purge" purges all


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


@functools.lru_cache(maxsize=1)
def running_malloc() -> str:
    """Which malloc this process's allocations come from: "jemalloc", "tcmalloc", "glibc", or
    "other" (musl, ...): the library the process's `malloc` symbol resolves to (dladdr)."""
    process = ctypes.CDLL(None)
    dladdr = getattr(process, "dladdr", None)
    if dladdr is not None:
        info = _DlInfo()
        dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
        if dladdr(ctypes.cast(process.malloc, ctypes.c_void_p), ctypes.byref(info)) and \
                info.dli_fname:
            name = os.path.basename(info.dli_fname.decode(errors="replace"))
            # A python executable built without PIE (Debian's arm64 python3) holds malloc's
            # canonical address itself, its PLT entry: that names no library.
            if ".so" in name:
                for malloc, libraries in PRELOADABLE.items():
                    if any(name.startswith(library.split(".so")[0] + ".so")
                           for library in libraries):
                        return malloc
                libc = c_library()
                return "glibc" if name.startswith("libc.so") and libc is not None and \
                    hasattr(libc, "mallopt") else "other"
    # No dladdr, or it named the executable: the allocators' own entry points tell them apart.
    if hasattr(process, "mallctl"):
        return "jemalloc"
    if hasattr(process, "MallocExtension_ReleaseFreeMemory"):
        return "tcmalloc"
    libc = c_library()
    return "glibc" if libc is not None and hasattr(libc, "mallopt") else "other"


def malloc_library(malloc: str) -> str | None:
    """`malloc`'s shared library on this machine (a path in the usual library folders, else
    the name the loader's cache knows it by), or None where it is not installed."""
    for library in PRELOADABLE.get(malloc, ()):
        for folder in _library_folders():
            if (Path(folder) / library).is_file():
                return str(Path(folder) / library)
    for library in PRELOADABLE.get(malloc, ()):
        found = ctypes.util.find_library(library[3:].split(".so")[0])
        if found and found.startswith(library.split(".so")[0]):
            return found
    return None


def missing_malloc(malloc: str) -> str:
    """What to say where `malloc`'s library is not installed."""
    return (f"{PRELOADABLE[malloc][0]} is not installed here: install it (Debian, Ubuntu: "
            f"apt-get install {PACKAGES[malloc]}; elsewhere the system's {malloc} package)")


def _library_folders() -> list[str]:
    import sysconfig
    arch = sysconfig.get_config_var("MULTIARCH") or ""
    prefix = os.environ.get("PREFIX", "")  # Termux's /data/data/com.termux/files/usr
    folders = [f for f in os.environ.get("LD_LIBRARY_PATH", "").split(":") if f]
    for root in ("/usr/lib", "/lib", "/usr/local/lib", f"{prefix}/lib" if prefix else ""):
        if root:
            folders += [f"{root}/{arch}", root] if arch else [root]
    return folders


def preload_environment(malloc: str, environ: dict[str, str] | None = None) \
        -> tuple[dict[str, str], str | None]:
    """The environment that starts a child process under `malloc` (LD_PRELOAD its library
    before anything already preloaded), and the library; for "glibc", or where the library is
    not installed, `environ` unchanged and None (the child runs under the system's malloc)."""
    env = dict(os.environ if environ is None else environ)
    library = malloc_library(malloc) if malloc != "glibc" else None
    if library is not None:
        env["LD_PRELOAD"] = ":".join(p for p in (library, env.get("LD_PRELOAD")) if p)
    return env, library


def describe_malloc() -> dict[str, Any]:
    """What the run report says of the malloc this process runs under."""
    malloc = running_malloc()
    described: dict[str, Any] = {"malloc": malloc}
    if malloc == "jemalloc" and os.environ.get("MALLOC_CONF"):
        described["conf"] = os.environ["MALLOC_CONF"]
    return described


def map_large_blocks(threshold_bytes: int = MMAP_THRESHOLD_BYTES) -> dict[str, Any] | None:
    """Fix glibc's mmap threshold for the rest of the process; None where it cannot be set.
    Under another malloc nothing is set: what runs is described."""
    if running_malloc() in PRELOADABLE:
        return describe_malloc()
    libc = _glibc()
    if libc is None or not libc.mallopt(M_MMAP_THRESHOLD, threshold_bytes):
        return None
    return {"malloc": "glibc", "mmap_threshold_bytes": threshold_bytes}


def steady_heap() -> dict[str, Any] | None:
    """Pin glibc's dynamic policy at its steady state (see the module docstring); None where it
    cannot be set. Under another malloc nothing is set: what runs is described."""
    if running_malloc() in PRELOADABLE:
        return describe_malloc()
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
    the free chunks inside every arena are madvised away, not only the heap's top; jemalloc:
    every arena's dirty and muzzy pages purged; tcmalloc: its page heap's free spans
    released), resolved once for a hot path; None where the malloc has none."""
    malloc = running_malloc()
    process = ctypes.CDLL(None)
    if malloc == "jemalloc":
        mallctl = process.mallctl
        mallctl.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p,
                            ctypes.c_void_p, ctypes.c_size_t]
        mallctl.restype = ctypes.c_int
        purge = f"arena.{JEMALLOC_ALL_ARENAS}.purge".encode()
        return lambda: mallctl(purge, None, None, None, 0)
    if malloc == "tcmalloc":
        release = process.MallocExtension_ReleaseFreeMemory
        release.restype = None
        return lambda: release() or 0
    libc = _glibc()
    trim = getattr(libc, "malloc_trim", None) if libc is not None else None
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: trim(0)
