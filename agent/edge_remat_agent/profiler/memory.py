"""Memory as the executor will report it: resident set size (current, sampled peak, the kernel's
own peak), the runtime's baseline footprint, and a ledger of live tensor bytes.

The ledger is what the plan promised (tensor bytes); resident memory is what the board paid
(plus allocator slack, the interpreter, torch's libraries). The run report shows both.
"""

from __future__ import annotations

import bisect
import json
import os
import pickle
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Hashable

import torch

try:
    import psutil
except ImportError:  # optional on boards: /proc and `resource` cover Linux
    psutil = None

try:
    import resource
except ImportError:  # Windows
    resource = None


# Resident memory -------------------------------------------------------------------------------

def current_rss_bytes(pid: int | None = None) -> int:
    """Resident set size of a process (this one by default), in bytes."""
    pid = os.getpid() if pid is None else pid
    if psutil is not None:
        return psutil.Process(pid).memory_info().rss
    with open(f"/proc/{pid}/statm") as handle:  # pages: size resident shared ...
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def kernel_peak_rss_bytes(pid: int | None = None) -> int | None:
    """VmHWM from /proc/<pid>/status: the kernel's own resident high-water mark (Linux)."""
    return _status_bytes("VmHWM", pid)


def _status_bytes(field: str, pid: int | None = None) -> int | None:
    """A kB field of /proc/<pid>/status in bytes; None where there is none (not Linux)."""
    try:
        with open(f"/proc/{'self' if pid is None else pid}/status") as handle:
            for line in handle:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def reset_kernel_peak(pid: int | None = None) -> bool:
    """Restart VmHWM from the current RSS (Linux >= 4.0: write 5 to clear_refs). True if done."""
    try:
        with open(f"/proc/{'self' if pid is None else pid}/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def resident_peak_bytes(run: Callable[[], Any]) -> int | None:
    """How far this process's resident set rose above its start while `run()` ran: every
    byte a call touched and let go of before returning, whoever allocated it (c10's allocator,
    oneDNN's own malloc, a library's thread-local buffers), which torch's allocator events do
    not all see. Freed heap memory is handed back first (malloc_trim), so that memory the
    call takes is counted rather than found among free heap pages. None where the kernel's
    high-water mark cannot be reset (not Linux).
    The rise is counted from the high-water mark as the reset left it, not from the resident
    set: the kernel sets the mark from its approximate (per-CPU) resident counters, and after
    other threads freed memory it may start pages above the exact resident set (one read of
    /proc/self/status, Linux 6.18, 2 CPUs: 36-100 KiB above VmRSS and smaps_rollup's Rss).
    Counted from the resident set, every tiny op of a small model's profile took that gap
    for scratch (60-150 KiB, the same on every repeat)."""
    from ..allocator import give_back_freed_memory
    give_back_freed_memory()
    if not reset_kernel_peak():
        return None
    start = max(current_rss_bytes(), kernel_peak_rss_bytes() or 0)
    run()
    peak = kernel_peak_rss_bytes()
    return None if peak is None else max(0, peak - start)


def anonymous_resident_bytes() -> int | None:
    """This process's resident anonymous memory (RssAnon, /proc/self/status), after the heap's
    free pages are given back: what a memory cgroup charges it beyond the page cache. The
    resident set also counts pages of torch's shared libraries mapped in on first use, which
    the page cache holds and the kernel may drop, so it is no measure of memory a call keeps.
    None where there is no such line (not Linux)."""
    from ..allocator import give_back_freed_memory
    give_back_freed_memory()
    return _status_bytes("RssAnon")


def ru_maxrss_bytes() -> int | None:
    """getrusage's ru_maxrss for this process (KiB on Linux, bytes on macOS)."""
    if resource is None:
        return None
    value = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return value if sys.platform == "darwin" else value * 1024


class PeakRssSampler:
    """The resident peak of a process over a `with` block, two independent ways.

        with PeakRssSampler() as rss:
            step()
        rss.peak_bytes, rss.peak_sampled_bytes, rss.peak_kernel_bytes

    A background thread samples RSS every `period_s` (it can miss a spike shorter than that);
    on Linux the kernel's VmHWM is reset on entry and read on exit, which misses nothing.
    `always_sample=False` starts the thread only where that reset fails: a Python thread waking
    every 2 ms takes the GIL from the step it measures (10-50% of a step on 2 cores, measured by
    benchmarks/end_to_end.py), so the executor's StepMeter leaves it to the kernel. For
    this process ru_maxrss is recorded too (Linux takes it from the same high-water mark, so it
    can be stale from before the reset; it is kept as a cross-check).
    """

    def __init__(self, pid: int | None = None, period_s: float = 0.002,
                 reset_kernel: bool = True, always_sample: bool = True):
        if period_s <= 0:
            raise ValueError(f"period_s must be > 0, got {period_s}")
        self.pid = pid
        self.period_s = period_s
        self.reset_kernel = reset_kernel
        self.always_sample = always_sample
        self.start_bytes = 0
        self.end_bytes = 0
        self.peak_sampled_bytes = 0
        self.peak_kernel_bytes: int | None = None
        self.ru_maxrss_bytes: int | None = None
        self.samples = 0
        self.duration_s = 0.0
        self.error: BaseException | None = None
        self._kernel_reset = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_t = 0.0

    @property
    def peak_bytes(self) -> int:
        return max(self.peak_sampled_bytes, self.peak_kernel_bytes or 0)

    def _sample(self) -> None:
        rss = current_rss_bytes(self.pid)
        self.samples += 1
        if rss > self.peak_sampled_bytes:
            self.peak_sampled_bytes = rss

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self._sample()
            except Exception as error:  # the process went away; reported in result()
                self.error = error
                return

    def __enter__(self) -> PeakRssSampler:
        self._kernel_reset = self.reset_kernel and reset_kernel_peak(self.pid)
        self.start_bytes = self.peak_sampled_bytes = current_rss_bytes(self.pid)
        self.samples = 1
        self.error = None
        self._stop.clear()
        self._start_t = time.perf_counter()
        self._thread = None
        if self.always_sample or not self._kernel_reset:
            self._thread = threading.Thread(target=self._run, name="PeakRssSampler",
                                            daemon=True)
            self._thread.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.duration_s = time.perf_counter() - self._start_t
        try:
            self._sample()
            self.end_bytes = current_rss_bytes(self.pid)
        except Exception as error:
            self.error = self.error or error
        # Without a reset VmHWM is the lifetime peak, not this window's: do not report it.
        self.peak_kernel_bytes = kernel_peak_rss_bytes(self.pid) if self._kernel_reset else None
        self.ru_maxrss_bytes = ru_maxrss_bytes() if self.pid in (None, os.getpid()) else None

    def result(self) -> dict[str, Any]:
        return {"peak_bytes": self.peak_bytes, "peak_sampled_bytes": self.peak_sampled_bytes,
                "peak_kernel_bytes": self.peak_kernel_bytes, "ru_maxrss_bytes": self.ru_maxrss_bytes,
                "start_bytes": self.start_bytes, "end_bytes": self.end_bytes,
                "samples": self.samples, "period_s": self.period_s,
                "duration_s": self.duration_s,
                "error": None if self.error is None else str(self.error)}


# The runtime's own footprint -------------------------------------------------------------------

@dataclass
class RuntimeFootprint:
    python_bytes: int  # a bare interpreter (resident set)
    torch_bytes: int  # after `import torch`
    model_bytes: int | None = None  # after building the model (kept) and an optimizer for it
    model_parameter_bytes: int | None = None  # its parameters and buffers
    torch_version: str = ""
    # The same points' anonymous resident bytes (RssAnon); None where the kernel has no such
    # line (before Linux 4.5) or the figure predates it
    torch_anon_bytes: int | None = None
    model_anon_bytes: int | None = None

    @property
    def baseline_bytes(self) -> int:
        """What the runtime holds that a graph does not count, as the kernel charges it.

        A graph's fixed memory already counts parameters and buffers, so they are taken out of
        the after-the-model figure; without a model it is the interpreter plus torch. Anonymous
        memory where it was read: the resident set also counts the pages of torch's libraries,
        page cache the kernel charges to whichever cgroup read them first and reclaims under a
        limit (QA: digits-cnn's probe 300 MiB resident, 213 MiB anonymous; the whole board,
        agent included, charged 249 MiB before step 1 under --memory-limit).
        """
        torch_bytes = self.torch_bytes if self.torch_anon_bytes is None else self.torch_anon_bytes
        model_bytes = self.model_bytes if self.model_anon_bytes is None else self.model_anon_bytes
        if model_bytes is None:
            return torch_bytes
        return max(torch_bytes, model_bytes - (self.model_parameter_bytes or 0))

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "baseline_bytes": self.baseline_bytes}


