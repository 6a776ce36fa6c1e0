"""Repair: the last step of the feasibility phase, for the over-budget events that splits
at the next use cannot reach.

Batch splits and the peak search only ever add a recomputation just before a tensor's next use,
with its inputs kept (or recomputed) until then. On wide graphs (a node reads ~15 inputs) the
events they leave over the budget sit inside stages that recompute long chains, where every
such split needs inputs that are gone. Repair widens the moves at the highest over-budget
events, each scored exactly on the event model (any compute sets are a schedule):

  - recompute an idle tensor at ANY stage between the event and its next use where all its
    inputs are already resident (no stay is extended), not only at the next use;
  - move a recomputation that opens a stay covering the event to such a later stage;
  - drop a recomputation made in the event's stage (its uses fall back to the copy before),
    or move it to an earlier stage where its inputs are resident.

The move that removes the most excess per unit of added cost is applied; repair stops when
RAM fits (True), or no move helps or the deadline passes (False).
"""

from __future__ import annotations

import bisect
import time as clock

import numpy as np

from .events import EventSchedule

EVENTS = 12  # highest over-budget events searched per step (the first with a helpful move wins)
STAGES = 2  # alternative stages tried per tensor (latest first, and the next use)


def repair(sched: EventSchedule, capacity: int, added: list[list[tuple[int, int]]],
           deadline: float) -> bool:
    excess = sched.excess(capacity)
    mean_cost = float(np.mean(sched.cost)) or 1.0
    while excess > 0:
        best = None
        for q in np.argsort(-sched.at, kind="stable")[:EVENTS]:
            if sched.at[q] <= capacity:
                break
            for changes in _moves(sched, int(sched.keys[q])):
                if clock.perf_counter() > deadline:
                    return False
                at, runs = sched.trial_changes(changes)
                after = sched.excess(capacity, at)
                if after >= excess:
                    continue
                added_cost = sum(sched.cost[v] * (len(c) - len(sched.computes[v]))
                                 for v, c in changes.items())
                score = (excess - after) / (max(added_cost, 0.0) + 0.05 * mean_cost)
                if best is None or score > best[0]:
                    best = (score, changes, runs, after)
            if best is not None:
                break
        if best is None:
            return False
        _, changes, runs, excess = best
        for v, stages in changes.items():
            added.append([(v, t) for t in stages if t not in sched.computes[v]])
        sched.apply(dict(changes), runs)
    return True


def _moves(sched: EventSchedule, q: int):
    """Candidate compute-set changes that may lower RAM at event key q."""
    p, width = sched.p, sched.width
    stage, node = divmod(q - 1, width)
    for u in range(p.n):
        for start, end in sched.runs[u]:
            if not start <= q <= end:
                continue
            uses = sched.use_keys(u)
            i = bisect.bisect_left(uses, q)
            if u == node or (i < len(uses) and uses[i] == q):
                break  # made or read at q: it must be there
            if i == len(uses):
                break
            next_use = uses[i]
            opened_by = (start - 1) // width  # the stage of the copy covering q
            for r in _stages_between(sched, u, q, next_use):
                new = sorted({*sched.computes[u], r})
                yield {u: new}
                if opened_by != u:  # a recomputation opened the copy: move it instead
                    yield {u: [t for t in new if t != opened_by]}
            break
    if stage != node:  # q is a recomputation: drop it, or make it earlier
        rest = [t for t in sched.computes[node] if t != stage]
        yield {node: rest}
        for r in _earlier_stages(sched, node, stage):
            yield {node: sorted({*rest, r})}


def _resident_inputs(sched: EventSchedule, v: int, key: int) -> bool:
    return all(sched.resident_at(x, key) for x in sched.p.deps[v])


def _stages_between(sched: EventSchedule, u: int, q: int, next_use: int) -> list[int]:
    """Stages r where u could be made after key q and before `next_use`: the next use's stage,
    and up to STAGES others where all of u's inputs are resident (latest first: with no stay
    extended, a later one holds u for less)."""
    width = sched.width
    use_stage, user = divmod(next_use - 1, width)
    last = use_stage if user > u else use_stage - 1
    q_stage, q_node = divmod(q - 1, width)
    first = q_stage if u > q_node else q_stage + 1
    out = []
    if sched.key(last, u) > q and last not in sched.computes[u]:
        out.append(last)
    for r in range(last - 1, first - 1, -1):  # latest first: the shortest new stay
        if len(out) > STAGES:
            break
        key = sched.key(r, u)
        if key > q and r not in sched.computes[u] and _resident_inputs(sched, u, key):
            out.append(r)
    return out


def _earlier_stages(sched: EventSchedule, v: int, stage: int) -> list[int]:
    """Up to STAGES stages before `stage` (and after v's previous copy) where v's inputs are all
    resident, nearest first."""
    previous = max(t for t in sched.computes[v] if t < stage)
    out = []
    for r in range(stage - 1, previous, -1):
        if len(out) >= STAGES:
            break
        if _resident_inputs(sched, v, sched.key(r, v)):
            out.append(r)
    return out
