"""Residency intervals on the stage timeline: the CP-SAT planner's view of a schedule.

The stage model of `stages.py` unrolled onto one axis of integer slots. Stage t starts with its
page-in slot, then one compute slot per node 0..t (node t's is the stage's last used slot):

    slot:  | in(0) c(0,0) . . | in(1) c(1,0) c(1,1) . | in(2) c(2,0) c(2,1) c(2,2) | ...

A tensor's stay in RAM is an interval [start, end] of slots, opened by a compute (at c(t, v)) or
a page-in (at in(t)), and closed by a free right after a compute, by a page-out at the end of a
stage, or at the end of a stage. This module converts both ways between stage decisions and
intervals. Decoding is conservative: the RAM each decoded tensor really occupies (as `lower`
places its instructions) lies inside the interval the solver accounted for, so a solution that
fits the budget on intervals fits it as a plan.
"""

from __future__ import annotations

from dataclasses import dataclass

from .problem import Problem
from .stages import StageDecision, lower

COMPUTE = "compute"


class Timeline:
    """Slot arithmetic for n stages. Every stage gets the same width (n + 1 slots), so that a
    slot is linear in its stage: the CP-SAT model states starts and ends as linear expressions."""

    def __init__(self, n: int):
        self.n = n
        self.width = n + 1

    def base(self, t: int) -> int:
        """Stage t's page-in slot."""
        return t * self.width

    def compute(self, t: int, k: int) -> int:
        return t * self.width + 1 + k

    def end(self, t: int) -> int:
        """Stage t's last slot: node t's compute."""
        return self.compute(t, t)

    def stage(self, slot: int) -> int:
        return slot // self.width

    @property
    def horizon(self) -> int:
        return self.n * self.width


@dataclass
class Residency:
    """One stay of a node's output in RAM."""
    start: int
    end: int  # inclusive: the tensor is counted at this slot
    opener: str  # COMPUTE, or the tier it was paged in from
    page_out: str | None = None  # the tier it is paged out to at `end` (a stage's last slot)


def intervals_from_decisions(p: Problem, decisions: list[StageDecision]) -> list[list[Residency]]:
    """Each node's residencies in the schedule that `lower` makes of these decisions."""
    stages, _ = lower(p, decisions)
    line, index = Timeline(p.n), p.graph.index
    out: list[list[Residency]] = [[] for _ in range(p.n)]
    open_at: dict[int, Residency] = {}
    for t, instructions in enumerate(stages):
        last_compute = max((k for k, ins in enumerate(instructions) if ins.op == "compute"))
        slot = line.base(t)
        for position, ins in enumerate(instructions):
            i = index[ins.node]
            if ins.op == "page_in":
                open_at[i] = Residency(line.base(t), -1, ins.tier)
            elif ins.op == "compute":
                slot = line.compute(t, i)
                open_at[i] = Residency(slot, -1, COMPUTE)
            else:
                r = open_at.pop(i)
                # frees between computes happen right after the latest compute; page-outs and
                # the frees after the last compute happen at the stage's end
                r.end = line.end(t) if ins.op == "page_out" or position > last_compute else slot
                if ins.op == "page_out":
                    r.page_out = ins.tier
                out[i].append(r)
    for i, r in open_at.items():  # still resident when the step ends
        r.end = line.end(p.n - 1)
        out[i].append(r)
    for runs in out:
        runs.sort(key=lambda r: r.start)
    return out


def decisions_from_intervals(p: Problem, runs: list[list[Residency]]) -> list[StageDecision]:
    """Stage decisions from per-node residencies, dropping stays that serve nothing.

    A recomputation or page-in whose interval covers no compute of a consumer (and ends in no
    page-out) is dropped; dropping one can orphan another, so this repeats until nothing changes.
    Each kept stay is shortened to its last real use, which is where `lower` frees it.
    """
    line = Timeline(p.n)
    runs = [[Residency(r.start, r.end, r.opener, r.page_out) for r in node] for node in runs]
    while True:
        computed = _computed_stages(line, runs)
        dropped = False
        for v in range(p.n):
            kept = []
            for r in runs[v]:
                first = r.opener == COMPUTE and r.start == line.compute(v, v)
                if first or r.page_out is not None or _last_use(p, line, v, r, computed):
                    kept.append(r)
                else:
                    dropped = True
            runs[v] = kept
        if not dropped:
            break
    decisions = [StageDecision([], set()) for _ in range(p.n)]
    for v, stages in enumerate(computed):
        for t in stages:
            decisions[t].compute.append(v)
    for v in range(p.n):
        for r in runs[v]:
            first = line.stage(r.start)
            if r.page_out is not None:
                end = r.end
                decisions[line.stage(end)].page_out.append((v, r.page_out))
            else:
                end = _last_use(p, line, v, r, computed) or r.start
            if r.opener != COMPUTE:
                decisions[first].page_in.append((v, r.opener))
            for t in range(first, line.stage(end)):
                decisions[t].keep.add(v)
    for d in decisions:
        d.compute.sort()
        d.page_in.sort()
        d.page_out.sort()
    return decisions


def _computed_stages(line: Timeline, runs: list[list[Residency]]) -> list[set[int]]:
    return [{line.stage(r.start) for r in node if r.opener == COMPUTE} for node in runs]


def _last_use(p: Problem, line: Timeline, v: int, r: Residency,
              computed: list[set[int]]) -> int | None:
    """The last slot inside r at which a consumer of v is computed, or None."""
    last = None
    for k in p.users[v]:
        for t in computed[k]:
            slot = line.compute(t, k)
            if r.start < slot <= r.end and (last is None or slot > last):
                last = slot
    return last
