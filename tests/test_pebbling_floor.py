"""The pebbling floor (edge_remat_agent/pebbling.py): a budget that recomputation cannot get
under is refused at once, with the smallest budget the game leaves open; checked against
exhaustive search on tiny graphs, where it must never refuse a budget that some schedule fits."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from helpers.bad_inputs import BAD_INPUT, cli, refused
from helpers.brute_force import brute_force
from helpers.small_graphs import random_dag, tiny_graphs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edge_remat.planner.build import plain_peak_bytes
from edge_remat.planner.problem import InfeasibleBudget, Problem
from edge_remat.planner.solve import solve
from edge_remat.synthetic import random_layered
from edge_remat_agent.costs import build_costs
from edge_remat_agent.floor import floor_node, no_paging_floor
from edge_remat_agent.formats import Graph, Node
from edge_remat_agent.pebbling import pebbling_floor, proves_too_small
from edge_remat_agent.simulate import simulate

# v reads a and b (10 B each); a reads x, b reads y (100 B each). Each node's inputs and output
# need at most 110 B, but whichever of a and b is computed last needs its 100-B input beside
# the other one: 120 B.
FAN = [("x", [], 100), ("y", [], 100), ("a", ["x"], 10), ("b", ["y"], 10), ("v", ["a", "b"], 1)]


def fan() -> Graph:
    return Graph([Node(id=i, name=i, kind="forward", op="op", inputs=ins, out_bytes=size,
                       time_s=1.0) for i, ins, size in FAN], name="fan")


def test_a_budget_under_the_game_floor_is_refused_with_the_smallest_it_leaves_open():
    g = fan()
    assert floor_node(g)[0] == 110  # the working sets
    assert Problem(g, build_costs(g), 110).smallest_budget() == (120, 4)
    with pytest.raises(InfeasibleBudget) as refusal:
        Problem(g, build_costs(g), 115).check_budget()
    assert refusal.value.smallest_bytes == 120
    assert "node 'v'" in str(refusal.value) and "119 bytes" in str(refusal.value)
    assert brute_force(Problem(g, build_costs(g), 119)) is None
    # below even the working sets, the higher floor is the one named
    with pytest.raises(InfeasibleBudget) as refusal:
        Problem(g, build_costs(g), 100).check_budget()
    assert refusal.value.smallest_bytes == 120
    # at the floor a schedule exists, and the planner finds it
    p = Problem(g, build_costs(g), 120)
    report = solve(p, "auto", time_limit=10)
    assert simulate(g, p.costs, report.evaluation.stages, 120).fits_budget


def test_paging_lifts_the_game():
    """A tensor paged back in needs none of its inputs: with a tier the game proves nothing."""
    from helpers.exact_problems import FLASH
    g = fan()
    Problem(g, build_costs(g, tiers=FLASH), 115, tiers=("flash",)).check_budget()


def test_the_command_line_names_the_floor(tmp_path):
    # It called the floor "the smallest feasible budget", which a floor (proven necessary,
    # not sufficient) need not be: a budget at it may still not plan.
    path = tmp_path / "fan.json"
    fan().save(path)
    proc = cli("plan", "--graph", path, "--budget", "115", "--json", "-o", tmp_path / "p.json")
    line = refused(proc, BAD_INPUT, "needs at least 120 bytes", "lower bound", "whichever")
    assert "feasible" not in line
    out = json.loads(proc.stdout)
    assert out["status"] == "infeasible" and out["budget_floor_bytes"] == 120
    assert out["smallest_feasible_budget_bytes"] == 120  # the older name, kept for readers
    assert not (tmp_path / "p.json").exists()


graphs = tiny_graphs()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=graphs, fraction=st.floats(0.2, 1.0))
def test_the_game_never_refuses_a_budget_that_a_schedule_fits(graph, fraction):
    costs = build_costs(graph)
    p = Problem(graph, costs, max(1, math.ceil(fraction * plain_peak_bytes(graph))))
    p.budget_bytes = max(p.budget_bytes, p.fixed + floor_node(graph)[0])
    proof = proves_too_small(p.sizes, p.deps, p.workspace, p.budget_bytes - p.fixed)
    if brute_force(p) is not None:
        assert proof is None
    floor = pebbling_floor(p.sizes, p.deps, p.workspace, 0)
    if floor is not None:  # one byte under the game's floor, nothing fits
        below = Problem(graph, costs, p.fixed + floor.bytes - 1)
        assert brute_force(below) is None


def test_the_game_raises_the_floor_on_some_tiny_graphs():
    """Not vacuous: over a few hundred tiny DAGs the game lifts the working-set floor on some,
    and exhaustive search confirms each lifted floor."""
    lifted = 0
    for seed in range(300):
        graph = random_dag(7, seed, 3)
        p = Problem(graph, build_costs(graph), plain_peak_bytes(graph))
        floor = pebbling_floor(p.sizes, p.deps, p.workspace, floor_node(graph)[0])
        if floor is not None:
            lifted += 1
            assert brute_force(Problem(graph, p.costs, p.fixed + floor.bytes - 1)) is None
    assert lifted >= 10  # 21 of these 300


def test_a_cap_on_positions_stops_every_search_at_the_same_sound_floor():
    # Capture compares groupings by the floor (floor.no_paging_floor), and a recapture on the
    # board must give the same graph: a cap on positions visited, unlike the clock, stops the
    # search at the same place every time. An uncapped game visits tens of thousands here.
    graph = random_layered(500, seed=1)
    p = Problem(graph, build_costs(graph), plain_peak_bytes(graph))
    need = floor_node(graph)[0]
    full = pebbling_floor(p.sizes, p.deps, p.workspace, need, math.inf)
    capped = [pebbling_floor(p.sizes, p.deps, p.workspace, need, math.inf, visits=3000)
              for _ in range(2)]
    assert capped[0] == capped[1] is not None
    assert need < capped[0].bytes < full.bytes  # stopped early; what it proved stands
    assert capped[0].bytes <= no_paging_floor(graph) <= full.bytes  # capture's cap: 20,000


def test_the_floor_named_is_the_same_whatever_budget_is_refused():
    # The search for the floor starts from the refused budget; found to the byte, the floor
    # it names does not depend on where it started (to 1e-4 of it, rl100 named 25,049 bytes
    # at 30% of its plain peak and 25,050 at 50%).
    graph = random_layered(100, seed=0)  # the game lifts its floor above the working set
    p = Problem(graph, build_costs(graph), plain_peak_bytes(graph))
    floor = p.smallest_budget()[0]
    assert floor > p.fixed + floor_node(graph)[0]
    named = set()
    for budget in (floor // 2, floor - 3000, floor - 1):
        with pytest.raises(InfeasibleBudget) as refusal:
            replace(p, budget_bytes=budget).check_budget()
        named.add(refusal.value.smallest_bytes)
    assert named == {floor}
