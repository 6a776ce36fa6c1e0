"""The exact simulator: replays a plan's instructions, checks them, and adds up what they cost.

Memory model (shared/DESIGN.md): a tensor occupies RAM from the instruction that produces it
(compute or page_in) until it is freed or paged out. While a node computes, RAM holds every resident
tensor, the node's output and its workspace (the cost model's: a profile's measured workspace
where it has one, else the graph's), plus fixed memory (the graph's, and what a profile says
the ops' first calls leave to the process: costs.runtime_warm_bytes). Paged-out copies stay on their tier
until the end of the step.

A `page_in` from "home" reads a param node's group from its parameters' home: it is that
node's compute (its time, energy and count; no workspace), issued as a read.

Paging time: `io="sync"` counts every page-in and page-out as stopping compute (time = compute
+ paging); `io="overlap"` runs them on an IO timeline beside compute (timeline.py: prefetch,
write-behind, the bytes in flight counted), and the step time is the makespan.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .costs import CostModel
from .formats import HOME, Graph, Instruction, Stages
from .timeline import OP_CODES

IO_MODES = ("sync", "overlap")


class PlanError(ValueError):
    """A plan that cannot run: names the stage, the instruction and what is wrong."""

    def __init__(self, stage: int, position: int, instruction: Instruction | None, problem: str):
        self.stage, self.position, self.instruction = stage, position, instruction
        where = f"at stage {stage}, instruction {position} ({instruction})" if instruction \
            else "after its last stage"
        super().__init__(f"invalid plan {where}: {problem}")


@dataclass
class SimResult:
    peak_bytes: int
    peak_at: tuple[int, int]  # (stage, instruction) where the peak occurs
    compute_time_s: float
    paging_time_s: float
    energy_compute_j: float
    energy_paging_j: float
    energy_static_j: float
    tdi_percent: float
    computes: int
    recomputed: int  # computes beyond the first of each node
    page_ins: int
    page_outs: int
    paged_bytes: int
    home_reads: int = 0  # param nodes read with a page_in from home (counted in computes too)
    fits_budget: bool | None = None
    memory_trace: list[int] = field(default_factory=list, repr=False)  # RAM at each instruction
    io: str = "sync"  # "overlap": paging on its own timeline (timeline.py)
    step_time_s: float | None = None  # overlap: the makespan of compute and IO
    io_busy_s: float | None = None  # overlap: the IO timeline's busy time
    io_wait_s: float | None = None  # overlap: time compute waits on IO
    paging_hidden_share: float | None = None  # overlap: share of IO time hidden behind compute
    io_slowed_s: float | None = None  # overlap: compute lost to the IO's CPU (compute_share)
    # Of compute_time_s and energy_compute_j: the parameters' home read and written by param
    # and update nodes (--params-home flash|host), IO that is not paging's.
    home_io_time_s: float = 0.0
    home_io_energy_j: float = 0.0
    # with tier_capacity="count": the most bytes any tier held beyond its capacity (0: none)
    tier_overflow_bytes: int = 0

    @property
    def time_s(self) -> float:
        if self.step_time_s is not None:
            return self.step_time_s
        return self.compute_time_s + self.paging_time_s

    @property
    def energy_j(self) -> float:
        return self.energy_compute_j + self.energy_paging_j + self.energy_static_j

    def summary(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("memory_trace")
        out.pop("tier_overflow_bytes")  # a planner's candidate's measure; a plan has none
        out["time_s"], out["energy_j"] = self.time_s, self.energy_j
        return out


def simulate(graph: Graph, costs: CostModel, stages: Stages,
             budget_bytes: int | None = None, io: str = "sync",
             tier_capacity: str = "raise") -> SimResult:
    """Replay `stages`; raise PlanError on the first instruction that cannot run. `io`:
    "sync" (paging stops compute) or "overlap" (paging on its own timeline).
    `tier_capacity`: "raise" (a page-out past a tier's capacity is a PlanError) or "count"
    (it is measured in tier_overflow_bytes and the plan does not fit its budget: a planner's
    candidate, not a plan to run)."""
    if io not in IO_MODES:
        raise ValueError(f"io must be one of {IO_MODES}, got {io!r}")
    if tier_capacity not in ("raise", "count"):
        raise ValueError(f"tier_capacity must be 'raise' or 'count', got {tier_capacity!r}")
    overflow = 0
    sizes = [n.out_bytes for n in graph.nodes]
    workspace = costs.workspace(graph)  # a profile's where it measured one (costs.build_costs)
    deps = [[graph.index[d] for d in n.inputs] for n in graph.nodes]
    stepped = graph.stepped_by()
    ram: set[int] = set()
    tiers: dict[str, set[int]] = {name: set() for name in costs.tiers}
    tier_bytes = {name: 0 for name in costs.tiers}
    ram_bytes = 0
    fixed = graph.fixed_bytes + costs.runtime_warm_bytes
    peak, peak_at = fixed, (0, 0)
    computed = [0] * len(graph)
    t_compute = t_paging = e_compute = e_paging = t_home = e_home = 0.0
    page_ins = page_outs = paged_bytes = home_reads = 0
    trace: list[int] = []
    ops: list[tuple[int, int, str | None]] = []  # resolved, for the IO timeline

    for s, stage in enumerate(stages):
        for k, ins in enumerate(stage):
            def fail(problem: str) -> PlanError:
                return PlanError(s, k, ins, problem)

            i = graph.index.get(ins.node)
            if i is None:
                raise fail(f"node {ins.node!r} is not in graph '{graph.name}'")
            now = ram_bytes
            home = ins.op == "page_in" and ins.tier == HOME
            if home and not graph.nodes[i].read_from_home:
                raise fail("only a param node whose parameters live on a page tier is read "
                           "from home")
            if ins.op == "compute" or home:
                missing = [graph.nodes[d].id for d in deps[i] if d not in ram]
                if missing:
                    raise fail(f"inputs {missing} are not in RAM")
                if i in ram:
                    raise fail("the node's output is already in RAM")
                if i in stepped and computed[stepped[i]]:
                    raise fail(f"it reads parameters that update node "
                               f"{graph.nodes[stepped[i]].id!r} has already stepped: computed "
                               "again after it, it would use the new weights")
                now = ram_bytes + sizes[i] + (0 if home else workspace[i])
                home_reads += home
                ram.add(i)
                ram_bytes += sizes[i]
                computed[i] += 1
                t_compute += costs.time_s[i]
                e_compute += costs.energy_j[i]
                if costs.home_io_s is not None:
                    t_home += costs.home_io_s[i]
                    e_home += costs.home_io_j[i]
            elif ins.op == "free":
                if i not in ram:
                    raise fail("freeing a tensor that is not in RAM (freed twice, or never made)")
                ram.discard(i)
                ram_bytes -= sizes[i]
            elif ins.op == "page_out":
                tier = _tier(costs, ins, fail)
                if i not in ram:
                    raise fail("paging out a tensor that is not in RAM")
                ram.discard(i)
                ram_bytes -= sizes[i]
                if i not in tiers[tier]:
                    tiers[tier].add(i)
                    tier_bytes[tier] += sizes[i]
                    capacity = costs.tiers[tier].capacity_bytes
                    if capacity is not None and tier_bytes[tier] > capacity:
                        if tier_capacity == "raise":
                            home = costs.tiers[tier].home_bytes
                            left = f" (what {home} bytes homed there leave)" if home else ""
                            raise fail(f"tier '{tier}' holds {tier_bytes[tier]} bytes, over "
                                       f"its capacity of {capacity}{left}")
                        overflow = max(overflow, tier_bytes[tier] - capacity)
                t_paging += costs.tiers[tier].out_time_s[i]
                e_paging += costs.tiers[tier].out_energy_j[i]
                page_outs += 1
                paged_bytes += sizes[i]
            elif ins.op == "page_in":
                tier = _tier(costs, ins, fail)
                if i not in tiers[tier]:
                    raise fail(f"paging in a tensor that was never paged out to '{tier}'")
                if i in ram:
                    raise fail("paging in a tensor that is already in RAM")
                ram.add(i)
                ram_bytes += sizes[i]
                now = ram_bytes
                t_paging += costs.tiers[tier].in_time_s[i]
                e_paging += costs.tiers[tier].in_energy_j[i]
                page_ins += 1
                paged_bytes += sizes[i]
            else:
                raise fail(f"unknown op {ins.op!r}")
            now += fixed
            trace.append(now)
            ops.append((OP_CODES[ins.op], i, ins.tier))
            if now > peak:
                peak, peak_at = now, (s, k)

    never = [graph.nodes[i].id for i, c in enumerate(computed) if c == 0]
    if never:
        raise PlanError(len(stages), 0, None, f"nodes never computed: {never[:10]}"
                        + (" ..." if len(never) > 10 else ""))
    total_cost = sum(costs.time_s)
    tdi = 100.0 * (t_compute / total_cost - 1.0) if total_cost > 0 else 0.0
    n_computes = sum(computed)
    # The IO timeline of the validated replay (its peak is the synchronous one: timeline.py).
    timeline = costs.timeline(ops, deps, [n.out_bytes for n in graph.nodes], trace) \
        if io == "overlap" else None
    step_time = timeline.step_time_s if timeline else t_compute + t_paging
    return SimResult(
        peak_bytes=peak, peak_at=peak_at, compute_time_s=t_compute, paging_time_s=t_paging,
        energy_compute_j=e_compute, energy_paging_j=e_paging,
        energy_static_j=costs.static_w * step_time, tdi_percent=tdi,
        computes=n_computes, recomputed=n_computes - len(graph), page_ins=page_ins,
        page_outs=page_outs, paged_bytes=paged_bytes, home_reads=home_reads,
        fits_budget=None if budget_bytes is None else peak <= budget_bytes and not overflow,
        tier_overflow_bytes=overflow, memory_trace=trace,
        io=io, step_time_s=timeline.step_time_s if timeline else None,
        io_busy_s=timeline.io_busy_s if timeline else None,
        io_wait_s=timeline.waited_s if timeline else None,
        paging_hidden_share=timeline.hidden_share if timeline else None,
        io_slowed_s=timeline.slowed_s if timeline else None,
        home_io_time_s=t_home, home_io_energy_j=e_home)


def _tier(costs: CostModel, ins: Instruction, fail) -> str:
    if ins.tier not in costs.tiers:
        known = ", ".join(sorted(costs.tiers)) or "none"
        raise fail(f"tier {ins.tier!r} is not available (tiers with costs: {known})")
    return ins.tier
