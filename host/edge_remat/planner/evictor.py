"""An always-feasible first plan: DTR's runtime evictor, run offline as a simulation.

Walk the execution order. Before computing a node, make its inputs resident, recomputing
evicted ones recursively (their inputs first); before each compute, while RAM would exceed the
budget, evict the resident tensor with the best score that no pending compute pins (the inputs
of every compute on the recursion stack are pinned once resident). The score is DTR's h with
what a static planner knows: the cost of bringing the tensor back (its own compute plus that of
its evicted ancestors, DTR's e*) over its size times how long it would be out of RAM (nodes to
its next use). Tensors no later node reads are freed at once.

Evictions happen inside recompute chains, and a node may be recomputed more than once in one
stage, which the stage model (stages.py) of every other solver cannot express: so the answer is
the plan's instructions themselves, validated by the simulator like every plan. It fails only
when the pinned inputs of the recursion stack and the op's output do not fit, which on graphs
without deep fan-in chains means a budget below the largest single op's working set.

STATUS: an experiment, not wired into solve.py. On random layered graphs (seed 1) at 0.8 of
the plain peak it finds a valid plan for 250 nodes (TDI 71-95%) and 1000 nodes (TDI 3.4%,
0.1 s), but none for 500, 2000 and 5000: evicting a tensor whose inputs have died makes a
cone back to the source, and the cones' pinned inputs fill the budget. `waiting` (inputs of
evicted tensors kept alive) and shallow-first eviction reduce, but do not remove, the cascade.
"""

from __future__ import annotations

import bisect
import time as clock

from edge_remat_agent.formats import Instruction, Stages

from .problem import Problem

# Tensors whose evicted-ancestor cone has at most SHALLOW nodes are evicted first (a deep cone
# is recomputed node by node and pins its inputs meanwhile); cones are costed up to
# CLOSURE_LIMIT nodes.
SHALLOW, CLOSURE_LIMIT = 16, 256


def evict_stages(p: Problem, deadline: float | None = None) -> Stages | None:
    """The plan's stages (stage t ends with node t's first compute and the frees after it),
    within the budget; None when the pinned tensors do not fit, or the deadline (a
    time.perf_counter() time) passes."""
    capacity = p.budget_bytes - p.fixed
    sizes, deps, ids = p.sizes, p.deps, [node.id for node in p.graph.nodes]
    ram: set[int] = set()
    level = 0
    stages: Stages = []
    # waiting[d]: evicted tensors read later whose recomputation reads d: d stays alive for
    # them as for a use of its own, so that the cone behind an eviction stays shallow.
    waiting: list[set[int]] = [set() for _ in range(p.n)]
    for t in range(p.n):
        if deadline is not None and clock.perf_counter() > deadline:
            return None
        out: list[Instruction] = []
        pins: dict[int, int] = {}  # tensor -> computes on the stack that read it
        # An explicit stack (recursion would overflow on long chains): (node, expanded?)
        stack: list[tuple[int, bool]] = [(t, False)]
        for i in deps[t]:
            pins[i] = pins.get(i, 0) + 1
        while stack:
            k, expanded = stack.pop()
            if k in ram:  # another branch of the recursion made it resident already
                for i in deps[k]:
                    pins[i] -= 1
                continue
            missing = [i for i in deps[k] if i not in ram]
            if missing and not expanded:
                stack.append((k, True))
                for i in reversed(missing):
                    for d in deps[i]:
                        pins[d] = pins.get(d, 0) + 1
                    stack.append((i, False))
                continue
            if missing:  # an input was evicted while its siblings were made resident
                return None
            over = level + sizes[k] + p.workspace[k] - capacity
            if over > 0:
                victims = _victims(p, t, ram, pins, k, over, waiting)
                if victims is None:
                    return None
                for i in victims:
                    for d in deps[i]:
                        waiting[d].add(i)
                    ram.discard(i)
                    level -= sizes[i]
                    out.append(Instruction("free", ids[i]))
            out.append(Instruction("compute", ids[k]))
            ram.add(k)
            level += sizes[k]
            for i in deps[k]:
                pins[i] -= 1
                waiting[i].discard(k)
            for i in (*deps[k], k):
                if i in ram and not pins.get(i) and not waiting[i] \
                        and _next_use(p, i, t, k) is None:
                    ram.discard(i)
                    level -= sizes[i]
                    out.append(Instruction("free", ids[i]))
        stages.append(out)
    return stages


def _next_use(p: Problem, i: int, t: int, done: int) -> int | None:
    """The first node from t on that reads i and is not computed yet (t once `done` is t)."""
    users = p.users[i]
    pos = bisect.bisect_left(users, t + (done == t))
    return users[pos] if pos < len(users) else None


def _victims(p: Problem, t: int, ram: set[int], pins: dict[int, int], k: int,
             over: int, waiting: list[set[int]]) -> list[int] | None:
    """Unpinned residents to evict, best DTR score first, until `over` bytes are out."""
    def score(i: int) -> tuple[bool, float, int]:
        distance = min(_next_use(p, u, t, -1) or p.n for u in (i, *waiting[i])) - t + 1
        deep, cost = _closure_cost(p, i, ram)
        return deep, (cost + 1e-12) / (max(p.sizes[i], 1) * distance), i

    chosen, freed = [], 0
    scored = sorted((score(i), i) for i in ram if not pins.get(i) and i not in p.deps[k])
    for _, i in scored:
        if freed >= over:
            break
        chosen.append(i)
        freed += p.sizes[i]
    return chosen if freed >= over else None


def _closure_cost(p: Problem, i: int, ram: set[int]) -> tuple[bool, float]:
    """The compute cost of bringing i back, i and its ancestors not in RAM (DTR's e*), and
    whether that cone is deeper than SHALLOW nodes (counted up to CLOSURE_LIMIT)."""
    seen, stack, total = {i}, [i], 0.0
    while stack and len(seen) <= CLOSURE_LIMIT:
        k = stack.pop()
        total += p.costs.time_s[k]
        for d in p.deps[k]:
            if d not in ram and d not in seen:
                seen.add(d)
                stack.append(d)
    return len(seen) > SHALLOW, total