# Runs in a fresh interpreter: the parent has already imported everything, so its own RSS
# says nothing about what importing torch costs.
_PROBE = r"""
import json, os, pickle, sys
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
def anon():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return None
out = {"python_bytes": rss()}
import torch
out["torch_bytes"], out["torch_anon_bytes"] = rss(), anon()
out["torch_version"] = torch.__version__
build = pickle.loads(sys.stdin.buffer.read() or pickle.dumps(None))
if build is not None:
    built = build()
    module = built[0] if isinstance(built, tuple) else built
    if isinstance(module, torch.nn.Module):
        # Training needs an optimizer, and making one imports torch._dynamo (~70 MB resident
        # with torch 2.13): part of the runtime, before any optimizer state exists.
        torch.optim.SGD([p for p in module.parameters() if p.requires_grad] or
                        [torch.nn.Parameter(torch.zeros(1))], lr=0.01)
    out["model_bytes"], out["model_anon_bytes"] = rss(), anon()
    if isinstance(module, torch.nn.Module):
        out["model_parameter_bytes"] = sum(
            t.numel() * t.element_size() for t in list(module.parameters()) + list(module.buffers()))
print(json.dumps(out), flush=True)
from edge_remat_agent.process_exit import skip_exit_collections
skip_exit_collections()  # the profile waits for this process to end
"""


