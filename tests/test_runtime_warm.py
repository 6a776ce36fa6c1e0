"""What the ops' first calls leave to the process (oneDNN's primitives, kernel caches) is fixed
memory from the first step on, which the runtime baseline (taken before it) does not hold. The
op profiler measures it per op (`persistent_bytes`); a profile carries it; build_costs sums it
over the graph's distinct ops, and from there the simulator, the planner's fixed memory (plain
peak, fractional budgets, smallest budget), the plan (`problem.runtime_warm_bytes`) and the run
report (its planned peak and the `runtime_warm` class) agree on it."""

from __future__ import annotations

import json

import pytest

from edge_remat.planner.build import build_problem, plain_peak_bytes
from edge_remat.planner.solve import solve
from edge_remat_agent.capture import capture_model
from edge_remat_agent.costs import build_costs, plan_costs
from edge_remat_agent.executor.run import run_plan
from edge_remat_agent.formats import FormatError, Graph, Node, plan_from_dict
from edge_remat_agent.formats.profile import OpCost, Profile, profile_from_dict
from edge_remat_agent.profiler.ops import NodeMeasurement, ops_from
from edge_remat_agent.simulate import simulate

FIXED = 1000


def chain() -> Graph:
    """Two convolutions with the same signature (one primitive), a loss and a backward."""
    return Graph([
        Node("a", "a", "forward", "a", [], 100, time_s=1.0),
        Node("c1", "c1", "forward", "convolution", ["a"], 50, time_s=1.0, signature="conv:s"),
        Node("c2", "c2", "forward", "convolution", ["c1"], 50, time_s=1.0, signature="conv:s"),
        Node("loss", "loss", "loss", "loss", ["c2"], 1, time_s=1.0),
        Node("bw", "bw", "backward", "convolution_backward", ["loss", "a"], 100, time_s=1.0),
    ], name="chain", fixed_bytes=FIXED)


def profile(**persistent: int) -> Profile:
    ops = {key: OpCost(time_s=1.0) for key in ("a", "conv:s", "loss", "convolution_backward",
                                               "elsewhere")}
    for key, nbytes in persistent.items():
        ops[key.replace("_s", ":s")].persistent_bytes = nbytes
    return Profile("measured", {}, idle_w=0.0, active_w=1.0, ops=ops, name="board")


def test_costs_sum_it_over_the_graphs_distinct_ops_only():
    # conv:s serves two nodes but was paid once; an op the graph does not use is not counted
    costs = build_costs(chain(), profile(conv_s=300, convolution_backward=20, elsewhere=5000))
    assert costs.runtime_warm_bytes == 320
    assert costs.describe()["runtime_warm_bytes"] == 320
    assert build_costs(chain()).runtime_warm_bytes == 0
    assert build_costs(chain(), profile()).runtime_warm_bytes == 0


def test_the_simulator_and_the_planners_fixed_memory_count_it():
    graph, measured = chain(), profile(conv_s=300)
    plain = plain_peak_bytes(graph)
    assert plain_peak_bytes(graph, measured) == plain + 300  # a fraction is of this peak
    assert build_problem(graph, "1.0", measured).budget_bytes == plain + 300
    p = build_problem(graph, 2**40, measured)
    assert p.fixed == FIXED + 300
    assert p.smallest_budget()[0] == build_problem(graph, 2**40).smallest_budget()[0] + 300
    plan = solve(p, "auto", time_limit=5).plan
    assert plan.problem["runtime_warm_bytes"] == 300 and plan.problem["fixed_bytes"] == FIXED + 300
    assert plan.predicted["peak_bytes"] == plain + 300
    # replayed without the profile, the plan's own figure counts (plan_costs), also after a
    # round trip through its file format
    again = plan_from_dict(json.loads(json.dumps(plan.to_dict())))
    assert again.runtime_warm_bytes == 300
    assert simulate(graph, plan_costs(graph, again), again.stages).peak_bytes == plain + 300


def test_a_refused_budget_names_it_apart_from_the_graphs_fixed_memory():
    """'plus 1300 bytes of fixed memory' where the graph's fixed memory is 1000: the rest is
    what the profile says the runtime's first calls keep (QA: 8,587,592 bytes said for a
    graph of 99 KiB)."""
    from edge_remat.planner.problem import InfeasibleBudget
    with pytest.raises(InfeasibleBudget) as refused:
        build_problem(chain(), FIXED + 10, profile(conv_s=300)).check_budget()
    assert (f"plus {FIXED + 300} bytes of fixed memory ({FIXED} the graph's, 300 what the "
            "runtime's first calls keep, from the profile)") in str(refused.value)
    with pytest.raises(InfeasibleBudget) as refused:
        build_problem(chain(), FIXED + 10).check_budget()
    assert f"plus {FIXED} bytes of fixed memory" in str(refused.value)
    assert "runtime" not in str(refused.value)


