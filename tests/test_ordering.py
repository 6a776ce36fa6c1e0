"""The memory-aware execution order (planner/ordering.py): graphs whose order is free are
planned in an order that leaves less RAM above the budget; the plan replays on the graph as
given; captured graphs keep their order."""

from __future__ import annotations

from dataclasses import replace

import pytest
from helpers.bad_inputs import cli, refused
from helpers.small_graphs import random_dag

from edge_remat.planner.build import build_problem, keep_all_peak_bytes
from edge_remat.planner.order_search import OrderSweep
from edge_remat.planner.ordering import _structure, _sweep, memory_order
from edge_remat.planner.solve import solve
from edge_remat.synthetic import random_layered
from edge_remat_agent.costs import build_costs
from edge_remat_agent.formats import Graph
from edge_remat_agent.simulate import simulate


def _is_topological(graph: Graph) -> bool:
    seen = set()
    for node in graph.nodes:
        if any(d not in seen for d in node.inputs):
            return False
        seen.add(node.id)
    return True


@pytest.mark.parametrize("seed", range(6))
def test_memory_order_is_a_topological_permutation_that_never_leaves_more_above(seed):
    graph = random_dag(40, seed, max_inputs=4, max_size=50)
    peak = keep_all_peak_bytes(graph)
    workspace = [0] * len(graph)
    ordered, figures, given = memory_order(graph, workspace, int(0.7 * peak), seed=seed)
    assert sorted(n.id for n in ordered.nodes) == sorted(n.id for n in graph.nodes)
    assert _is_topological(ordered)
    assert (figures.excess_bytes, figures.peak_bytes) <= (given.excess_bytes, given.peak_bytes)
    assert given.peak_bytes == peak  # the greedy's sweep counts as the simulator does
    assert figures.peak_bytes == keep_all_peak_bytes(ordered)
    again, _, _ = memory_order(graph, workspace, int(0.7 * peak), seed=seed)
    assert [n.id for n in again.nodes] == [n.id for n in ordered.nodes]  # seeded


def test_random_layered_plan_in_memory_order_replays_on_the_graph_as_given():
    graph = random_layered(300, seed=1)
    given = build_problem(graph, "0.8", order="given")
    ordered = build_problem(graph, "0.8")
    assert ordered.given_graph is graph and given.given_graph is None
    assert ordered.budget_bytes == given.budget_bytes  # a fraction of the given order's peak
    assert keep_all_peak_bytes(ordered.graph) < keep_all_peak_bytes(graph)
    assert ordered.fingerprint() != given.fingerprint()
    plans = {name: solve(p, "heuristic:descent", 20).plan
             for name, p in (("given", given), ("memory", ordered))}
    for name, plan in plans.items():
        assert plan.graph_fingerprint == graph.fingerprint()
        assert plan.problem["order"] == name
        assert ("memory-aware order" in plan.solver["bound_scope"]) == (name == "memory")
        sim = simulate(graph, build_costs(graph), plan.stages)  # the graph as given
        assert sim.peak_bytes <= given.budget_bytes
    # On this graph the order is the larger part of the cost (TDI 4.7% given, 0.0% ordered
    # with descent, measured when written); the test asks only that it does not cost more.
    assert plans["memory"].predicted["tdi_percent"] <= plans["given"].predicted["tdi_percent"]


def test_captured_graphs_keep_their_order():
    graph = random_layered(60, seed=0)
    captured = replace(graph, nodes=[replace(n, attrs={"outputs": [f"t{n.id}"]})
                                     for n in graph.nodes])
    assert captured.replayed and not graph.replayed
    assert build_problem(captured, "0.8").given_graph is None
    with pytest.raises(ValueError, match="captured from a model"):
        build_problem(captured, "0.8", order="memory")
    with pytest.raises(ValueError, match="--order must be one of"):
        build_problem(graph, "0.8", order="fastest")


