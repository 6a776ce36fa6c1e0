"""Exhaustive search over the stage space that the solvers search, for tiny graphs.

Written independently of the solvers: it enumerates, stage by stage, every set of page-ins,
recomputations, page-outs and kept tensors, with memoisation on the state between stages
(what is in RAM, what is on each tier) and Pareto fronts of (deadline time, objective). Stage
peaks come from the lowering; the winner is replayed through the simulator by the tests.
One pruning that cannot lose the optimum: a tensor that no node reads is never kept or paged out
(it costs memory or paging and buys nothing). Any other tensor may serve a later recomputation.
"""

from __future__ import annotations

import itertools
from functools import lru_cache

from edge_remat.planner.problem import Problem
from edge_remat.planner.stages import LoweringError, StageDecision, lower_stage


def subsets(items):
    items = sorted(items)
    for r in range(len(items) + 1):
        yield from itertools.combinations(items, r)


def brute_force(p: Problem) -> tuple[float, list[StageDecision]] | None:
    """The optimum objective and its decisions, or None if nothing fits."""
    tiers = p.tiers
    c = p.costs
    deadline = p.deadline_s()

    def has_future(i: int, t: int) -> bool:
        return bool(p.users[i])

    @lru_cache(maxsize=None)
    def best(t: int, ram: frozenset, held: tuple) -> list:
        """Pareto list of (deadline_time, objective, decisions) from stage t to the end."""
        if t == p.n:
            return [(0.0, 0.0, ())]
        front = []
        on_tier = {z: held[k] for k, z in enumerate(tiers)}
        # page-ins: each tensor from at most one tier
        in_choices = [()]
        for z in tiers:
            in_choices = [prev + tuple((i, z) for i in sub) for prev in in_choices
                          for sub in subsets(on_tier[z] - ram - {i for i, _ in prev})]
        for page_in in in_choices:
            brought = ram | {i for i, _ in page_in}
            for extra in subsets(set(range(t)) - brought):
                compute = sorted(extra) + [t]
                avail = brought | set(compute)
                useful = {i for i in avail if has_future(i, t)}
                out_choices = [()]
                for z in tiers:
                    out_choices = [prev + tuple((i, z) for i in sub) for prev in out_choices
                                   for sub in subsets(useful - {i for i, _ in prev})]
                for page_out in out_choices:
                    outs = {i for i, _ in page_out}
                    for keep in subsets(useful - outs):
                        d = StageDecision(list(compute), set(keep), list(page_in), list(page_out))
                        new_ram, new_tiers = set(ram), {z: set(on_tier[z]) for z in tiers}
                        try:
                            _, peak = lower_stage(p, t, d, new_ram, new_tiers)
                        except LoweringError:
                            continue
                        if peak > p.budget_bytes:
                            continue
                        step_time = sum(c.time_s[i] for i in compute)
                        paging = (sum(c.tiers[z].in_time_s[i] for i, z in page_in)
                                  + sum(c.tiers[z].out_time_s[i] for i, z in page_out))
                        counted = step_time + (paging if p.paging_time == "counted" else 0.0)
                        if p.objective == "time":
                            value = step_time + paging
                        else:
                            value = (sum(c.energy_j[i] for i in compute)
                                     + sum(c.tiers[z].in_energy_j[i] for i, z in page_in)
                                     + sum(c.tiers[z].out_energy_j[i] for i, z in page_out)
                                     + c.static_w * (step_time + paging))
                        nxt = best(t + 1, frozenset(new_ram),
                                   tuple(frozenset(new_tiers[z]) for z in tiers))
                        for dt, dv, ds in nxt:
                            front.append((counted + dt, value + dv, (d,) + ds))
        return _pareto(front, deadline)

    start = best(0, frozenset(), tuple(frozenset() for _ in tiers))
    feasible = [f for f in start if deadline is None or f[0] <= deadline * (1 + 1e-9)]
    if not feasible:
        return None
    _, value, decisions = min(feasible, key=lambda f: (f[1], f[0]))
    return value, list(decisions)


def _pareto(front: list, deadline: float | None) -> list:
    if deadline is None:  # only the objective matters
        return [min(front, key=lambda f: f[1])] if front else []
    front.sort(key=lambda f: (f[0], f[1]))
    out, best_value = [], float("inf")
    for f in front:
        if f[1] < best_value - 1e-12 and f[0] <= deadline * (1 + 1e-9):
            out.append(f)
            best_value = f[1]
    return out
