"""A cheap lower bound for the stage model, valid on any DAG and any size.

At node t's first compute (stage t) RAM holds t's inputs, its output, its workspace and the fixed
memory, plus every earlier tensor u that a later node reads unless u leaves RAM and comes back
(a recomputation, costing at least u's compute, or a page-out and page-in). So at each stage the
schedule pays at least the cheapest way to take `excess_t` bytes out of that set: a covering
knapsack, whose fractional relaxation (cheapest cost per byte first) is a lower bound. One
recomputation can serve several stages, so the bound is the largest stage's, not the sum.
"""

from __future__ import annotations

import math

import numpy as np

from .events import node_costs
from .problem import Problem

SCOPE = "stage model (combinatorial: per-stage fractional knapsack)"


def leave_costs(p: Problem) -> np.ndarray:
    """The least each tensor's leaving RAM and coming back costs: a recomputation, or a
    page-out and a page-in to the cheapest tier (only its energy where paging overlaps)."""
    cost = np.asarray(node_costs(p), dtype=float)
    hidden = np.asarray(p.hidden_home_reads(), dtype=bool)
    if hidden.any():  # a read from home may hide wholly behind compute: only its energy is sure
        cost[hidden] = 0.0 if p.objective == "time" else np.asarray(p.costs.energy_j)[hidden]
    for name in p.tiers:  # leaving by paging costs a page-out and a page-in instead
        tier = p.costs.tiers[name]
        paging = np.asarray(tier.out_time_s, dtype=float) + np.asarray(tier.in_time_s, dtype=float)
        if p.overlapped:  # paging may hide wholly behind compute: only its energy is sure
            paging = np.zeros_like(paging)
        if p.objective == "energy":
            paging = p.costs.static_w * paging + np.asarray(tier.out_energy_j) + \
                np.asarray(tier.in_energy_j)
        cost = np.minimum(cost, paging)
    return cost


def plain_objective(p: Problem) -> float:
    """The objective of the plain schedule: what every bound adds its extra cost to. Where
    reads from home overlap, only the compute they leave is sure to take its time."""
    time = p.plain_time - _hidden_read_time(p)
    return time if p.objective == "time" else sum(p.costs.energy_j) + p.costs.static_w * time


def with_io_timeline(p: Problem, bound: float) -> float:
    """A time bound raised by the reads from home that leave_costs and plain_objective count
    as hidden: each param node is read once at least, on the compute timeline (which `bound`,
    counting no read, bounds without it) or on the IO timeline. With x of the reads' time H on
    compute, the step is at least max(bound + x, H - x) >= (bound + H) / 2."""
    if p.objective != "time" or not math.isfinite(bound):
        return bound
    return max(bound, (bound + _hidden_read_time(p)) / 2)


def _hidden_read_time(p: Problem) -> float:
    """The time of every read from home that may hide behind compute, each read once."""
    return sum(t for t, hidden in zip(p.costs.time_s, p.hidden_home_reads()) if hidden)


def first_compute_needs(p: Problem) -> np.ndarray:
    """RAM that node t's first compute needs whatever else stays: the fixed memory, t's inputs,
    its output and its workspace (bytes, by t)."""
    sizes = np.asarray(p.sizes, dtype=np.int64)
    return np.asarray([p.fixed + sizes[p.deps[t]].sum() + sizes[t] + p.workspace[t]
                       for t in range(p.n)], dtype=np.int64)


def stage_lower_bound(p: Problem) -> float:
    """A lower bound on the objective of every schedule within the budget (paging included)."""
    cost = leave_costs(p)
    base = plain_objective(p)
    needs = first_compute_needs(p)
    sizes = np.asarray(p.sizes, dtype=float)
    last_use = np.asarray([max(users, default=-1) for users in p.users])
    per_byte = cost / np.maximum(sizes, 1.0)
    by_value = np.argsort(per_byte, kind="stable")  # cheapest per byte first
    best = 0.0
    for t in range(p.n):
        deps = p.deps[t]
        live = by_value[(by_value < t) & (last_use[by_value] > t)]
        if deps:
            live = live[~np.isin(live, deps)]
        excess = needs[t] + sizes[live].sum() - p.budget_bytes
        if excess <= 0:
            continue
        taken = np.cumsum(sizes[live])
        full = int(np.searchsorted(taken, excess))  # items wholly dropped before the last one
        if full >= len(live):
            continue  # cannot be fixed at all: the budget check reports it, not the bound
        paid = cost[live[:full]].sum()
        before = taken[full - 1] if full else 0.0
        paid += per_byte[live[full]] * (excess - before)
        best = max(best, paid)
    return base + best
