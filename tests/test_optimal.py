"""The exact solvers reach the true optimum of the stage space on tiny graphs."""

from __future__ import annotations

import pytest
from helpers.exact_problems import assert_matches_brute_force, problem
from helpers.small_graphs import random_dag, training_chain

pytestmark = pytest.mark.slow

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
