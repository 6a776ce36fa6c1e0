"""Overlapped paging: page-ins prefetched and page-outs written behind on one IO thread.

On a CUDA device the IO thread copies on a stream of its own (CopyStream): each read or write
first waits for an event recorded on the compute stream where the plan issued it (the
tensor it writes is computed; the memory it reads into is no longer used), and completes
when its copies have, so compute goes on while pages move.

The rules are timeline.py's, which the simulator and the planner use: a page_in starts reading
where the plan issues it (its bytes counted from there) and compute waits for it only at the
tensor's first use (a page_in from "home" reads a param node's group from its parameters' home
the same way, through the runner's load_parameter); a page_out is written behind, its tensor
held (and counted) until the write completes; before each instruction the oldest writes are
waited for while the simulator's RAM there plus the writes in flight is over the plan's
synchronous peak, so the ledger never goes above the peak the plan predicts.

Thread safety: the IO thread only runs the page store's put and get (file writes and reads,
which release the GIL, into tensors the page codec allocates) and the parameter home's reads;
the step's values, the ledger and the counts are touched on the executor's thread alone. An
update waits for the reads of its own group still in flight before it writes the group's new
version (which drops the old one from the home).
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from ..capture.replay import StepRunner
from ..formats import Graph, Instruction
from ..pages import PageStore
from ..pages.codec import is_dense, reading_into
from ..timeline import over_limit


class IoFailed(Exception):
    """A read or write on the IO thread failed; `where` is the instruction that issued it."""

    def __init__(self, where: tuple[int, int, Instruction], error: BaseException):
        super().__init__(str(error))
        self.where, self.error = where, error


@dataclass
class Pending:
    future: Future
    where: tuple[int, int, Instruction]  # (stage, position, instruction) that issued it
    ledger_keys: tuple  # what it holds in the ledger until it completes
    plan_bytes: int = 0  # the tensor's size in the plan's memory model (writes)
    home: bool = False  # a param node's group read from its parameters' home
    # A write's tensors, kept alive until this thread unregisters their keys: the IO thread
    # drops its own reference when the write ends, and a storage freed while its key is still
    # registered lets the next tensor at that address count as already counted (the ledger
    # keys storages by address), leaving the ledger the difference of the two sizes too high.
    holds: tuple = ()


class CopyStream:
    """A CUDA stream for the IO thread's copies, ordered after the compute stream's work at
    each issue (None on the CPU: the IO thread's store calls need no ordering there)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.stream = torch.cuda.Stream(device)

    @staticmethod
    def for_device(device: torch.device | None) -> "CopyStream | None":
        return CopyStream(device) if device is not None and device.type == "cuda" else None

    def issue(self) -> torch.cuda.Event:
        """An event on the compute stream, here, where the plan issues a read or a write."""
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        return event

    @contextlib.contextmanager
    def after(self, issued: torch.cuda.Event):
        """On the IO thread: the copies inside run on this stream once `issued` has passed,
        and are complete when the block ends."""
        with torch.cuda.stream(self.stream):
            self.stream.wait_event(issued)
            yield
            self.stream.synchronize()


class OverlappedPaging:
    def __init__(self, runner: StepRunner, graph: Graph, stores: dict[str, PageStore],
                 counts: Any, sync_trace: list[int], limit_bytes: int):
        self.runner, self.graph, self.stores, self.counts = runner, graph, stores, counts
        self.copies = CopyStream.for_device(runner.device)
        self.trace, self.limit = sync_trace, limit_bytes
        self.ledger = runner.ledger
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="edge-remat-io")
        self.arriving: dict[Any, Pending] = {}
        self.writes: deque[Pending] = deque()
        self.in_flight = 0  # plan bytes of the writes in flight
        self.on_tier: dict[str, set] = {}  # nodes whose page the tier holds this step
        self.page_bytes: dict[Any, int] = {}  # node -> bytes its page holds (ledger figure)
        self.layouts: dict[Any, dict] = {}  # node -> {output: (shape, stride, dtype)} paged out
        self._serial = 0
        self._readers: dict[str, list[Any]] = {}  # parameter name -> param nodes that load it
        for node in graph.nodes:
            if node.kind == "param":
                for name in node.attrs["params"]:
                    self._readers.setdefault(name, []).append(node.id)

    # -- before each instruction ----------------------------------------------------------

    def before(self, index: int, ins: Instruction) -> None:
        """Waits the timeline's rules ask for before instruction `index` of the step."""
        while self.writes and self.writes[0].future.done():
            self._finish_write(self.writes.popleft(), waited=0.0)
        if ins.op in ("free", "page_out") and ins.node in self.arriving:
            self.arrive(ins.node)
        while self.writes and over_limit(self.trace[index], self.in_flight, self.limit):
            start = time.perf_counter()
            pending = self.writes.popleft()
            _result(pending)
            self._finish_write(pending, waited=time.perf_counter() - start)

    def inputs_ready(self, node_id: Any) -> None:
        """A compute is about to read its inputs: wait for those still being paged in (an
        update: also for its group's reads from home, before it writes the group anew)."""
        node = self.graph.node(node_id)
        for dep in node.inputs:
            if dep in self.arriving:
                self.arrive(dep)
        if node.kind == "update" and self.arriving:
            for name in node.attrs.get("params", ()):
                for reader in self._readers.get(name, ()):
                    if reader in self.arriving:
                        self.arrive(reader)

    # -- the paging instructions ----------------------------------------------------------

    def page_in(self, ins: Instruction, where: tuple[int, int, Instruction]) -> None:
        store = self.stores[ins.tier]
        names = self.graph.node(ins.node).attrs["outputs"]
        key = ("paging in", ins.node, self._next())
        # Counted from the issue on, as the plan counts it (the read allocates when it starts).
        self.ledger.register(key, self.page_bytes.get(ins.node,
                                                      self.graph.node(ins.node).out_bytes))
        # The tensors the read fills are allocated here, on the executor's thread, at the
        # issue: the plan counts them from there, and an allocator profiler (thread-local in
        # torch) sees them as it sees every other tensor of the step.
        layout = self.layouts.get(ins.node, {})
        if self.copies is not None and not store.fills_device_tensors:
            layout = {}  # the store reads into host memory and copies it over itself
        into = {name: torch.empty_strided(*layout[name][:2], dtype=layout[name][2],
                                          device=self.runner.device)
                for name in names if name in layout}
        future = self.pool.submit(_read, store, ins.node, names, into, *self._ordered())
        self.arriving[ins.node] = Pending(future, where, (key,))

    def read_home(self, ins: Instruction, where: tuple[int, int, Instruction]) -> None:
        """A param node's group read from its parameters' home on the IO thread: what
        computing the node does, counted from the issue on as the plan counts it."""
        node = self.graph.node(ins.node)
        outputs = node.attrs["outputs"]
        key = ("reading home", outputs[0] if outputs else ins.node, self._next())
        self.ledger.register(key, node.out_bytes)
        future = self.pool.submit(_load, self.runner.load_parameters,
                                  dict(zip(outputs, node.attrs["params"])), *self._ordered())
        self.arriving[ins.node] = Pending(future, where, (key,), home=True)

    def arrive(self, node_id: Any) -> None:
        pending = self.arriving.pop(node_id)
        start = time.perf_counter()
        values, elapsed = _result(pending)
        self.counts.io_wait_s += time.perf_counter() - start
        self._forget(pending)
        if self.copies is not None:  # a tensor the IO thread allocated is used on compute's
            compute = torch.cuda.current_stream(self.copies.device)
            for value in values.values():
                value.record_stream(compute)
        if pending.home:
            self.runner.place_parameters(node_id, values)
            self.counts.computes += 1
            self.counts.recomputed += self.runner.runs[node_id] > 1
            self.counts.home_read_s += elapsed
            return
        self.runner.restore_outputs(node_id, values)
        self.counts.page_ins += 1
        self.counts.paged_bytes += sum(v.untyped_storage().nbytes() for v in values.values())
        self.counts.page_in_s += elapsed

    def page_out(self, ins: Instruction, where: tuple[int, int, Instruction]) -> None:
        values = self.runner.outputs(ins.node)
        for name, value in values.items():
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"its output {name} is a {type(value).__name__}, not a tensor: "
                                "it cannot be paged")
        nbytes = sum(v.untyped_storage().nbytes() for v in values.values())
        held = self.on_tier.setdefault(ins.tier, set())
        write = ins.node not in held  # values are immutable within a step: a page stays valid
        if write:
            # Held by the write until it completes: registered by storage (before the free),
            # so a storage another live value shares is not counted twice.
            keys = [("paging out", ins.node, self._next()) for _ in values]
            for key, value in zip(keys, values.values()):
                self.ledger.register_tensor(key, value)
            future = self.pool.submit(_write, self.stores[ins.tier],
                                      [((ins.node, n), v) for n, v in values.items()],
                                      *self._ordered())
            self.writes.append(Pending(future, where, tuple(keys),
                                       self.graph.node(ins.node).out_bytes,
                                       tuple(values.values())))
            self.in_flight += self.writes[-1].plan_bytes
            held.add(ins.node)
        # What the read allocates: each value's elements (the page codec's payload).
        self.page_bytes[ins.node] = sum(v.numel() * v.element_size() for v in values.values())
        self.layouts[ins.node] = {name: (tuple(v.shape), v.stride(), v.dtype)
                                  for name, v in values.items() if _dense(v)}
        self.runner.free(ins.node)
        self.counts.page_outs += 1
        self.counts.paged_bytes += nbytes

    # -- the step's end -------------------------------------------------------------------

    def drain(self) -> None:
        """Every read and write completed (the step ends when its IO does)."""
        for node_id in list(self.arriving):
            self.arrive(node_id)
        while self.writes:
            start = time.perf_counter()
            pending = self.writes.popleft()
            _result(pending)
            self._finish_write(pending, waited=time.perf_counter() - start)

    def close(self) -> None:
        """Wait for whatever is still queued (after a failure: errors ignored), free what it
        held, and stop the thread."""
        for pending in [*self.arriving.values(), *self.writes]:
            try:
                pending.future.result()
            except BaseException:  # noqa: BLE001 - the first failure is already being raised
                pass
            self._forget(pending)
        self.arriving.clear()
        self.writes.clear()
        self.in_flight = 0
        self.pool.shutdown(wait=True)

    def _finish_write(self, pending: Pending, waited: float) -> None:
        count, elapsed = _result(pending)
        self.in_flight -= pending.plan_bytes
        self._forget(pending)
        self.counts.pages_written += count
        self.counts.page_out_s += elapsed
        self.counts.io_wait_s += waited

    def _forget(self, pending: Pending) -> None:
        for key in pending.ledger_keys:
            self.ledger.unregister(key)
        pending.ledger_keys = pending.holds = ()

    def _ordered(self) -> tuple:
        """(the copy stream, the compute stream's event here) for an IO task, or () on the
        CPU."""
        return () if self.copies is None else (self.copies, self.copies.issue())

    def _next(self) -> int:
        self._serial += 1
        return self._serial


