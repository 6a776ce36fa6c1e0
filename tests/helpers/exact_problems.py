"""The problems the exact solvers are checked on (tiny graphs, a fraction of the plain peak,
optionally paging to a slow flash), and the check: the MILP proves the brute force's optimum."""

from __future__ import annotations

import math

import pytest

from edge_remat_agent.costs import build_costs
from edge_remat_agent.formats import Tier
from edge_remat_agent.simulate import simulate
from edge_remat.planner.build import plain_peak_bytes
from edge_remat.planner.evaluate import evaluate
from edge_remat.planner.milp import solve_milp
from edge_remat.planner.problem import Problem
from edge_remat.planner.stages import lower

from .brute_force import brute_force

FLASH = {"flash": Tier(read_bytes_per_s=4.0, write_bytes_per_s=2.0, latency_s=0.5,
                       read_j_per_byte=0.3, write_j_per_byte=0.6)}


def problem(graph, fraction, objective="time", deadline=None, paging=False, static_w=0.0,
            paging_time="counted"):
    costs = build_costs(graph, tiers=FLASH if paging else None)
    costs.static_w = static_w
    peak = plain_peak_bytes(graph)
    p = Problem(graph, costs, math.ceil(fraction * peak), objective, deadline,
                ("flash",) if paging else (), paging_time)
    smallest, _ = p.smallest_budget()
    p.budget_bytes = max(p.budget_bytes, smallest)
    return p


def assert_matches_brute_force(p):
    """The MILP's optimum equals the exhaustive search's; returns the latter (None if nothing
    fits), so a caller checking another solver does not search again."""
    expected = brute_force(p)
    outcome = solve_milp(p, time_limit=60, threads=1)
    if expected is None:
        assert outcome.status == "infeasible"
        return None
    value, decisions = expected
    # the brute force's own winner is a valid schedule within the budget
    stages, _ = lower(p, decisions)
    assert simulate(p.graph, p.costs, stages, p.budget_bytes).fits_budget
    assert outcome.status == "optimal", outcome
    ev = evaluate(p, outcome.decisions)
    assert ev.feasible
    assert ev.value == pytest.approx(value, rel=1e-6, abs=1e-9)
    assert outcome.bound == pytest.approx(value, rel=1e-5, abs=1e-6)
    return expected