def test_the_profile_format_carries_it_and_refuses_a_bad_value():
    measured = profile(conv_s=300)
    loaded = profile_from_dict(json.loads(json.dumps(measured.to_dict())))
    assert loaded.ops["conv:s"].persistent_bytes == 300
    assert loaded.ops["a"].persistent_bytes is None
    data = measured.to_dict()
    data["ops"]["conv:s"]["persistent_bytes"] = -4
    with pytest.raises(FormatError, match="persistent_bytes"):
        profile_from_dict(data)


def test_a_plan_with_a_bad_figure_is_refused_in_one_line():
    plan = solve(build_problem(chain(), 2**40, profile(conv_s=300)), "auto", time_limit=5).plan
    data = plan.to_dict()
    data["problem"]["runtime_warm_bytes"] = "lots"
    with pytest.raises(FormatError, match="runtime_warm_bytes"):
        plan_from_dict(data)


def test_ops_from_sums_what_the_nodes_of_one_op_left():
    rows = [NodeMeasurement(f"n{i}", f"n{i}", "forward", "conv:s", 1.0, 1, 8, 0,
                            persistent_bytes=b) for i, b in enumerate((4096, 0, None))]
    rows.append(NodeMeasurement("x", "x", "forward", "relu", 1.0, 1, 8, 0))
    ops = ops_from(rows)
    assert ops["conv:s"].persistent_bytes == 4096
    assert ops["relu"].persistent_bytes is None


def test_a_run_reports_it_as_planned_memory_of_its_own_class(tmp_path):
    """A real run (digits-cnn, two steps) of a plan made with a profile that says its
    convolutions' first calls left 3 MiB: the report's planned peak counts it and its class
    holds it; the ledger (tensors only) does not."""
    captured = capture_model("digits-cnn", batch=4, image=8)
    graph = captured.graph
    keys = {n.signature or n.op for n in graph.nodes}
    conv = next(k for k in keys if k.startswith("convolution"))
    warm = 3 * 2**20
    measured = Profile("measured", {}, idle_w=0.0, active_w=1.0, name="board",
                       ops={conv: OpCost(time_s=1e-3, persistent_bytes=warm)})
    plan = solve(build_problem(graph, "1.0", measured), "auto", time_limit=5).plan
    assert plan.runtime_warm_bytes == warm
    report = run_plan(graph, plan, 2, str(tmp_path / "pages"), captured=captured, seed=0)
    split = report["memory_by_class"]
    assert split["planned"]["runtime_warm"] == warm and split["measured"]["runtime_warm"] == 0
    assert sum(split["planned"].values()) == report["predicted_peak_bytes"]
    assert report["predicted_peak_bytes"] <= plan.budget_bytes
    assert all(s["ledger_peak_bytes"] <= report["predicted_peak_bytes"] - warm
               for s in report["steps"])


# In a fresh process: the warm-up memory a profile of MODEL's graph (module or operator
# level) charges it, or what its first plain step, run node by node as a run's is, left in
# anonymous memory beyond the optimizer state it made (the reference).
_WARM_PROBE = """
import json, sys
from edge_remat_agent.capture import capture_model
from edge_remat_agent.costs import build_costs
from edge_remat_agent.executor.updates import make_optimizer
from edge_remat_agent.formats.profile import Profile
from edge_remat_agent.profiler import ops
from edge_remat_agent.profiler.first_step import state_bytes
from edge_remat_agent.profiler.memory import anonymous_resident_bytes
what, level = sys.argv[1], sys.argv[2] == "operator"
captured = capture_model("digits-cnn", operator_level=level)
if what == "planned":  # a planned run's first step (executor/node_timing.py)
    from edge_remat.planner.build import build_problem
    from edge_remat.planner.solve import solve
    from edge_remat_agent.executor.run import run_plan
    plan = solve(build_problem(captured.graph, "0.7", None), "auto", time_limit=5).plan
    report = run_plan(captured.graph, plan, 2, None, captured=captured, check_gradients=False,
                      time_nodes=1)
    print(json.dumps(sum(share or 0 for share in report["node_times"]["persistent_bytes"])))
elif what == "profile":
    nodes = ops.measure_nodes(captured, min_window_s=0.001, context_steps=0,
                              allocator_pass=False)
    profile = Profile("measured", {}, idle_w=0.0, active_w=1.0, name="board",
                      ops=ops.ops_from(nodes))
    print(json.dumps(build_costs(captured.graph, profile).runtime_warm_bytes))
else:
    runner, module, _, _ = ops._runner_for(captured, None, True, False)
    optimizer = make_optimizer(captured.graph, module, None, None, None)
    start = anonymous_resident_bytes()
    ops.time_in_context(runner, module, optimizer, captured.example_args, 1)
    print(json.dumps(anonymous_resident_bytes() - start - state_bytes(optimizer)))
"""