def _result(pending: Pending):
    try:
        return pending.future.result()
    except Exception as error:  # noqa: BLE001 - reported against the instruction that issued it
        raise IoFailed(pending.where, error) from error


# -- on the IO thread: store calls only ----------------------------------------------------------

def _read(store: PageStore, node_id: Any, names: list[str], into: dict[str, torch.Tensor],
          copies: CopyStream | None = None, issued: Any = None) -> tuple[dict, float]:
    """The node's pages, read at once (flash: one file), each into its tensor in `into` where
    the layout matches (else the store allocates one here)."""
    if copies is not None:
        with copies.after(issued):
            return _read(store, node_id, names, into)
    start = time.perf_counter()
    targets = {(node_id, name): tensor for name, tensor in into.items()}

    def place(nbytes, dtype, shape, stride, key):
        target = targets.get(key)
        if target is not None and (target.dtype, tuple(target.shape), target.stride()) \
                == (dtype, tuple(shape), tuple(stride)):
            return target
        return None
    with reading_into(place):
        values = dict(zip(names, store.get_many([(node_id, name) for name in names])))
    return values, time.perf_counter() - start


def _load(load, names: dict[str, str], copies: CopyStream | None = None,
          issued: Any = None) -> tuple[dict, float]:
    """A param node's group: each output (placeholder) loaded by its parameter's name, the
    group at once (`load` takes the names)."""
    if copies is not None:
        with copies.after(issued):
            return _load(load, names)
    start = time.perf_counter()
    values = dict(zip(names, load(list(names.values()))))
    return values, time.perf_counter() - start


def _dense(value: torch.Tensor) -> bool:
    """Laid out as the stores keep it as it is (else they keep a contiguous copy)."""
    return (value.layout == torch.strided and value.numel() > 0
            and is_dense(tuple(value.shape), value.stride()))


def _write(store: PageStore, items: list[tuple[tuple, torch.Tensor]],
           copies: CopyStream | None = None, issued: Any = None) -> tuple[int, float]:
    if copies is not None:
        with copies.after(issued):
            return _write(store, items)
    start = time.perf_counter()
    store.put_many(items)  # the node's outputs at once (flash: one file)
    return len(items), time.perf_counter() - start
