"""Recomputation stays exact for models the earlier rounds did not try: random ops beyond
dropout (RReLU in training mode replays its noise) and fused updates (a parameter reader is never
computed again after its update has stepped the weights, whatever the solver decided)."""

from __future__ import annotations

import re
import time

import pytest
import torch

from helpers.executor_plans import every_forward_recomputed, keep_all, problem_near_floor
from helpers.user_models import spec as user_model
from edge_remat_agent.capture import CaptureError, capture_model, capture_module
from edge_remat_agent.executor.run import run_plan
from edge_remat_agent.formats import Graph, Instruction, Node, Plan
from edge_remat_agent.simulate import PlanError, simulate
from edge_remat_agent.costs import build_costs
from edge_remat.planner.baselines import BASELINES
from edge_remat.planner.build import build_problem
from edge_remat.planner.evaluate import evaluate

pytestmark = pytest.mark.slow


def test_rrelu_in_training_mode_replays_its_noise_when_recomputed(tmp_path):
    captured = capture_model(user_model("make_rrelu"))
    rrelu = [n for n in captured.graph.nodes if "rrelu_with_noise_functional" in
             n.attrs.get("ops", [])]
    assert rrelu and all(n.attrs.get("random") for n in rrelu)
    report = run_plan(captured.graph, every_forward_recomputed(captured.graph), 2,
                      str(tmp_path / "pages"), captured=captured, seed=0)
    assert report["grad_check"]["bitwise_equal"], report["grad_check"]["differing"]


def test_linalg_solve_cholesky_and_inv_capture_and_recompute_exactly(tmp_path):
    """They run `_linalg_check_errors`, which AOTAutograd orders by an effect token: capture
    refused it with 'unexpected graph input primals_1 (ForwardTokenAOTInput(idx=0))'."""
    captured = capture_model(user_model("make_gaussian"), operator_level=True)
    report = run_plan(captured.graph, every_forward_recomputed(captured.graph), 2,
                      str(tmp_path / "pages"), captured=captured, seed=0)
    assert report["recomputed"] > 0
    assert report["grad_check"]["bitwise_equal"], report["grad_check"]["differing"]


def test_a_singular_matrix_raises_in_the_planned_step_as_in_eager(tmp_path):
    """The unwrapped check still runs: a singular solve is eager's error, not garbage."""
    captured = capture_model(user_model("make_singular_solve"))
    with pytest.raises(Exception, match="input matrix is singular"):
        run_plan(captured.graph, keep_all(captured.graph), 1, str(tmp_path / "pages"),
                 captured=captured, check_gradients=False)


def test_a_prod_trained_through_is_refused_naming_op_and_module():
    """Its traced backward is the zero-safe formula, eager's `grad * (result / input)` when
    the input holds no zero: the gradient check failed (a.weight off by 2e-7 to 2e-4)."""
    with pytest.raises(CaptureError) as info:
        capture_model(user_model("make_trained_prod"))
    assert (info.value.op, info.value.module) == ("aten.prod.dim_int", "inner")
    assert "cumprod" in str(info.value)


def test_a_prod_outside_the_gradient_and_the_suggested_cumprod_run_exactly(tmp_path):
    captured = capture_model(user_model("make_untrained_prod"))
    report = run_plan(captured.graph, every_forward_recomputed(captured.graph), 2,
                      str(tmp_path / "pages"), captured=captured, seed=0)
    assert report["grad_check"]["bitwise_equal"], report["grad_check"]["differing"]


@pytest.mark.parametrize("operator_level", [False, True])
def test_a_gradient_viewing_a_view_of_another_nodes_value_runs_exactly(operator_level, tmp_path):
    """functional_call's weight offset gets `t(t(mm))`: the gradient moved to mm's node, its
    inner transpose stayed behind, so the node replayed `t(mm)` before computing mm and the
    run failed with "KeyError: 'mm'" at every budget."""
    captured = capture_model(user_model("make_functional_call"), operator_level=operator_level)
    report = run_plan(captured.graph, every_forward_recomputed(captured.graph), 2,
                      str(tmp_path / "pages"), captured=captured, seed=0)
    assert report["grad_check"]["bitwise_equal"], report["grad_check"]["differing"]


def _near_floor(graph):
    return problem_near_floor(graph, 0.5)


def test_a_parameter_reader_is_kept_not_recomputed_after_its_update(tmp_path):
    """The split heuristic, near the floor of an MLP with a hard Gumbel-softmax, frees a
    backward `mm` that reads a layer's weight and recomputes it for a user after that layer's
    update: it computed from the stepped weights (a.weight's gradient off by 1e-5). Lowering
    keeps the value from before the update instead."""
    captured = capture_model(user_model("make_hard_gumbel"), operator_level=True)
    p = _near_floor(captured.graph)
    decisions = BASELINES["split"](p)
    nodes = captured.graph.nodes
    updates = [u for u, node in enumerate(nodes) if node.kind == "update"]
    assert [i for t, d in enumerate(decisions) for i in d.compute[:-1]
            if nodes[i].kind == "backward" and any(i < u < t for u in updates)]
    evaluation = evaluate(p, decisions)
    plan = Plan(evaluation.stages, captured.graph.fingerprint(), 2**62,
                predicted=evaluation.sim.summary())
    report = run_plan(captured.graph, plan, 2, str(tmp_path / "pages"), captured=captured,
                      seed=0)
    assert report["grad_check"]["bitwise_equal"], report["grad_check"]["differing"]


