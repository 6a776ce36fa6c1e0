"""Baselines: keep-all, sqrt(n) checkpointing, a DTR-style evictor, peak splitting, Belady paging.

They are the floor every solver must beat, warm starts for the solvers, and the fallback when a
solver runs out of time. All of them are one greedy engine over the stage model of `stages.py`
with different policies, so every baseline plan lies inside the space the exact solvers search.
"""

from __future__ import annotations

import math
import time as clock
from typing import Callable

from .problem import Problem
from .stages import StageDecision, lower_stage

# retain(i, t): may tensor i, which has a later use, stay in RAM after stage t?
Retain = Callable[[int, int], bool]


def greedy(p: Problem, evict: str | None = None, retain: Retain | None = None,
           page_tier: str | None = None,
           deadline: float | None = None) -> list[StageDecision] | None:
    """Walk the stages; recompute (or page in) what is missing; evict when over budget.

    evict: None (fail when over budget), "dtr" (drop the tensor with the least
    cost / (size x staleness), recompute it on demand) or "belady" (page out the tensor whose next
    use is farthest, to `page_tier`; a param node whose group lives on a page tier is dropped
    instead and read from its home again when next used: the same read, and no write). Returns
    None when the budget cannot be met this way, or not before `deadline` (a
    time.perf_counter() time).
    """
    decisions: list[StageDecision] = []
    ram: set[int] = set()
    tiers: dict[str, set[int]] = {}
    last_access = [0] * p.n
    for t in range(p.n):
        if deadline is not None and clock.perf_counter() > deadline:
            return None
        dropped: set[int] = set()  # tensors of this stage freed after their last use in it
        while True:
            # checked per eviction too: on thousands of nodes one stage can evict for minutes
            if deadline is not None and clock.perf_counter() > deadline:
                return None
            compute, page_in, used = _plan_stage(p, t, ram, tiers)
            keep = {i for i in ram | compute | {i for i, _ in page_in}
                    if p.used_after(i, t) and (retain is None or retain(i, t))
                    and i not in dropped}
            d = StageDecision(sorted(compute), keep, page_in)
            _, peak = lower_stage(p, t, d, set(ram), {k: set(v) for k, v in tiers.items()})
            if peak <= p.budget_bytes:
                break
            victim = _choose_victim(p, t, ram, ram - used, evict, last_access)
            if victim is None and evict == "dtr":
                # Nothing idle is left to evict: stop keeping something this stage uses, so
                # that it leaves RAM after its last use here and is recomputed when needed.
                victim = _choose_victim(p, t, ram, keep, evict, last_access)
                if victim is None:
                    return None
                dropped.add(victim)
                continue
            if victim is None:
                return None
            prev = decisions[t - 1]
            prev.keep.discard(victim)
            if evict == "belady" and victim not in tiers.get(page_tier, ()) \
                    and not p.home_reads[victim]:
                prev.page_out.append((victim, page_tier))
                tiers.setdefault(page_tier, set()).add(victim)
            ram.discard(victim)
        lower_stage(p, t, d, ram, tiers)
        for i in used | compute:
            last_access[i] = t
        decisions.append(d)
    return decisions


def _plan_stage(p: Problem, t: int, ram: set[int], tiers: dict[str, set[int]]):
    """What stage t must compute or page in so that node t's inputs are all in RAM."""
    compute, page_in, used = {t}, [], set()
    stack = [t]
    while stack:
        k = stack.pop()
        for i in p.deps[k]:
            used.add(i)
            if i in ram or i in compute or any(i == j for j, _ in page_in):
                continue
            tier = next((name for name, held in tiers.items() if i in held), None)
            if tier is not None:
                page_in.append((i, tier))
            else:
                compute.add(i)
                stack.append(i)
    return compute, sorted(page_in), used


def _choose_victim(p: Problem, t: int, ram: set[int], candidates: set[int], evict: str | None,
                   last_access: list[int]) -> int | None:
    if evict is None or not candidates:
        return None
    if evict == "belady":
        return max(candidates, key=lambda i: (p.next_use(i, t - 1) or p.n, p.sizes[i], -i))
    # DTR's heuristic, with what a static planner knows: the cost of bringing the tensor back
    # (its own cost plus that of its evicted ancestors, DTR's e*), over its size times how long
    # it would be out of RAM. Staleness breaks ties.
    def score(i: int) -> tuple[float, int]:
        distance = (p.next_use(i, t - 1) or p.n) - t + 1
        return ((_recompute_cost(p, i, ram - {i}) + 1e-12) / (max(p.sizes[i], 1) * distance),
                last_access[i])
    return min(candidates, key=score)


def _recompute_cost(p: Problem, i: int, ram: set[int]) -> float:
    seen, stack, total = set(), [i], 0.0
    while stack:
        k = stack.pop()
        if k not in seen:
            seen.add(k)
            total += p.costs.time_s[k]
            stack.extend(d for d in p.deps[k] if d not in ram)
    return total