def measure_runtime_footprint(build_model: Callable[[], Any] | None = None,
                              timeout_s: float = 300.0) -> RuntimeFootprint:
    """RSS of a fresh interpreter: bare, after `import torch`, after `build_model()`.

    `build_model` runs in that child, so it must be picklable by reference: a module-level
    function, or functools.partial of one (e.g. partial(zoo.build, "mlp")), not a lambda. It
    may return a module or (module, example inputs), like the zoo's build.
    """
    try:
        payload = pickle.dumps(build_model)
    except (pickle.PicklingError, AttributeError, TypeError) as error:
        raise ValueError(f"build_model must be importable by name in a fresh interpreter (a "
                         f"module-level function or a functools.partial of one): {error}") from None
    if not os.path.exists("/proc/self/statm"):
        raise RuntimeError("the footprint probe reads /proc/self/statm: Linux only")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    done = subprocess.run([sys.executable, "-c", _PROBE], input=payload, capture_output=True,
                          timeout=timeout_s, env=env)
    if done.returncode != 0:
        # the child's last line, its exception: a job's error is one line, not a traceback
        said = done.stderr.decode(errors="replace").strip().splitlines()
        raise RuntimeError(f"footprint probe failed ({done.returncode}): "
                           + (said[-1] if said else "it said nothing"))
    return RuntimeFootprint(**json.loads(done.stdout.decode().strip().splitlines()[-1]))


# Live tensor bytes -----------------------------------------------------------------------------

def span_bytes(tensor: torch.Tensor) -> int:
    """The bytes from a view's first element to just past its last (a dense tensor's own
    bytes; works on meta tensors too)."""
    if tensor.numel() == 0:
        return 0
    last = sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride()))
    return (last + 1) * tensor.element_size()


@dataclass(frozen=True)
class LedgerRise:
    """A window's peak above the live bytes it started from: in all, by class, its key."""

    bytes: int
    by_class: tuple[tuple[str, int], ...]
    key: Hashable


