"""The plan's optional arena layout: where each planned tensor lives in one block of memory.

In a plan file, `"arena"` (its own version, independent of the plan's):
  {"version": 1, "alignment": 64, "size_bytes": N, "method": "best-fit" | "cpsat",
   "slots": [[instruction, output_offset, output_bytes, workspace_offset, workspace_bytes], ...],
   "details": {...}}
one slot per `compute` / `page_in` instruction that opens bytes (`instruction` is its flat
index in the schedule; an offset is null where its bytes are 0). `details` holds the figures
of the layout (lower bound, the plan's tensor peak, solver status) for reports. Which
instruction ends a slot's lifetime follows from the schedule (lifetimes.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .fields import Reader

ARENA_VERSIONS = (1,)
METHODS = ("best-fit", "cpsat")


@dataclass(frozen=True)
class Slot:
    instruction: int
    output_offset: int | None
    output_bytes: int
    workspace_offset: int | None
    workspace_bytes: int

    def to_list(self) -> list:
        return [self.instruction, self.output_offset, self.output_bytes, self.workspace_offset,
                self.workspace_bytes]


@dataclass
class ArenaLayout:
    size_bytes: int
    slots: list[Slot]
    alignment: int = 64
    method: str = "best-fit"
    details: dict[str, Any] = field(default_factory=dict)

    def by_instruction(self) -> dict[int, Slot]:
        return {slot.instruction: slot for slot in self.slots}

    def to_dict(self) -> dict[str, Any]:
        return {"version": 1, "alignment": self.alignment, "size_bytes": self.size_bytes,
                "method": self.method, "details": self.details,
                "slots": [slot.to_list() for slot in self.slots]}


def arena_from_dict(obj: Any, source: str, where: str = "arena") -> ArenaLayout:
    r = Reader(obj, source, where)
    version = r.integer("version")
    if version not in ARENA_VERSIONS:
        raise r.error("version", f"one of {list(ARENA_VERSIONS)} (this agent's arena "
                      "layouts; plan again with this version)", version)
    r.reject_unknown({"version", "alignment", "size_bytes", "method", "slots", "details"})
    alignment = r.integer("alignment", 64, minimum=1)
    if alignment & (alignment - 1):
        raise r.error("alignment", "a power of two", alignment)
    size = r.integer("size_bytes")
    slots = []
    seen: set[int] = set()
    for k, entry in enumerate(r.list("slots")):
        slot = _slot(entry, r, f"slots[{k}]", alignment, size)
        if slot.instruction in seen:
            raise r.error(f"slots[{k}]", "one slot per instruction", slot.instruction)
        seen.add(slot.instruction)
        slots.append(slot)
    return ArenaLayout(size_bytes=size, slots=slots, alignment=alignment,
                       method=r.str("method", "best-fit", METHODS),
                       details=r.object("details", None) or {})


def _slot(entry: Any, r: Reader, key: str, alignment: int, size: int) -> Slot:
    expected = ("[instruction, output_offset, output_bytes, workspace_offset, "
                "workspace_bytes] with non-negative integers (offsets null for 0 bytes), "
                f"offsets multiples of {alignment}, inside size_bytes")
    if not isinstance(entry, list) or len(entry) != 5:
        raise r.error(key, expected, entry)
    instruction, out_offset, out_bytes, ws_offset, ws_bytes = entry
    numbers = (instruction, out_bytes, ws_bytes)
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in numbers):
        raise r.error(key, expected, entry)
    for offset, nbytes in ((out_offset, out_bytes), (ws_offset, ws_bytes)):
        if offset is None and nbytes == 0:
            continue
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0 \
                or offset % alignment or offset + nbytes > size:
            raise r.error(key, expected, entry)
    return Slot(instruction, out_offset, out_bytes, ws_offset, ws_bytes)