def test_the_simulator_refuses_a_plan_that_recomputes_a_reader_after_its_update():
    graph = capture_model(user_model("make_hard_gumbel"), operator_level=True).graph
    reader = next(n for n in graph.nodes if n.name == "b.backward:mm")  # reads b.weight
    update = next(n for n in graph.nodes if n.kind == "update" and n.name.startswith("b:"))
    stages = keep_all(graph).stages + [[Instruction("free", reader.id),
                                        Instruction("compute", reader.id)]]
    with pytest.raises(PlanError, match=f"update node {update.id!r} has already stepped"):
        simulate(graph, build_costs(graph, None), stages)


def test_the_budget_a_no_plan_error_suggests_plans():
    """The suggested budget is one the feasibility phase's plan fits once replayed: lowering
    can keep a parameter reader past its update, which the heuristic does not count (the
    parametrized model, operator level, suggested 29,211 B, where it found none)."""
    from edge_remat.planner.solve import _budget_found_hint, solve
    graph = capture_model(user_model("make_parametrized"), operator_level=True).graph
    hint = _budget_found_hint(_near_floor(graph), time.perf_counter() + 60).text
    budget = int(re.search(r"try --budget (\d+)", hint).group(1))
    plan = solve(build_problem(graph, budget, None, "time", None, "none", {}),
                 "heuristic:peak-search").plan
    assert plan.predicted["peak_bytes"] <= budget


@pytest.mark.parametrize("hidden,exact", [(24, False), (48, False), (32, True)])
def test_a_gru_is_captured_only_where_its_gates_round_as_eagers(hidden, exact, tmp_path):
    """Eager CPU GRUs apply sigmoid in place to strided views of their gates; the graph to a
    contiguous sum: rows that are not whole vector loops round differently (hidden 24: 1.5e-8
    off eager's gradients). Those are refused with the cause; the others train exactly."""
    from helpers.user_models import make_gru
    module, args = make_gru(hidden)
    if not exact:
        with pytest.raises(CaptureError, match=f"GRU 'gru' has hidden size {hidden}: .* "
                                               "multiple of 32"):
            capture_module(module, args, "gru")
        return
    captured = capture_module(module, args, "gru")
    report = run_plan(captured.graph, every_forward_recomputed(captured.graph), 1,
                      str(tmp_path / "pages"), captured=captured, seed=0)
    assert report["grad_check"]["bitwise_equal"], report["grad_check"]["differing"]


def test_an_op_without_a_deterministic_kernel_is_named_with_what_to_do(tmp_path):
    """nn.MaxUnpool2d has none: the run stopped with PyTorch's advice to turn determinism off,
    which a run cannot follow and stay exact."""
    from edge_remat_agent.executor import BadInput
    from helpers.executor_plans import keep_all as keep_all_plan
    torch.manual_seed(0)
    module, args = Unpooling(), (torch.randn(2, 3, 8, 8),)
    captured = capture_module(module, args, "unpool")
    with pytest.raises(BadInput, match=r"the model runs max_unpooling2d_forward_out, which has "
                                       r"no deterministic kernel on cpu: .* replace it"):
        run_plan(captured.graph, keep_all_plan(captured.graph), 1, str(tmp_path / "pages"),
                 captured=captured, seed=0)


class Unpooling(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        pooled, indices = torch.nn.functional.max_pool2d(self.conv(x), 2, return_indices=True)
        return torch.nn.functional.max_unpool2d(pooled, indices, 2).square().mean()


def _reader_pushed_out_by_its_update() -> Graph:
    """`r` reads a parameter that `u` steps; `u`'s workspace leaves no room to keep `r`, and
    `y` reads `r` after `u`: the one schedule within 150 bytes recomputes `r` after `u`."""
    def node(name, inputs, out, kind="forward", **extra):
        return Node(id=name, name=name, kind=kind, op="op", inputs=inputs, out_bytes=out,
                    time_s=1.0, **extra)
    return Graph([node("x", [], 10), node("r", ["x"], 100),
                  node("u", ["x"], 0, kind="update", workspace_bytes=100,
                       attrs={"param_readers": ["r"]}),
                  node("y", ["r"], 10)], name="reader-and-update")


def test_the_lns_window_never_offers_a_reader_after_its_update():
    """The window model's candidates follow the exact solvers' rule: before, `r` was a
    candidate at `y`'s stage, after `u` stepped its weights, and lowering had to undo what
    the window chose."""
    from edge_remat.planner.events import EventSchedule
    from edge_remat.planner.window import candidates_at
    p = build_problem(_reader_pushed_out_by_its_update(), 150, order="given")
    sched = EventSchedule(p)
    assert p.stepped == {1: 2}
    assert 1 not in candidates_at(sched, 3, [])  # before: [0, 1]


def test_the_exact_solvers_never_recompute_a_reader_after_its_update():
    """Their models forbid it. Before, both recomputed `r` after `u` (the only schedule
    within the budget); kept instead, the plan no longer fit and was dropped, or CP-SAT's
    plan stopped the planner ('CP-SAT returned a plan the simulator rejects', exit 70). Near
    the floor of the parametrized model CP-SAT's plan recomputed 3 readers after their
    updates and `solve` found no plan; now it plans within the budget."""
    from edge_remat.planner import isolated
    from edge_remat.planner.cpsat import solve_cpsat
    from edge_remat.planner.milp import solve_milp
    from edge_remat.planner.solve import solve
    p = build_problem(_reader_pushed_out_by_its_update(), 150, order="given")
    assert p.stepped == {1: 2}
    assert isolated.call("ortools", solve_cpsat, p, 20, workers=2).status == "infeasible"
    assert isolated.call("highspy", solve_milp, p, 20, threads=2).status == "infeasible"
    graph = capture_model(user_model("make_parametrized"), operator_level=True).graph
    p = _near_floor(graph)
    plan = solve(p, "cpsat", time_limit=20).plan
    assert plan.predicted["peak_bytes"] <= p.budget_bytes
