"""The overlap post-pass: where to issue each page-in and page-out so that paging hides behind
compute, scored on the simulator's IO timeline (edge_remat_agent/timeline.py).

The solvers keep their stop-the-world model of paging (an upper bound on the overlapped cost)
and decide what to page; this pass decides when. Every solver's schedule goes through it (in
evaluate), so plans are compared, and reported, by their overlapped step time.

  1. each page_out moves up to just after the last instruction that needs its tensor: its RAM
     goes (once written) and its write starts as early as it can;
  2. each page_in, in plan order, is hoisted to the candidate issue point with the shortest
     makespan among those where RAM, with the page held from there on, stays within the
     budget (candidates: just before the 1st, 2nd, 4th, 8th, ... compute before its first use,
     and the earliest point memory allows; ties go to the latest, which holds the page least).

Each candidate is scored on the whole step's timeline, so the pass grows with page-ins x
instructions: a random layered graph of 2000 nodes at 35% with flash (1,026 page-ins) took 19 s
for one plan. Within `hoisting_until(t)` (solve() sets its time limit, and run_baselines each
baseline's share) the page-ins not reached by t stay where the plan put them, as in the
stop-the-world model.
"""

from __future__ import annotations

import time as clock
from contextlib import contextmanager
from contextvars import ContextVar

from edge_remat_agent.formats import Stages
from edge_remat_agent.timeline import COMPUTE, FREE, OP_CODES, PAGE_IN, PAGE_OUT

from .problem import Problem

Op = tuple[int, int, "str | None"]

_hoisting_deadline: ContextVar["float | None"] = ContextVar("hoisting_deadline", default=None)


@contextmanager
def hoisting_until(deadline: "float | None"):
    """Within it, schedule_io hoists no page-in after `deadline` (a time.perf_counter() time;
    None: no deadline of its own), nor after the deadline of an enclosing hoisting_until."""
    outer = _hoisting_deadline.get()
    token = _hoisting_deadline.set(min((d for d in (outer, deadline) if d is not None),
                                       default=None))
    try:
        yield
    finally:
        _hoisting_deadline.reset(token)


def schedule_io(p: Problem, stages: Stages) -> Stages:
    """The same instructions, page-ins and page-outs placed for overlap (never a higher peak
    than the budget, never a longer makespan than the schedule given)."""
    flat = [(s, ins) for s, stage in enumerate(stages) for ins in stage]
    if not any(ins.op in ("page_in", "page_out") for _, ins in flat):
        return stages
    index = p.graph.index
    ops: list[Op] = [(OP_CODES[ins.op], index[ins.node], ins.tier) for _, ins in flat]
    best = _makespan(p, ops)

    moved_flat, moved_ops = _issue_page_outs_early(flat, ops, p.deps)
    score = _makespan(p, moved_ops)
    if score <= best:
        flat, ops, best = moved_flat, moved_ops, score

    deadline, k = _hoisting_deadline.get(), 0
    while k < len(ops):
        if ops[k][0] == PAGE_IN:
            if deadline is not None and clock.perf_counter() > deadline:
                break
            flat, ops, best, k = _hoist_page_in(p, flat, ops, k, best)
        k += 1
    out: Stages = [[] for _ in stages]
    for s, ins in flat:
        out[s].append(ins)
    return out


def sync_trace(p: Problem, ops: list[Op]) -> list[int]:
    """RAM at each instruction in the synchronous model (simulate.py's memory_trace)."""
    ram, trace = 0, []
    for op, i, _ in ops:
        now = ram
        if op == COMPUTE:
            now = ram + p.sizes[i] + p.workspace[i]
            ram += p.sizes[i]
        elif op == PAGE_IN:
            ram += p.sizes[i]
            now = ram
        else:
            ram -= p.sizes[i]
        trace.append(now + p.fixed)
    return trace


def _makespan(p: Problem, ops: list[Op]) -> float:
    return p.costs.timeline(ops, p.deps, p.sizes, sync_trace(p, ops)).step_time_s


def _needs(op: Op, node: int, deps: list[list[int]]) -> bool:
    code, i, _ = op
    return i == node or (code == COMPUTE and node in deps[i])


def _issue_page_outs_early(flat, ops, deps):
    flat, ops = list(flat), list(ops)
    for j in range(len(ops)):
        if ops[j][0] != PAGE_OUT:
            continue
        node = ops[j][1]
        q = j - 1
        while q >= 0 and not _needs(ops[q], node, deps):
            q -= 1
        if q + 1 < j:
            entry, op = flat.pop(j), ops.pop(j)
            flat.insert(q + 1, (flat[q][0] if q >= 0 else entry[0], entry[1]))
            ops.insert(q + 1, op)
    return flat, ops


def _hoist_page_in(p: Problem, flat, ops, j: int, best: float):
    node, size = ops[j][1], p.sizes[ops[j][1]]
    trace = sync_trace(p, ops)
    earliest = j
    while earliest > 0:  # not above what last needed the tensor or removed it from RAM
        op = ops[earliest - 1]
        if _needs(op, node, p.deps) or (op[1] == node and op[0] in (FREE, PAGE_OUT)):
            break
        if trace[earliest - 1] + size > p.budget_bytes:
            break
        earliest -= 1
    if earliest == j:
        return flat, ops, best, j
    computes = [c for c in range(j - 1, earliest - 1, -1) if ops[c][0] == COMPUTE]
    picks = {earliest}
    step = 1
    while step <= len(computes):
        picks.add(computes[step - 1])
        step *= 2
    chosen_ops, chosen_flat = ops, flat
    for c in sorted(picks, reverse=True):  # latest first: ties keep the shorter hold
        trial_ops = ops[:c] + [ops[j]] + ops[c:j] + ops[j + 1:]
        score = _makespan(p, trial_ops)
        if score < best * (1 - 1e-12):
            stage = flat[c][0]
            chosen_flat = flat[:c] + [(stage, flat[j][1])] + flat[c:j] + flat[j + 1:]
            chosen_ops, best = trial_ops, score
    # Moving it up shifts c..j-1 down by one: position j + 1 is unchanged, where the scan goes on.
    return chosen_flat, chosen_ops, best, j
