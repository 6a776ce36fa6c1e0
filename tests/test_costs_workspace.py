"""A profile's measured workspace (the allocator's peak: scratch inside kernels included) enters
the memory model in one place, build_costs, and from there the simulator, the planner's Problem
(plain peak, smallest feasible budget) and every solver agree on it; the graph stays as it is."""

from __future__ import annotations

import pytest

from edge_remat.planner import isolated
from edge_remat.planner.baselines import keep_all
from edge_remat.planner.build import build_problem, plain_peak_bytes
from edge_remat.planner.cpsat import solve_cpsat
from edge_remat.planner.evaluate import evaluate
from edge_remat.planner.milp import solve_milp
from edge_remat.planner.problem import InfeasibleBudget, Problem
from edge_remat_agent.costs import build_costs
from edge_remat_agent.formats import Graph, Node
from edge_remat_agent.formats.profile import OpCost, Profile
from edge_remat_agent.simulate import simulate

FIXED = 1000


def tiny() -> Graph:
    """a -> conv (workspace 100) -> loss -> conv.backward (reads loss and a)."""
    return Graph([
        Node("a", "a", "forward", "a", [], 100, time_s=1.0),
        Node("conv", "conv", "forward", "convolution", ["a"], 50, workspace_bytes=100,
             time_s=1.0, signature="convolution:sig"),
        Node("loss", "loss", "loss", "loss", ["conv"], 1, time_s=1.0),
        Node("convbw", "conv.backward", "backward", "convolution_backward", ["loss", "a"], 100,
             time_s=1.0),
    ], name="tiny", fixed_bytes=FIXED)


def profile(**workspace: int) -> Profile:
    """Measured ops for tiny(): `workspace` by profile key (signature, else op)."""
    ops = {key: OpCost(time_s=1.0) for key in ("a", "convolution:sig", "loss",
                                               "convolution_backward")}
    for key, nbytes in workspace.items():
        ops[key.replace("_sig", ":sig")].workspace_bytes = nbytes
    return Profile("measured", {}, idle_w=0.0, active_w=1.0, ops=ops, name="board")


def test_a_profiles_workspace_overrides_the_graphs_by_signature_and_says_so():
    graph = tiny()
    before = graph.to_dict()
    costs = build_costs(graph, profile(convolution_sig=300, convolution_backward=7))
    assert costs.workspace(graph) == [0, 300, 0, 7]
    assert costs.workspace_source == "profile:board for 2/4 nodes"
    assert costs.describe()["workspace_source"] == costs.workspace_source
    assert graph.to_dict() == before  # the graph file is not touched
    assert build_costs(graph).workspace(graph) == [0, 100, 0, 0]
    assert build_costs(graph).workspace_source == "graph"
    # An op with a time but no workspace keeps the graph's.
    assert build_costs(graph, profile()).workspace(graph) == [0, 100, 0, 0]


def test_a_larger_workspace_raises_the_simulated_peak_by_the_difference():
    graph = tiny()
    # Plain: the peak is the conv's compute: a + conv + workspace + fixed.
    assert plain_peak_bytes(graph) == FIXED + 100 + 50 + 100
    measured = profile(convolution_sig=300)
    assert plain_peak_bytes(graph, measured) == FIXED + 100 + 50 + 300

    p = Problem(graph, build_costs(graph), budget_bytes=2**62)
    stages = evaluate(p, keep_all(p)).stages  # one plan, simulated under both cost models
    graph_peak = simulate(graph, build_costs(graph), stages).peak_bytes
    profile_peak = simulate(graph, build_costs(graph, measured), stages).peak_bytes
    assert profile_peak - graph_peak == 300 - 100

    # The smallest feasible budget: the conv's input, output and workspace at once.
    assert p.smallest_budget() == (FIXED + 100 + 50 + 100, 1)
    q = build_problem(graph, 2**40, measured)
    assert q.workspace == [0, 300, 0, 0] and q.smallest_budget() == (FIXED + 450, 1)
    # A fractional budget is of the plain peak with the profile's workspace.
    assert build_problem(graph, "1.0", measured).budget_bytes == FIXED + 450
    assert build_problem(graph, "1.0").budget_bytes == FIXED + 250
    with pytest.raises(InfeasibleBudget) as caught:
        build_problem(graph, FIXED + 449, measured).check_budget()
    assert caught.value.smallest_bytes == FIXED + 450
    build_problem(graph, FIXED + 449).check_budget()  # the graph's workspace fits


def chain() -> Graph:
    """f0 -> f1 -> big (workspace from the profile) -> loss -> b2 (reads f1) -> b1 (reads f0):
    with a large workspace on `big`, fitting means dropping f0 and computing it again."""
    return Graph([
        Node("f0", "f0", "forward", "f0", [], 100, time_s=1.0),
        Node("f1", "f1", "forward", "f1", ["f0"], 100, time_s=1.0),
        Node("big", "big", "forward", "big", ["f1"], 10, time_s=1.0),
        Node("loss", "loss", "loss", "loss", ["big"], 1, time_s=1.0),
        Node("b2", "b2", "backward", "b2", ["loss", "f1"], 10, time_s=1.0),
        Node("b1", "b1", "backward", "b1", ["b2", "f0"], 10, time_s=1.0),
    ], name="chain")


@pytest.mark.parametrize("solver", ["cpsat", "milp"])
def test_solvers_plan_with_the_profiles_workspace(solver):
    graph = chain()
    ops = {n.op: OpCost(time_s=1.0) for n in graph.nodes}
    ops["big"].workspace_bytes = 100
    measured = Profile("measured", {}, idle_w=0.0, active_w=1.0, ops=ops, name="board")
    assert plain_peak_bytes(graph) == 211 and plain_peak_bytes(graph, measured) == 310
    p = build_problem(graph, 250, measured)  # the plain schedule fits the graph's figures only
    if solver == "cpsat":
        decisions = isolated.call("ortools", solve_cpsat, p, 20, workers=1).decisions
    else:
        decisions = solve_milp(p, time_limit=20, threads=1).decisions
    assert decisions is not None
    result = evaluate(p, decisions)
    assert result.fits_budget and result.sim.recomputed >= 1
    assert result.sim.peak_bytes <= 250


def test_a_runs_plan_by_class_adds_up_to_the_peak_the_profile_gave_it():
    """The board replays a plan with the graph's costs (it has no profile), and its memory by
    class at the peak added up to another peak than the plan's (QA: 219.0 MiB beside 226.78
    MiB): the host replaces it with the replay under the profile the plan was made with."""
    from edge_remat.planner.solve import solve
    from edge_remat.run.orchestrate import _planned_split_with
    graph, measured = tiny(), profile(convolution_sig=300)
    plan = solve(build_problem(graph, "100%", measured), "auto", time_limit=5).plan.to_dict()
    outcome = {"result": {"memory_by_class": {"planned": {"activations": 0}}}}
    _planned_split_with(measured, outcome, graph, plan)
    split = outcome["result"]["memory_by_class"]["planned"]
    assert sum(split.values()) == plan["predicted"]["peak_bytes"]
    assert split["workspace"] == 300