def _in_a_fresh_process(what: str, level: str) -> int | None:
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-c", _WARM_PROBE, what, level],
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def plain_first_step():
    """What a plain first step leaves at each level (_in_a_fresh_process("step", LEVEL)),
    measured once for both tests below: the reference each starts its range from."""
    return {level: _in_a_fresh_process("step", level) for level in ("module", "operator")}


@pytest.mark.slow
def test_a_profile_charges_what_the_first_step_leaves_at_either_level(plain_first_step):
    """A profile charges what a plain first step, run node by node at the profile's level,
    leaves (digits-cnn b256 here: 0.64-0.68 MB beyond the optimizer state at module level,
    0.81-0.83 MB at operator level, in three rounds of fresh processes: the operator-level
    runner keeps more of its own). Each node's own rise around its first call, clipped at
    zero and summed, charged 0.52 MB of it once (and, in `run`'s profiles, gpt-tiny 0.78 MiB
    at module level, 1.18 MiB at operator level: more nodes, more pages of noise summed);
    the profile now charges the first step's measured whole, split over its nodes (0.73-0.76
    MB at module level, 0.79-0.81 MB at operator level, in the same rounds). Compared with
    the module-level step, the operator-level charge missed the 20% range in CI (792-816
    against 636-649 KB): the reference is the step at the same level."""
    if plain_first_step["module"] is None:
        pytest.skip("no RssAnon in /proc/self/status here")
    for level in ("module", "operator"):
        references = [plain_first_step[level]]
        assert references[0] > 256 * 1024
        charged = _measured_within("profile", level, references)
        assert _within(charged[-1], references), (level, charged, references)


@pytest.mark.slow
def test_a_planned_runs_first_step_measures_what_a_plain_one_leaves(plain_first_step):
    """A board without room for a plain step measures the warm-up in its planned run's first
    step (node_timing.py): the same ATen calls, some of them twice (recomputed), leave what a
    plain first step leaves, and the executor keeps some of its own beside it (a second
    run_plan in one process, its ops warm, measured 96-108 KB; digits-cnn's planned first
    step 874-878 KB against 698-739 KB of a plain one, in three pairs of fresh processes)."""
    references = [plain_first_step["module"]]
    if references[0] is None:
        pytest.skip("no RssAnon in /proc/self/status here")
    charged = _measured_within("planned", "module", references, executors=EXECUTOR_KEEPS)
    assert _within(charged[-1], references, executors=EXECUTOR_KEEPS), (charged, references)


EXECUTOR_KEEPS = 256 * 1024  # what a planned run's own first step may keep beyond the ops'
TRIES = 3


def _measured_within(what: str, level: str, references: list[int],
                     executors: int = 0) -> list[int]:
    """WHAT at LEVEL measured in fresh processes until one falls within the references' range,
    at most TRIES times: one process's figure varies from the next by pages (808 against 673
    KB once beside the suite's other worker; 886 against 718 and 710 KB in CI), so each miss
    measures a plain step again too, widening the range, and measures WHAT again. Returns
    every figure measured, the last one the verdict's."""
    charged = [_in_a_fresh_process(what, level)]
    while not _within(charged[-1], references, executors=executors) and len(charged) < TRIES:
        references.append(_in_a_fresh_process("step", level))
        charged.append(_in_a_fresh_process(what, level))
    return charged


def _within(charged: int, references: list[int], share: float = 0.2,
            executors: int = 0) -> bool:
    """charged within `share` of the range the references span (and `executors` above it)."""
    return (1 - share) * min(references) <= charged <= (1 + share) * max(references) + executors


def test_the_first_steps_memory_is_split_to_the_byte():
    from edge_remat_agent.profiler.first_step import split_in_proportion
    shares = split_in_proportion(1001, {"a": 1, "b": 1, "c": 1, "d": 0})
    assert sum(shares.values()) == 1001 and shares["d"] == 0
    assert sorted(shares.values()) == [0, 333, 334, 334]
    assert split_in_proportion(500, {"a": 0, "b": 0}) == {"a": 500, "b": 0}
    assert split_in_proportion(0, {"a": 7}) == {"a": 0}