def test_plan_command_order_option(tmp_path):
    graph = tmp_path / "rl.json"
    random_layered(120, seed=3).save(graph)
    out = cli("plan", "--graph", str(graph), "--budget", "0.8", "--solver", "heuristic:descent",
              "--order", "sideways")
    refused(out, 2, "--order", "auto | given | memory")
    plan = tmp_path / "plan.json"
    done = cli("plan", "--graph", str(graph), "--budget", "0.8", "--solver",
               "heuristic:descent", "-o", str(plan))
    assert done.returncode == 0, done.stderr
    assert "memory-aware order" in done.stdout
    checked = cli("simulate", str(plan), "--graph", str(graph))
    assert checked.returncode == 0, checked.stderr


def _ids(graph: Graph) -> list[int]:
    return [n.id for n in graph.nodes]


@pytest.mark.parametrize("seed", range(3))
def test_order_search_is_topological_seeded_and_never_worse_than_the_greedy(seed):
    graph = random_layered(400, seed=seed)
    workspace = [0] * len(graph)
    budget = int(0.7 * keep_all_peak_bytes(graph))  # at 0.8 the greedy alone fits some seeds
    greedy, greedy_figures, given = memory_order(graph, workspace, budget, seed=seed,
                                                 search_moves=0)
    searched, figures, _ = memory_order(graph, workspace, budget, seed=seed)
    assert sorted(_ids(searched)) == sorted(_ids(graph)) and _is_topological(searched)
    assert (figures.excess_bytes, figures.peak_bytes) <= \
        (greedy_figures.excess_bytes, greedy_figures.peak_bytes)
    assert figures.peak_bytes == keep_all_peak_bytes(searched)  # the sweep is the simulator's
    # On these graphs the search lowers what the greedy leaves above the budget by 40-65%
    # (measured when written: 400 nodes at 0.7, seeds 0-2); ask for a clear gain, not the figure.
    assert figures.excess_bytes < 0.9 * greedy_figures.excess_bytes
    assert figures.excess_bytes < given.excess_bytes
    again, _, _ = memory_order(graph, workspace, budget, seed=seed)
    assert _ids(again) == _ids(searched)  # deterministic for a seed


def test_order_sweep_scores_a_move_as_a_new_sweep_would():
    """The search scores a move on the span it changes; after any sequence of moves the kept
    RAM is the full sweep's, event by event."""
    import random

    graph = random_layered(200, seed=4)
    deps, users = _structure(graph)
    size = [n.out_bytes for n in graph.nodes]
    workspace = [(7 * k) % 50 for k in range(len(graph))]  # workspace counts at its event
    sweep = OrderSweep(list(range(len(graph))), deps, users, size, workspace)
    rng = random.Random(0)
    for _ in range(400):
        v = rng.randrange(len(graph))
        lo, hi = sweep.window(v)
        j = rng.randint(lo, hi)
        if j == sweep.pos[v]:
            continue
        sweep.apply(*sweep.trial(v, j), v)
    order = [int(v) for v in sweep.order]
    position = {v: k for k, v in enumerate(order)}
    assert all(position[d] < position[v] for v in range(len(graph)) for d in deps[v])
    moved = _sweep(graph, workspace, order, 0)
    assert int(sweep.ram.max()) == moved.peak_bytes
    assert int(sweep.ram.sum()) == moved.excess_bytes  # a budget of 0: the sum of RAM


def test_random_layered_plan_in_the_searched_order_replays_and_counts_its_time():
    graph = random_layered(400, seed=2)
    problem = build_problem(graph, "0.8")
    assert problem.given_graph is graph and problem.order_s > 0
    plan = solve(problem, "heuristic:descent", 20).plan
    assert plan.graph_fingerprint == graph.fingerprint()
    assert plan.problem["order"] == "memory" and plan.problem["order_s"] > 0
    assert plan.solver["first_plan_s"] >= problem.order_s  # the order's time is the plan's
    sim = simulate(graph, build_costs(graph), plan.stages)  # the graph as given
    assert sim.peak_bytes <= problem.budget_bytes


def test_the_order_search_keeps_to_the_time_it_is_given():
    graph = random_layered(1000, seed=2)
    quick = build_problem(graph, "0.8", order_time_s=0.05)  # the greedy's first try, no search
    assert quick.given_graph is graph and _is_topological(quick.graph)
    assert quick.order_s < 1.5  # a sweep and a rebuild of the costs besides the cap