class LiveTensorLedger:
    """Bytes of the tensors the executor holds, and their peak: the figure a plan predicts.

        ledger.register(node, nbytes)          or ledger.register_tensor(node, tensor)
        ledger.unregister(node)                on free / page_out
        ledger.live_bytes, ledger.peak_bytes

    register_tensor counts a tensor's whole storage, once per storage: two nodes whose outputs
    are views of one storage (a reshape, a slice) hold its memory once, and it is freed when
    the last of them goes.

    With `classify` (key -> class name, see memory_classes.ledger_classifier) it also keeps the
    live bytes by class and their split at the peak (`peak_by_class`); a shared storage counts
    in the class of the key that brought it.

    A storage given to `split_storage` (the arena executor's one storage, which holds every
    slot) is counted by the bytes its live views span instead: a view inside the span of a
    live one counts nothing more, as a view of an ordinary storage does.

    One thread registers and unregisters: the executor's (overlapped paging's IO thread
    calls the page stores only). Another thread may read `live_bytes` and `peak_bytes`.
    """

    def __init__(self, classify: Callable[[Hashable], str] | None = None):
        self._entries: dict[Hashable, tuple[int | None, int]] = {}  # key -> (storage id, bytes)
        self._storage_refs: dict[int, int] = {}
        self._made: set[int] | None = None  # see storages_made
        self.live_bytes = 0
        self.peak_bytes = 0
        self.peak_key: Hashable | None = None  # the registration that set the peak
        self._classify = classify
        self._counted_as: dict[Hashable, str] = {}  # storage (or key) -> the class it counts in
        self._class_of: dict[Hashable, str] = {}  # key -> its class (keys recur every step)
        self.live_by_class: dict[str, int] = {}
        self._peak_by_class: dict[str, int] = {}
        self._peak_split_due = False  # a new peak whose split by class is not taken yet
        self._split: dict[int, list[int]] = {}  # split storage -> its live spans' starts, sorted
        self._span_end: dict[int, tuple[int, int]] = {}  # span start -> (end, split storage)

    def register(self, key: Hashable, nbytes: int) -> None:
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        self._add(key, None, nbytes)

    def register_tensor(self, key: Hashable, tensor: torch.Tensor) -> int:
        """Register `tensor`'s storage under `key`; returns the bytes newly counted."""
        storage = tensor.untyped_storage()
        ptr = storage.data_ptr()
        if self._split and ptr in self._split:
            return self._add_span(key, ptr, tensor)
        return self._add(key, ptr or None, storage.nbytes())

    def split_storage(self, ptr: int) -> None:
        """Count the views of the storage at data pointer `ptr` by the bytes they span."""
        self._split.setdefault(ptr, [])

    def _add_span(self, key: Hashable, storage: int, tensor: torch.Tensor) -> int:
        """A view of a split storage: counted under the start of the live span holding it
        (its own, if none does)."""
        lo = tensor.data_ptr()
        hi = lo + span_bytes(tensor)
        starts = self._split[storage]
        k = bisect.bisect_right(starts, lo)
        if k and self._span_end[starts[k - 1]][0] >= hi:
            lo = starts[k - 1]  # inside a live span: counted there
        elif lo not in self._span_end:
            starts.insert(k, lo)
            self._span_end[lo] = (hi, storage)
        return self._add(key, lo, hi - lo)

    # register_tensor and unregister run for every value the executor makes and drops (a few
    # thousand per step): kept to plain dict work, with each key's class looked up once, and
    # without a lock (see the class docstring; taking one cost 0.4 us a call).
    def _add(self, key: Hashable, storage: int | None, nbytes: int) -> int:
        entries = self._entries
        if key in entries:
            raise KeyError(f"{key!r} is already registered; unregister it first")
        entries[key] = (storage, nbytes)
        if storage is not None:
            refs = self._storage_refs
            count = refs.get(storage, 0)
            refs[storage] = count + 1
            if count:
                return 0  # that memory is already counted
            if self._made is not None:
                self._made.add(storage)
        live = self.live_bytes = self.live_bytes + nbytes
        if self._classify is not None:
            name = self._class_of.get(key)
            if name is None:
                name = self._class_of[key] = self._classify(key)
            self._counted_as[key if storage is None else storage] = name
            by_class = self.live_by_class
            by_class[name] = by_class.get(name, 0) + nbytes
        if live > self.peak_bytes:
            self.peak_bytes = live
            self.peak_key = key
            # Its split is taken when live bytes next fall (or when asked): a step's
            # forward sets a new peak at almost every value, a copy each would cost.
            self._peak_split_due = self._classify is not None
        return nbytes

    def unregister(self, key: Hashable) -> int:
        """Forget `key`; returns the bytes that stopped being live (0 for a shared storage)."""
        try:
            storage, nbytes = self._entries.pop(key)
        except KeyError:
            raise KeyError(f"{key!r} is not registered") from None
        if storage is not None:
            refs = self._storage_refs
            count = refs[storage] - 1
            if count:
                refs[storage] = count
                return 0
            del refs[storage]
            if self._span_end:
                span = self._span_end.pop(storage, None)
                if span is not None:  # the span's last view is gone
                    self._split[span[1]].remove(storage)
        if self._peak_split_due:  # nothing fell since the peak: live is the peak's split
            self._peak_by_class = dict(self.live_by_class)
            self._peak_split_due = False
        self.live_bytes -= nbytes
        if self._classify is not None:
            name = self._counted_as.pop(key if storage is None else storage)
            self.live_by_class[name] -= nbytes
        return nbytes

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def storages_made(self) -> set[int]:
        """The storages (data pointers) first registered since the last call, none of their
        keys registered before: asked before and after a node runs, what the node made, as
        against what it only views (the arena executor). The first call starts the count."""
        made, self._made = self._made, set()
        return made if made is not None else set()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def peak_by_class(self) -> dict[str, int]:
        """The live bytes by class at the peak."""
        if self._peak_split_due:
            self._peak_by_class = dict(self.live_by_class)
            self._peak_split_due = False
        return self._peak_by_class

    def reset_peak(self) -> None:
        """Start a new window (a new step): the peak restarts from what is live now."""
        self.peak_bytes = self.live_bytes
        self.peak_key = None
        self._peak_by_class = dict(self.live_by_class)
        self._peak_split_due = False

    # A window's rise (executor/ledger_replay.py): measured over steps that register and
    # unregister the same tensors, then laid on top of a later step that registers none.

    def open_window(self) -> tuple:
        """Start measuring a rise from what is live now (the peak restarts here; rise_since
        puts back an earlier peak the window did not pass)."""
        split = self.peak_by_class
        mark = (self.live_bytes, dict(self.live_by_class), len(self._entries),
                self.peak_bytes, self.peak_key, dict(split))
        self.reset_peak()
        return mark

    def rise_since(self, mark: tuple) -> LedgerRise | None:
        """How far the peak rose above the live bytes at `mark` (by class, and the key that
        set it); None when the ledger is not back where it was at `mark` (live bytes, their
        split by class, the number of entries)."""
        live, by_class, entries, peak, peak_key, peak_split = mark
        split = self.peak_by_class
        classes = sorted(set(split) | set(by_class))
        rise = LedgerRise(self.peak_bytes - live,
                          tuple((c, split.get(c, 0) - by_class.get(c, 0)) for c in classes),
                          self.peak_key)
        back = self.live_bytes == live and len(self._entries) == entries and all(
            self.live_by_class.get(c, 0) == by_class.get(c, 0)
            for c in set(self.live_by_class) | set(by_class))
        if peak >= self.peak_bytes:  # as if the window had not restarted the peak
            self.peak_bytes, self.peak_key, self._peak_by_class = peak, peak_key, peak_split
        return rise if back else None

    def raise_peak(self, rise: LedgerRise) -> None:
        """The peak a window with `rise` reaches from what is live now."""
        live = self.live_bytes + rise.bytes
        if live > self.peak_bytes:
            split = dict(self.live_by_class)
            for name, nbytes in rise.by_class:
                split[name] = split.get(name, 0) + nbytes
            self.peak_bytes, self.peak_key, self._peak_by_class = live, rise.key, split
            self._peak_split_due = False

    def result(self) -> dict[str, Any]:
        return {"live_bytes": self.live_bytes, "peak_bytes": self.peak_bytes,
                "peak_key": self.peak_key, "entries": len(self._entries)}