def keep_all(p: Problem, deadline: float | None = None) -> list[StageDecision] | None:
    return greedy(p, deadline=deadline)


def checkpoint_candidates(p: Problem) -> list[int]:
    """Forward nodes that split the forward graph: no forward edge jumps over them."""
    forward = [i for i, node in enumerate(p.graph.nodes) if node.kind == "forward"]
    fset = set(forward)
    reach = -1  # the farthest forward node an edge from before the current one reaches
    candidates = []
    for i in forward:
        if reach <= i:
            candidates.append(i)
        for j in p.users[i]:
            if j in fset:
                reach = max(reach, j)
    return candidates


def checkpointing(p: Problem, count: int,
                  deadline: float | None = None) -> list[StageDecision] | None:
    """Keep `count` evenly spaced articulation points; forward tensors between them are dropped
    once the forward pass no longer needs them, and recomputed segment by segment in backward."""
    candidates = checkpoint_candidates(p)
    if not candidates:
        return None
    step = max(1, len(candidates) / max(count, 1))
    chosen = {candidates[min(len(candidates) - 1, int(round(k * step)))] for k in range(count)}
    forward = {i for i, node in enumerate(p.graph.nodes) if node.kind == "forward"}
    first_backward = min((i for i in range(p.n) if i not in forward), default=p.n)

    def retain(i: int, t: int) -> bool:
        if i in chosen or i not in forward or t >= first_backward:
            return True
        return p.next_use(i, t) in forward

    return greedy(p, retain=retain, deadline=deadline)


def sqrt_n(p: Problem, deadline: float | None = None) -> list[StageDecision] | None:
    """The classic sqrt(n) checkpointing, trying counts around sqrt(n) and keeping the cheapest."""
    from .evaluate import evaluate  # local: evaluate imports the solvers' result type
    n_forward = sum(1 for node in p.graph.nodes if node.kind == "forward")
    best, best_value = None, math.inf
    root = max(1, round(math.sqrt(n_forward)))
    for count in sorted({max(1, root // 2), root, 2 * root, 4 * root}):
        decisions = checkpointing(p, count, deadline)
        if decisions is None:
            continue
        result = evaluate(p, decisions)
        if result.feasible and result.objective < best_value:
            best, best_value = decisions, result.objective
    return best


def dtr(p: Problem, deadline: float | None = None) -> list[StageDecision] | None:
    return greedy(p, evict="dtr", deadline=deadline)


def belady_paging(p: Problem, deadline: float | None = None) -> list[StageDecision] | None:
    if not p.tiers:
        return None
    # Page to the tier that moves bytes fastest (read + write time per byte of the largest node).
    big = max(range(p.n), key=p.sizes.__getitem__)
    tier = min(p.tiers, key=lambda name: p.costs.tiers[name].out_time_s[big]
               + p.costs.tiers[name].in_time_s[big])
    return greedy(p, evict="belady", page_tier=tier, deadline=deadline)


# Peak splitting keeps RAM on all n x (n + 1) slots: above this size peak-search and descent
# (the same moves on compute events only) replace it. Descent is also the better starter from
# here: on random layered graphs at 0.8, 500 nodes (seeds 0-2), split 4.19/13.63/10.11% TDI in
# 4-28 s, descent 4.01/12.48/8.10% in 0.3-1 s; 1000 nodes, split 2.49% in 48 s, descent 2.92%
# in 1.4 s (on a loaded 2-core host), and split's time is the first plan's.
SPLIT_MAX_NODES = 400


def split(p: Problem, deadline: float | None = None) -> list[StageDecision] | None:
    if p.n > SPLIT_MAX_NODES:
        return None
    from .splitting import peak_split  # local: splitting needs numpy, the others do not
    return peak_split(p, deadline)


def peak_search(p: Problem, deadline: float | None = None,
                left_at=None) -> list[StageDecision] | None:
    """`left_at`: told the schedule a failed search got to (feasible.feasible_schedule)."""
    from .feasible import feasible_schedule  # local: needs numpy, like splitting
    return feasible_schedule(p, 60.0 if deadline is None else deadline - clock.perf_counter(),
                             left_at)


def descent(p: Problem, deadline: float | None = None) -> list[StageDecision] | None:
    from .descent import descent_schedule  # local: needs numpy, like splitting
    return descent_schedule(p, deadline)


# Run in this order (solve.run_baselines): DTR after the searches that scale, since on large
# graphs it can spend its whole share finding nothing (1000-node random layered graphs at 0.8:
# 3-7 s) while a plan from them waits. Belady paging first of all: where a tier is given it
# fits any budget above the floor, and the others may use up the share (5000 nodes on a loaded
# host: keep-all and sqrt-n took 9.6 s of 12); where none is, it returns at once.
BASELINES = {"paging": belady_paging, "keep-all": keep_all, "sqrt-n": sqrt_n, "split": split,
             "peak-search": peak_search, "descent": descent, "dtr": dtr}
