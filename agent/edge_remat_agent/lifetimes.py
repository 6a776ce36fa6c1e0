"""Tensor lifetimes of a schedule, and the check that an arena layout respects them.

The simulator's memory model (simulate.py), read as blocks over time: the time axis is the flat
index of the plan's instructions. A `compute` at index t opens its node's output block
[t, end) and a workspace block [t, t + 1); a `page_in` opens an output block; `free` or
`page_out` at index e ends the open block at e; whatever is open at the end of the step ends
there. Each opening is its own block (a recomputed node gets a new one), so a layout gives
every opening its own offset in one arena. Address planning (host planner/arena.py) lays these
blocks out; the arena executor (executor/arena.py) places tensors where the layout says.

An output block holds all the node's output storages, each starting on an ALIGNMENT boundary:
its size is `slot_bytes(node)`, an upper bound that holds whatever storages the node's outputs
turn out to have (at most one each).
"""

from __future__ import annotations

from dataclasses import dataclass

from .formats import Graph, Node, Stages

ALIGNMENT = 64  # bytes: what ATen's CPU allocator aligns to, so kernels see the same alignment


def align(nbytes: int, alignment: int = ALIGNMENT) -> int:
    return -(-int(nbytes) // alignment) * alignment


def slot_bytes(node: Node, alignment: int = ALIGNMENT) -> int:
    """Room for a node's output storages laid out one after another, each aligned."""
    if node.out_bytes <= 0:
        return 0
    outputs = len(node.attrs.get("outputs", ())) or 1
    return align(node.out_bytes, alignment) + alignment * (outputs - 1)


@dataclass(frozen=True)
class Block:
    instruction: int  # flat index of the compute / page_in that opens it
    node_index: int  # the node's position in the graph
    kind: str  # "output" | "workspace"
    start: int  # first instruction index it occupies
    end: int  # first instruction index it no longer occupies
    nbytes: int

    def overlaps_in_time(self, other: "Block") -> bool:
        return self.start < other.end and other.start < self.end


def schedule_blocks(graph: Graph, stages: Stages, workspace: list[int] | None = None,
                    alignment: int = ALIGNMENT) -> list[Block]:
    """Every block of one step of `stages` (assumed valid: the simulator checks that), in order
    of opening. `workspace`: each node's workspace bytes (default the graph's)."""
    if workspace is None:
        workspace = [n.workspace_bytes for n in graph.nodes]
    sizes = [slot_bytes(n, alignment) for n in graph.nodes]
    opened: dict[int, tuple[int, int]] = {}  # node index -> (opening instruction, its start)
    blocks: list[Block] = []
    t = -1
    for stage in stages:
        for ins in stage:
            t += 1
            i = graph.index[ins.node]
            if ins.op in ("compute", "page_in"):
                opened[i] = (t, t)
                if ins.op == "compute" and workspace[i] > 0:
                    blocks.append(Block(t, i, "workspace", t, t + 1,
                                        align(workspace[i], alignment)))
            elif ins.op in ("free", "page_out") and i in opened:
                at, start = opened.pop(i)
                if sizes[i]:
                    blocks.append(Block(at, i, "output", start, t, sizes[i]))
    end = t + 1
    for i, (at, start) in opened.items():
        if sizes[i]:
            blocks.append(Block(at, i, "output", start, end, sizes[i]))
    blocks.sort(key=lambda b: (b.instruction, b.kind != "output"))
    return blocks


def live_load(blocks: list[Block]) -> list[int]:
    """Bytes of the blocks live at each instruction, 0 up to the last block's end."""
    change = [0] * (max((b.end for b in blocks), default=-1) + 1)
    for b in blocks:
        change[b.start] += b.nbytes
        change[b.end] -= b.nbytes
    live, running = [], 0
    for delta in change:
        running += delta
        live.append(running)
    return live


def peak_load(blocks: list[Block]) -> int:
    """The most bytes live at one instruction: no layout can be smaller (1.00 = no
    fragmentation)."""
    return max(live_load(blocks), default=0)


def overlapping_pairs(blocks: list[Block], offsets: list[int]):
    """Pairs (a, b) of block positions live at once whose address ranges overlap (a sweep over
    time: only blocks live together are compared)."""
    order = sorted(range(len(blocks)), key=lambda k: blocks[k].start)
    live: list[int] = []
    for k in order:
        b = blocks[k]
        live = [j for j in live if blocks[j].end > b.start]
        for j in live:
            if offsets[j] < offsets[k] + b.nbytes and offsets[k] < offsets[j] + blocks[j].nbytes:
                yield j, k
        live.append(k)


class LayoutError(ValueError):
    """An arena layout that does not hold the schedule's tensors apart."""


def layout_offsets(blocks: list[Block], layout) -> list[int]:
    """Each block's offset in `layout` (formats/arena.ArenaLayout); LayoutError where a block
    has no slot or a slot is too small for it."""
    slots = layout.by_instruction()
    offsets = []
    for b in blocks:
        slot = slots.get(b.instruction)
        offset, nbytes = (None, 0) if slot is None else \
            (slot.output_offset, slot.output_bytes) if b.kind == "output" else \
            (slot.workspace_offset, slot.workspace_bytes)
        if offset is None or nbytes < b.nbytes:
            raise LayoutError(f"instruction {b.instruction} needs a {b.kind} slot of {b.nbytes} "
                              f"bytes, the arena gives {nbytes}")
        offsets.append(offset)
    return offsets


def check_layout(graph: Graph, stages: Stages, layout) -> list[Block]:
    """The schedule's blocks, once checked against `layout`: every block has its slot, and no
    two blocks live at once share a byte. LayoutError otherwise."""
    # Output blocks follow from the schedule; workspace blocks are as the layout planned them
    # (the planner may have used a profile's workspace figures).
    blocks = [b for b in schedule_blocks(graph, stages, [0] * len(graph), layout.alignment)]
    node_at = {t: graph.index[ins.node] for t, ins in
               enumerate(ins for stage in stages for ins in stage)}
    for slot in layout.slots:
        if slot.workspace_bytes:
            if slot.instruction not in node_at:
                raise LayoutError(f"slot for instruction {slot.instruction}: the schedule has "
                                  f"{len(node_at)} instructions")
            blocks.append(Block(slot.instruction, node_at[slot.instruction], "workspace",
                                slot.instruction, slot.instruction + 1, slot.workspace_bytes))
    offsets = layout_offsets(blocks, layout)
    for j, k in overlapping_pairs(blocks, offsets):
        a, b = blocks[j], blocks[k]
        raise LayoutError(f"the {a.kind} of instruction {a.instruction} and the {b.kind} of "
                          f"instruction {b.instruction} are live together and overlap in the "
                          "arena")
    return blocks
