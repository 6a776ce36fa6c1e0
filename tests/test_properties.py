"""Properties on random DAGs: every plan validates and fits; the MILP never loses to a baseline."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from helpers.small_graphs import random_dag, training_chain

from edge_remat_agent.costs import build_costs
from edge_remat_agent.formats import Tier
from edge_remat_agent.simulate import simulate
from edge_remat.planner.baselines import BASELINES
from edge_remat.planner.build import plain_peak_bytes
from edge_remat.planner.evaluate import evaluate
from edge_remat.planner.milp import solve_milp
from edge_remat.planner.problem import Problem

pytestmark = pytest.mark.slow

FLASH = {"flash": Tier(read_bytes_per_s=8.0, write_bytes_per_s=4.0, latency_s=0.2,
                       read_j_per_byte=0.1, write_j_per_byte=0.2)}

graphs = st.one_of(
    st.builds(random_dag, st.integers(3, 9), st.integers(0, 10**6), st.integers(1, 3)),
    st.builds(training_chain, st.integers(1, 3), st.integers(0, 10**6)))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=graphs, fraction=st.floats(0.3, 1.0), paging=st.booleans(),
       objective=st.sampled_from(["time", "energy"]))
def test_every_plan_validates_and_milp_beats_baselines(graph, fraction, paging, objective):
    costs = build_costs(graph, tiers=FLASH if paging else None)
    costs.static_w = 0.3
    peak = plain_peak_bytes(graph)
    p = Problem(graph, costs, max(math.ceil(fraction * peak), 1), objective,
                tiers=("flash",) if paging else ())
    smallest, _ = p.smallest_budget()
    p.budget_bytes = max(p.budget_bytes, smallest)
    best_baseline = math.inf
    for name, baseline in BASELINES.items():
        decisions = baseline(p)
        if decisions is None:
            continue
        ev = evaluate(p, decisions)  # lowering + simulator: raises on an invalid plan
        assert ev.fits_budget, name
        best_baseline = min(best_baseline, ev.value)
    outcome = solve_milp(p, time_limit=30, threads=1)
    if paging:  # paging every input in and every output out makes the smallest budget attainable
        assert outcome.decisions is not None
    if outcome.decisions is None:
        assert outcome.status == "infeasible" and best_baseline == math.inf
        return
    ev = evaluate(p, outcome.decisions)
    sim = simulate(graph, costs, ev.stages, p.budget_bytes)
    assert sim.fits_budget and sim.peak_bytes == ev.sim.peak_bytes
    assert outcome.status == "optimal"
    assert ev.value <= best_baseline * (1 + 1e-6) + 1e-9
    assert outcome.bound <= ev.value * (1 + 1e-6) + 1e-9
