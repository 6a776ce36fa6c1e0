"""The exact solvers reach the true optimum of the stage space on tiny graphs."""

from __future__ import annotations

import math

import pytest
from helpers.brute_force import brute_force
from helpers.small_graphs import random_dag, training_chain

from edge_remat_agent.costs import build_costs
from edge_remat_agent.formats import Tier
from edge_remat_agent.simulate import simulate
from edge_remat.planner.build import plain_peak_bytes
from edge_remat.planner.evaluate import evaluate
from edge_remat.planner.milp import solve_milp
from edge_remat.planner.problem import Problem
from edge_remat.planner.stages import lower

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
    expected = brute_force(p)
    outcome = solve_milp(p, time_limit=60, threads=1)
    if expected is None:
        assert outcome.status == "infeasible"
        return
    value, decisions = expected
    # the brute force's own winner is a valid schedule within the budget
    stages, _ = lower(p, decisions)
    assert simulate(p.graph, p.costs, stages, p.budget_bytes).fits_budget
    assert outcome.status == "optimal", outcome
    ev = evaluate(p, outcome.decisions)
    assert ev.feasible
    assert ev.value == pytest.approx(value, rel=1e-6, abs=1e-9)
    assert outcome.bound == pytest.approx(value, rel=1e-5, abs=1e-6)


CASES = [(random_dag(n, seed), frac) for n, seed, frac in
         [(4, 1, 0.6), (5, 2, 0.7), (6, 3, 0.6), (7, 4, 0.7), (7, 5, 0.5), (6, 6, 0.8)]]
CHAINS = [(training_chain(2, seed), frac) for seed, frac in [(1, 0.6), (2, 0.7), (3, 0.5)]]


@pytest.mark.parametrize("graph,fraction", CASES + CHAINS, ids=lambda x: getattr(x, "name", x))
def test_time_objective_without_paging(graph, fraction):
    assert_matches_brute_force(problem(graph, fraction))


@pytest.mark.parametrize("graph,fraction", CASES[:4] + CHAINS[:2],
                         ids=lambda x: getattr(x, "name", x))
def test_energy_objective_with_deadline(graph, fraction):
    assert_matches_brute_force(problem(graph, fraction, "energy", deadline=1.3, static_w=0.5))


@pytest.mark.parametrize("graph,fraction", [(random_dag(4, 7), 0.5), (random_dag(5, 8), 0.6),
                                            (training_chain(2, 4), 0.5)],
                         ids=lambda x: getattr(x, "name", x))
@pytest.mark.parametrize("objective", ["time", "energy"])
def test_with_paging(graph, fraction, objective):
    assert_matches_brute_force(problem(graph, fraction, objective, paging=True, static_w=0.2))


@pytest.mark.parametrize("mode", ["counted", "free"])
def test_paging_with_deadline_modes(mode):
    p = problem(training_chain(2, 5), 0.5, "energy", deadline=1.2, paging=True, static_w=0.1,
                paging_time=mode)
    assert_matches_brute_force(p)
