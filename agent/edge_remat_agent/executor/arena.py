"""The arena executor's memory: one block allocated once per run, every planned tensor in the
slot the plan's arena layout gives it (formats/arena.py, lifetimes.py).

At a `compute` or `page_in` at flat instruction index t, the node's output storages go into
slot t's output range, one after another, each aligned:
  - an op whose results are all the node's own outputs runs as its ATen `.out` variant, writing
    into views of the slot (`OutWriter`, compiled into the runner's node code where it can);
  - pages read from a store (page_in, parameters loaded from their home, optimizer state)
    are read straight into the slot (pages/codec.reading_into); state read by an update node
    goes to its workspace range;
  - any other output storage the node made (an op without an `.out` variant, a view of an
    intermediate) is copied into the slot afterwards, and counted (`copies`, `copied_bytes`),
    except where the arena gives its free pages back (CPU, arena_pages.py): there a copy
    would hold the tensor twice at once, while leaving it where ATen put it costs what the
    glibc executor pays and leaves its slot's pages untouched, uncharged (`kept_outside`).
    For the same reason ops whose `.out` variant is ATen's functional call plus a copy
    (`OUT_VARIANT_ALLOCATES`, measured in tests/test_arena_executor.py) run as traced there.
What the ops allocate inside a node (intermediates, kernel scratch) still comes from the CPU
allocator: the plan counts it as the node's workspace.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable

import torch

from ..allocator import heap_trimmer
from ..formats import Graph, Plan
from ..formats.arena import ArenaLayout, Slot
from ..lifetimes import LayoutError, check_layout, layout_offsets, live_load
from ..profiler.memory import span_bytes
from .arena_pages import PageRelease, Range, resident_reader


# Free arena pages and the heap's free pages are given back before a node only when they would
# take the process past the plan's peak by more than this fraction of the planned peak (see
# Arena.open): mobilenet_v2 b8 (benchmarks/arena.py figures, docs/memory.md).
TRIM_HEAP_SLACK = 0.04


@dataclass
class ArenaCounts:
    """What one step did in the arena."""

    out_writes: int = 0  # op results written in place by an .out variant
    out_bytes: int = 0
    page_reads: int = 0  # pages read straight into a slot
    page_read_bytes: int = 0
    copies: int = 0  # storages copied into a slot after the op made them elsewhere
    copied_bytes: int = 0
    outside: int = 0  # storages that did not fit their slot and stayed where ATen put them
    outside_bytes: int = 0
    kept_outside: int = 0  # storages left where ATen put them rather than copied (see above)
    kept_outside_bytes: int = 0
    released: int = 0  # arena ranges whose pages were given back (arena_pages.py)
    released_bytes: int = 0
    heap_trims: int = 0  # the CPU allocator's free heap pages given back (see Arena.open)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Cursor:
    """The next free aligned byte of one slot range."""

    def __init__(self, offset: int | None, nbytes: int, alignment: int):
        self.next, self.end, self.alignment = offset or 0, (offset or 0) + nbytes, alignment

    def take(self, nbytes: int) -> int | None:
        if self.next + nbytes > self.end:
            return None
        at = self.next
        self.next = -(-(at + nbytes) // self.alignment) * self.alignment
        return at


class Arena:
    def __init__(self, layout: ArenaLayout, graph: Graph, plan: Plan,
                 device: torch.device | None = None, release_slack_bytes: int | None = 0,
                 trim_heap: float | None = TRIM_HEAP_SLACK):
        """`release_slack_bytes`: give back the pages of free arena ranges when the touched
        ones exceed the live ones by more than this (arena_pages.py); None: never.
        `trim_heap`: also give back the CPU allocator's free heap pages at each step's start,
        and give back both only before the nodes where the process's resident bytes would
        otherwise pass the plan's peak by more than this fraction of it (CPU only; see
        open()); None: the heap never, the arena's pages at every node."""
        try:
            blocks = check_layout(graph, plan.stages, layout)
        except LayoutError as error:
            raise ValueError(f"the plan's arena layout does not fit its schedule: {error}. "
                             "Remedy: plan again (`edge-remat plan --arena best-fit`)") from error
        self.layout, self.graph = layout, graph
        self.slots = layout.by_instruction()
        self.device = device or torch.device("cpu")
        self.memory = torch.empty(max(layout.size_bytes, 1), dtype=torch.uint8,
                                  device=self.device)
        self.storage = self.memory.untyped_storage()
        self.base = self.memory.data_ptr()
        self.counts = ArenaCounts()
        self.pages = None
        if self.device.type == "cpu" and release_slack_bytes is not None:
            self.pages = PageRelease(self.base, self.nbytes,
                                     _held_ranges(graph, blocks, layout), release_slack_bytes)
        # Copy what ATen allocated into the slot only where the arena's pages are not given
        # back (CUDA, or no madvise): there the slot is paid for anyway.
        self.copies_in = self.pages is None or not self.pages.available
        # Pages are read on the CPU: into their slot there; on CUDA settle() copies them in.
        self.reads_pages_into_slots = self.device.type == "cpu"
        self._trim_heap = heap_trimmer() if trim_heap is not None and self.pages is not None \
            else None
        self._resident = resident_reader() if self._trim_heap is not None else None
        allowance = int((trim_heap or 0) * (plan.predicted or {}).get("peak_bytes", 0))
        self._trim_above = _trim_thresholds(blocks, allowance) if self._resident else []
        self._step_resident = 0  # the process's resident bytes at the step's start, trimmed
        self._output: _Cursor | None = None
        self._workspace: _Cursor | None = None
        self._instruction = -1
        self._output_start = 0

    @property
    def nbytes(self) -> int:
        return self.layout.size_bytes

    def holds(self, tensor: torch.Tensor) -> bool:
        ptr = tensor.untyped_storage().data_ptr()
        return tensor.device == self.device and self.base <= ptr < self.base + self.nbytes

    def start_step(self) -> None:
        self.counts = ArenaCounts()
        if self.pages is not None:
            self.pages.start_step()
        if self._resident is not None:  # the step starts from the fewest pages it can
            self._give_back(0, trim=True)
            self._step_resident = self._resident()

    # -- one instruction ---------------------------------------------------------------------

    def open(self, instruction: int) -> None:
        """Slot `instruction` is where what comes next goes."""
        slot = self.slots.get(instruction) or Slot(instruction, None, 0, None, 0)
        self._instruction, self._output_start = instruction, slot.output_offset or 0
        self._output = _Cursor(slot.output_offset, slot.output_bytes, self.layout.alignment)
        self._workspace = _Cursor(slot.workspace_offset, slot.workspace_bytes,
                                  self.layout.alignment)
        if self._resident is None:
            if self.pages is not None:
                self._give_back(instruction, trim=False)
        elif self._over(instruction):
            # Pages given back fault in again at their next write, and a trim walks the whole
            # heap: mobilenet_v2 b8 at its floor, giving back at every node, faulted 13,000
            # pages a step and took 2x the glibc executor's CPU time. So both are done only
            # where the resident bytes (one read of /proc/self/statm) and what this
            # instruction brings would pass the plan's peak.
            self._give_back(instruction, trim=None)

    def _over(self, instruction: int) -> bool:
        """Whether the resident bytes and what `instruction` brings pass the plan's peak."""
        return instruction < len(self._trim_above) and \
            self._resident() - self._step_resident > self._trim_above[instruction]

    def _give_back(self, instruction: int, trim: bool | None) -> None:
        """Release the touched arena pages no block live at `instruction` holds, then the
        heap's free pages (`trim` None: if still over the plan's peak). What ATen allocates
        outside the arena (a node's intermediates, results it keeps) is mostly below the mmap
        threshold, so it comes from glibc's heap, whose freed chunks stay resident: one bert-mini step left
        20-30 MiB of them charged beside the plan's tensors (mallinfo2 at every
        instruction), mobilenet_v2 at its floor 5-7 MiB where the plan was far from its
        peak, enough to set the step's peak there."""
        if self.pages is not None:
            self.pages.before(instruction)
            self.counts.released = self.pages.releases
            self.counts.released_bytes = self.pages.released_bytes
        if self._trim_heap is not None and (trim or trim is None and self._over(instruction)):
            self._trim_heap()
            self.counts.heap_trims += 1

    def _take(self, cursor: _Cursor | None, nbytes: int) -> int | None:
        """An offset for `nbytes` from one of the slot's ranges, its pages counted as touched."""
        offset = cursor.take(nbytes) if cursor is not None else None
        if offset is not None and self.pages is not None:
            self.pages.touched(offset, offset + nbytes)
        return offset

    def close(self) -> None:
        if self.pages is not None and self._output is not None:
            # What the node left outside holds nothing in its slot's unused tail.
            self.pages.used(self._instruction, self._output_start, self._output.next)
        self._output = self._workspace = None

    def tensor_at(self, offset: int, dtype: torch.dtype, shape, stride) -> torch.Tensor:
        return torch.empty(0, dtype=dtype, device=self.device).set_(
            self.storage, offset // dtype.itemsize, tuple(shape), tuple(stride))

    def page_slot(self, nbytes: int, dtype: torch.dtype, shape, stride,
                  key=None) -> torch.Tensor | None:
        """Where a page being read goes (pages/codec.reading_into): the output range, else
        the workspace range (an update's optimizer state), else None (ATen allocates)."""
        if self._output is None or not self.reads_pages_into_slots:
            return None
        offset = self._take(self._output, nbytes)
        if offset is None:
            offset = self._take(self._workspace, nbytes)
        if offset is None:
            return None
        self.counts.page_reads += 1
        self.counts.page_read_bytes += nbytes
        return self.tensor_at(offset, dtype, shape, stride)

    def out_buffers(self, results: list) -> list[torch.Tensor] | None:
        """Buffers for an op's results, each (dtype, shape, stride, bytes in the slot) or None
        (a result the op will not make: convolution_backward's mask): views of the output
        range for the node's own outputs, fresh tensors for the rest (bytes None: the op's
        scratch); None where the range has no room (let the op allocate)."""
        output = self._output
        if output is None:
            return None
        saved = output.next
        buffers = []
        for result in results:
            if result is None:
                buffers.append(torch.empty(0, device=self.device))
                continue
            dtype, shape, stride, nbytes = result
            if nbytes is None:
                buffers.append(torch.empty_strided(shape, stride, dtype=dtype,
                                                   device=self.device))
                continue
            offset = self._take(output, nbytes)
            if offset is None:
                output.next = saved
                return None
            buffers.append(self.tensor_at(offset, dtype, shape, stride))
        return buffers

    def settle(self, values: dict[str, Any], made: set[int]) -> dict[str, Any]:
        """The node's output values, with every storage it made that is not in the arena
        copied into the output range (views re-made on the copy). `made`: the storages the
        node made (the ledger's, see LiveTensorLedger.storages_made); the others (views of its
        inputs, of parameters) stay where they are."""
        moved: dict[int, torch.Tensor] = {}
        out = {}
        for name, value in values.items():
            if not isinstance(value, torch.Tensor) or self.holds(value):
                out[name] = value
                continue
            storage = value.untyped_storage()
            ptr = storage.data_ptr()
            if ptr not in made or storage.nbytes() == 0:
                out[name] = value
                continue
            if ptr not in moved and not self.copies_in:
                self.counts.kept_outside += 1
                self.counts.kept_outside_bytes += storage.nbytes()
                out[name] = value
                made.discard(ptr)
                continue
            if ptr not in moved:
                offset = self._take(self._output, storage.nbytes())
                if offset is None:
                    self.counts.outside += 1
                    self.counts.outside_bytes += storage.nbytes()
                    out[name] = value
                    made.discard(ptr)
                    continue
                target = self.memory[offset:offset + storage.nbytes()]
                target.copy_(torch.empty(0, dtype=torch.uint8, device=value.device).set_(
                    storage, 0, (storage.nbytes(),), (1,)))
                moved[ptr] = target
                self.counts.copies += 1
                self.counts.copied_bytes += storage.nbytes()
            base = moved[ptr]
            out[name] = torch.empty(0, dtype=value.dtype, device=self.device).set_(
                base.untyped_storage(),
                base.storage_offset() // value.element_size() + value.storage_offset(),
                value.shape, value.stride())
        return out


def _trim_thresholds(blocks, allowance: int) -> list[int]:
    """For each instruction t, the resident bytes above the step's start past which pages are
    given back before t: the blocks' peak load (plus `allowance` bytes) less what t opens
    (its outputs and workspace), so that what is resident and what t brings stay within the
    plan's peak."""
    live = live_load(blocks)
    peak = max(live, default=0)
    opening = [0] * len(live)
    for block in blocks:
        opening[block.start] += block.nbytes
    return [peak + allowance - nbytes for nbytes in opening]


def _held_ranges(graph: Graph, blocks, layout: ArenaLayout) -> list[Range]:
    """The layout's blocks that hold bytes in the arena while live: every output block, and
    the workspace of update nodes (optimizer state read into it); other nodes' workspace is
    taken from the CPU allocator by ATen, so its arena range holds nothing."""
    ranges = []
    for block, offset in zip(blocks, layout_offsets(blocks, layout)):
        if block.kind == "output" or graph.nodes[block.node_index].kind == "update":
            ranges.append(Range(block.start, block.end, offset, offset + block.nbytes,
                                block.kind))
    return ranges


def _out_variant(target) -> tuple | None:
    packet = getattr(target, "overloadpacket", None)
    schema = getattr(target, "_schema", None)
    if packet is None or schema is None:
        return None
    wanted = [a.name for a in schema.arguments]
    for overload in packet.overloads():
        candidate = getattr(packet, overload)
        arguments = candidate._schema.arguments
        outs = [a.name for a in arguments if a.is_out]
        if outs and [a.name for a in arguments if not a.is_out] == wanted:
            return candidate, outs
    return None


class OutWriter:
    """Runs ops as their `.out` variant into the arena where the arena has room for their
    results. What can be decided before a run is decided once per op (`for_op`, called when
    the runner compiles a node, capture/straight_line.py): the ops that never can are run as
    traced, with no call here at all."""

    def __init__(self, arena: Arena, writable: dict[str, list[bool]]):
        """`writable`: op name -> for each of its results, whether it is one of its node's own
        outputs (it goes into the node's slot; the others are the op's scratch)."""
        self.arena, self.writable = arena, writable
        self._variants: dict[Any, tuple | None] = {}
        self._refused: set = set()  # targets whose out variant raised: run as traced since

    def variant(self, target) -> tuple | None:
        """(the out overload that takes exactly `target`'s arguments, names of its out
        arguments), or None where there is none."""
        if target not in self._variants:
            self._variants[target] = _out_variant(target)
        return self._variants[target]

    def for_op(self, op) -> Callable[[list, dict], Any] | None:
        """A call (args, kwargs) that runs `op` into the arena and returns its result, or None
        where it cannot now (no room, arguments an out variant does not take: run the op as
        traced); None where it never can."""
        placed = self.writable.get(op.name)
        meta = op.meta.get("val")
        metas = list(meta) if isinstance(meta, (tuple, list)) else [meta]
        if placed is None or not metas or metas[0] is None or not all(
                m is None or isinstance(m, torch.Tensor) and m.storage_offset() == 0
                for m in metas):
            return None
        target = op.target
        if not self.arena.copies_in and target in OUT_VARIANT_ALLOCATES:
            return None  # its result would be held twice: let it stay where ATen puts it
        special = _FUNCTIONAL_AS_OUT.get(target)
        found = special or self.variant(target)
        if found is None or (special is None and len(found[1]) != len(metas)):
            return None
        if special is not None:
            run_into = special[2]
        else:
            variant, names = found
            overload = getattr(variant, "_op", variant)  # its C++ entry point

            def run_into(args, kwargs, buffers):
                return overload(*args, **kwargs, **dict(zip(names, buffers)))
        results = [None if m is None else
                   (m.dtype, tuple(m.shape), tuple(m.stride()), span_bytes(m) if in_slot
                    else None) for m, in_slot in zip(metas, placed)]
        in_slot = [m for m, p in zip(metas, placed) if m is not None and p]
        written, written_bytes = len(in_slot), sum(m.numel() * m.element_size() for m in in_slot)
        several = isinstance(meta, (tuple, list))
        arena, refused = self.arena, self._refused

        def write(args, kwargs):
            output = arena._output
            if output is None or target in refused:
                return None
            saved = output.next
            buffers = arena.out_buffers(results)
            if buffers is None:
                return None
            try:
                result = run_into(args, kwargs, buffers)
            except (RuntimeError, TypeError):  # an out variant these arguments do not fit
                refused.add(target)
                result = None
            if result is None:  # not for these arguments: its buffers are free again
                output.next = saved
                return None
            counts = arena.counts
            counts.out_writes += written
            counts.out_bytes += written_bytes
            if several:  # results the op does not make stay None
                return tuple(None if m is None else r for m, r in zip(metas, result))
            return result
        return write


def _batch_norm_functional_into(args, kwargs, buffers):
    """aten._native_batch_norm_legit_functional (functionalization's batch norm, which has
    no out variant) as the in-place op's out variant on the new running statistics'
    buffers, filled with the old ones first:
    the same kernel, the same results."""
    op = torch.ops.aten._native_batch_norm_legit
    bound = op.default._schema.arguments
    values = dict(zip([a.name for a in bound], args))
    values.update(kwargs)
    buffers[3].copy_(values["running_mean"])
    buffers[4].copy_(values["running_var"])
    out, mean, invstd = op.out(values["input"], values["weight"], values["bias"], buffers[3],
                               buffers[4], values["training"], values["momentum"], values["eps"],
                               out=buffers[0], save_mean=buffers[1], save_invstd=buffers[2])
    return out, mean, invstd, buffers[3], buffers[4]


def _convolution_backward_into(args, kwargs, buffers):
    """aten.convolution_backward.out where the bias gradient is not asked for (a convolution
    without bias): the out variant refuses any tensor for a result it does not make, so the
    bias gradient (out_channels values) is computed too, into scratch, and dropped. The input
    and weight gradients are bitwise those of the traced call (tests/test_arena_executor.py).
    None where the input gradient is not asked for either (the first layer: computing it would
    cost a whole convolution)."""
    op = torch.ops.aten.convolution_backward
    values = dict(zip([a.name for a in op.default._schema.arguments], args))
    values.update(kwargs)
    mask = list(values.pop("output_mask"))
    if not (mask[0] and mask[1]):
        return None
    if not mask[2]:
        buffers = [buffers[0], buffers[1],
                   torch.empty(values["weight"].shape[0], dtype=values["grad_output"].dtype,
                               device=values["grad_output"].device)]
    grad_input, grad_weight, grad_bias = op.out(**values, output_mask=[True, True, True],
                                                out0=buffers[0], out1=buffers[1],
                                                out2=buffers[2])
    return grad_input, grad_weight, grad_bias if mask[2] else None


# Ops whose `.out` variant ATen generates as the functional call and a copy into `out` (the
# CPU allocator hands out its whole result first): measured with profiler.AllocatorPeak, torch
# 2.x CPU; tests/test_arena_executor.py checks each one still does.
OUT_VARIANT_ALLOCATES = frozenset(getattr(torch.ops.aten, name).default for name in (
    "convolution", "convolution_backward", "native_batch_norm_backward", "relu", "clone",
    "embedding_dense_backward", "native_layer_norm", "native_layer_norm_backward"))

# Functional ops without an out variant, run through an equivalent one: (_, _, function).
_FUNCTIONAL_AS_OUT = {
    torch.ops.aten._native_batch_norm_legit_functional.default:
        (None, None, _batch_norm_functional_into),
    torch.ops.aten.convolution_backward.default: (None, None, _convolution_backward_into),
}


def _writable(node, runner) -> dict[str, list[bool]]:
    """The node's ops with a result among its own outputs: for each result, whether it is one
    (it goes into the slot; the others are the op's scratch)."""
    outputs = set(node.attrs.get("outputs", ())) - runner.fixed_values()
    found = {}
    for name in node.attrs.get("members", ()):
        op = runner.trace.node(name)
        meta = op.meta.get("val")
        if isinstance(meta, (tuple, list)):
            placed = [False] * len(meta)
            for user in op.users:
                if user.name in outputs and isinstance(user.args[1], int):
                    placed[user.args[1]] = True
            if any(placed):
                found[name] = placed
        elif name in outputs:
            found[name] = [True]
    return found


class ArenaPlacement:
    """The interpreter's hooks: open instruction t's slot before it runs (pages and .out
    results land there), settle the node's outputs into it after."""

    def __init__(self, arena: Arena, runner, graph: Graph):
        from ..pages.codec import reading_into
        self.arena, self.runner, self.graph = arena, runner, graph
        self.writer = OutWriter(arena, {name: placed for node in graph.nodes
                                        for name, placed in _writable(node, runner).items()})
        self._reading_into = reading_into
        self._reading = None
        runner.writer = self.writer
        # A slot's tensor counts its own bytes, not the whole arena its storage is.
        runner.ledger.split_storage(arena.base)

    def _keep_gradients(self, node) -> None:
        """What the runner keeps to the step's end (gradients for the check, new batch-norm
        statistics, the loss) must outlive its slot, which later tensors reuse: what is in
        the arena is copied out (fixed memory in the plan; gradients only on a checked step,
        which holds a plain step's gradients anyway). Only what `node` keeps is looked at:
        the runner takes each from the node that names it (walking all the step keeps, at
        every node, cost mobilenet_v2 a few milliseconds a step)."""
        runner, holds = self.runner, self.arena.holds
        for kept, names in ((runner.grads, node.attrs.get("grads")),
                            (runner.buffer_updates, node.attrs.get("buffer_updates"))):
            for name in (names or {}).values():
                value = kept.get(name)
                if value is not None and holds(value):
                    kept[name] = value.clone()
        if self.runner.loss is not None and self.arena.holds(self.runner.loss):
            self.runner.loss = self.runner.loss.clone()

    def before(self, t: int, ins) -> None:
        if ins.op in ("compute", "page_in"):
            self.arena.open(t)
            self.runner.ledger.storages_made()  # from here: what the node makes
            self._reading = self._reading_into(self.arena.page_slot)
            self._reading.__enter__()

    def after(self, ins, failed: bool = False) -> None:
        if ins.op not in ("compute", "page_in"):
            return
        self._reading.__exit__(None, None, None)
        self._reading = None
        try:
            node = self.graph.node(ins.node)
            if not failed and node.kind != "update":
                outputs = self.runner.outputs(ins.node)
                fixed = self.runner.fixed_values()
                own = {k: v for k, v in outputs.items() if k not in fixed}
                made = self.runner.ledger.storages_made()
                for name, value in self.arena.settle(own, made).items():
                    if value is not outputs[name]:
                        self.runner.rebind(name, value)
            self._keep_gradients(node)
        finally:
            self.arena.close()
