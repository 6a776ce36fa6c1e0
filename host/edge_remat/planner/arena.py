"""Address planning: one offset in one arena for every tensor a plan holds (dynamic storage
allocation over the schedule's lifetimes, edge_remat_agent/lifetimes.py).

- `best_fit`: blocks largest first, each into the smallest gap among the blocks live with it
  that holds it (else on top); also tried in order of opening; the smaller arena wins.
  Milliseconds for hundreds of blocks: run for every plan.
- `cpsat_layout`: the exact problem in CP-SAT (a NoOverlap2D over lifetime x address
  intervals, the arena's size minimized), started from the best fit and bounded below by the
  peak load, so its status says whether the layout is optimal.

The arena's size against the plan's tensor peak (its peak minus fixed memory) is the layout's
fragmentation: 1.00 means none.
"""

from __future__ import annotations

import time
from typing import Any

from edge_remat_agent.costs import CostModel
from edge_remat_agent.formats import Graph, Plan
from edge_remat_agent.formats.arena import ArenaLayout, Slot
from edge_remat_agent.lifetimes import ALIGNMENT, Block, check_layout, peak_load, \
    schedule_blocks

from ..errors import import_extension

ARENA_METHODS = ("none", "best-fit", "cpsat")


def best_fit(blocks: list[Block], alignment: int = ALIGNMENT) -> list[int]:
    """Offsets (multiples of `alignment`) with no two live blocks sharing a byte."""
    by_size = sorted(range(len(blocks)), key=lambda k: (-blocks[k].nbytes,
                                                        blocks[k].start - blocks[k].end, k))
    by_start = sorted(range(len(blocks)), key=lambda k: (blocks[k].start, -blocks[k].nbytes))
    tries = [_place(blocks, order, alignment) for order in (by_size, by_start)]
    return min(tries, key=lambda offsets: _size(blocks, offsets))


def _place(blocks: list[Block], order: list[int], alignment: int) -> list[int]:
    offsets = [0] * len(blocks)
    placed: list[int] = []
    for k in order:
        b = blocks[k]
        taken = sorted((offsets[j], offsets[j] + blocks[j].nbytes) for j in placed
                       if blocks[j].overlaps_in_time(b))
        best, best_gap, cursor = None, None, 0
        for lo, hi in taken:
            gap = lo - cursor
            if gap >= b.nbytes and (best_gap is None or gap < best_gap):
                best, best_gap = cursor, gap
            cursor = max(cursor, -(-hi // alignment) * alignment)
        offsets[k] = cursor if best is None else best
        placed.append(k)
    return offsets


def _size(blocks: list[Block], offsets: list[int]) -> int:
    return max((o + b.nbytes for o, b in zip(offsets, blocks)), default=0)


def cpsat_layout(blocks: list[Block], hint: list[int], lower_bound: int, time_limit: float,
                 workers: int | None = None, alignment: int = ALIGNMENT) -> dict[str, Any]:
    """The smallest arena CP-SAT finds within `time_limit`, starting from `hint`. Returns
    offsets, status ("optimal" | "feasible") and the bound it proved."""
    cp_model = import_extension("ortools.sat.python.cp_model")

    from .cpsat import solve_interruptibly
    units = [-(-b.nbytes // alignment) for b in blocks]
    top = max(_size(blocks, hint) // alignment, 1)
    model = cp_model.CpModel()
    height = model.NewIntVar(-(-lower_bound // alignment), top, "arena")
    xs, times, spaces = [], [], []
    for k, (b, size) in enumerate(zip(blocks, units)):
        x = model.NewIntVar(0, top - size, f"x{k}")
        model.Add(x + size <= height)
        model.AddHint(x, hint[k] // alignment)
        xs.append(x)
        times.append(model.NewFixedSizeIntervalVar(b.start, b.end - b.start, f"t{k}"))
        spaces.append(model.NewFixedSizeIntervalVar(x, size, f"a{k}"))
    model.AddNoOverlap2D(times, spaces)
    model.Minimize(height)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.05, time_limit)
    if workers:
        solver.parameters.num_workers = workers
    code = solve_interruptibly(solver, model, None)
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return {"offsets": hint, "status": "hint", "bound_bytes": lower_bound}
    return {"offsets": [solver.Value(x) * alignment for x in xs],
            "status": "optimal" if code == cp_model.OPTIMAL else "feasible",
            "bound_bytes": max(lower_bound, int(solver.BestObjectiveBound()) * alignment)}


def plan_arena(graph: Graph, plan: Plan, costs: CostModel | None = None, method: str = "best-fit",
               time_limit: float = 10.0, workers: int | None = None) -> ArenaLayout | None:
    """The plan's arena layout (checked against its schedule), or None for method "none"."""
    if method not in ARENA_METHODS:
        raise ValueError(f"unknown arena method {method!r} (use {', '.join(ARENA_METHODS)})")
    if method == "none":
        return None
    started = time.perf_counter()
    workspace = costs.workspace(graph) if costs is not None else None
    blocks = schedule_blocks(graph, plan.stages, workspace)
    load = peak_load(blocks)
    offsets = best_fit(blocks)
    details: dict[str, Any] = {"best_fit_bytes": _size(blocks, offsets)}
    status = "optimal" if _size(blocks, offsets) <= load else "feasible"
    if method == "cpsat" and status != "optimal" and blocks:
        from . import isolated
        result = isolated.call("ortools", cpsat_layout, blocks, offsets, load, time_limit,
                               workers)
        if _size(blocks, result["offsets"]) <= _size(blocks, offsets):
            offsets = result["offsets"]
        status = "optimal" if _size(blocks, offsets) <= result["bound_bytes"] else "feasible"
        load = max(load, result["bound_bytes"])
    size = _size(blocks, offsets)
    tensor_peak = plan.predicted.get("peak_bytes", 0) - fixed_bytes(graph, plan)
    details.update({
        "status": status, "lower_bound_bytes": load,
        "planned_tensor_peak_bytes": tensor_peak,
        "over_tensor_peak": round(size / tensor_peak, 4) if tensor_peak > 0 else None,
        "blocks": len(blocks), "plan_time_s": round(time.perf_counter() - started, 4)})
    layout = ArenaLayout(size_bytes=size, slots=_slots(blocks, offsets), alignment=ALIGNMENT,
                         method=method, details=details)
    check_layout(graph, plan.stages, layout)  # a layout that does not check is a bug
    return layout


def fixed_bytes(graph: Graph, plan: Plan) -> int:
    """The plan's memory outside the arena (the ops' first calls' included)."""
    return plan.problem.get("fixed_bytes", graph.fixed_bytes)


def _slots(blocks: list[Block], offsets: list[int]) -> list[Slot]:
    by_instruction: dict[int, dict[str, tuple[int, int]]] = {}
    for b, offset in zip(blocks, offsets):
        by_instruction.setdefault(b.instruction, {})[b.kind] = (offset, b.nbytes)
    slots = []
    for t in sorted(by_instruction):
        out = by_instruction[t].get("output", (None, 0))
        work = by_instruction[t].get("workspace", (None, 0))
        slots.append(Slot(t, out[0], out[1], work[0], work[1]))
    return slots
