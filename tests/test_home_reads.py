"""Param nodes read from their parameters' home on the IO timeline (`page_in` from "home"): the
simulator's semantics, the planner's post-pass and the executor's IO thread."""

from __future__ import annotations

import pytest

from edge_remat.planner.baselines import keep_all
from edge_remat.planner.bounds import stage_lower_bound, with_io_timeline
from edge_remat.planner.build import build_problem
from edge_remat.planner.evaluate import evaluate
from edge_remat.planner.overlap import schedule_io
from edge_remat.planner.solve import solve
from edge_remat_agent.capture import capture_model
from edge_remat_agent.costs import build_costs
from edge_remat_agent.executor import run_plan
from edge_remat_agent.formats import FormatError, Instruction, Profile, Tier, plan_from_dict
from edge_remat_agent.simulate import PlanError, simulate

# A slow flash, so that reading the parameters is most of the step (as on an SD card).
SLOW_FLASH = Tier(read_bytes_per_s=20e6, write_bytes_per_s=10e6, latency_s=1e-4)
PROFILE = Profile("measured", {}, idle_w=0.0, active_w=1.0, tiers={"flash": SLOW_FLASH},
                  name="slow flash")


@pytest.fixture
def mlp():
    """A fresh capture each time: a run moves the module's parameters to their home."""
    return capture_model("mlp", batch=4, image=8, params_home="flash")


def read_from_home(graph, stages):
    """`stages` with each param node's compute as a page_in from home, as the post-pass
    writes it."""
    return [[Instruction("page_in", ins.node, "home")
             if ins.op == "compute" and graph.node(ins.node).read_from_home else ins
             for ins in stage] for stage in stages]


def test_a_read_from_home_costs_what_computing_the_param_node_does(mlp):
    graph = mlp.graph
    costs = build_costs(graph, PROFILE)
    stages = solve(build_problem(graph, 1.0, PROFILE, paging="none", io="sync"),
                   "heuristic:keep-all").plan.stages
    reads = read_from_home(graph, stages)
    params = sum(node.read_from_home for node in graph.nodes)
    assert params > 0
    computed, read = simulate(graph, costs, stages), simulate(graph, costs, reads)
    assert read.home_reads == params and computed.home_reads == 0
    assert (read.computes, read.recomputed) == (computed.computes, computed.recomputed)
    assert read.compute_time_s == pytest.approx(computed.compute_time_s)
    assert read.home_io_time_s == pytest.approx(computed.home_io_time_s)
    assert read.peak_bytes <= computed.peak_bytes
    assert read.page_ins == 0
    # Issued where the compute was, the read runs on the IO timeline: compute waits for it
    # (never faster than the whole read), and hidden behind nothing it is no faster either.
    overlapped = simulate(graph, costs, reads, io="overlap")
    assert overlapped.io_busy_s == pytest.approx(
        sum(costs.time_s[i] for i, node in enumerate(graph.nodes) if node.read_from_home))
    assert overlapped.time_s == pytest.approx(computed.time_s)


def test_only_a_param_node_homed_on_a_tier_is_read_from_home(mlp):
    graph = mlp.graph
    costs = build_costs(graph, PROFILE)
    stages = solve(build_problem(graph, 1.0, PROFILE, paging="none", io="sync"),
                   "heuristic:keep-all").plan.stages
    first = next(ins for stage in stages for ins in stage
                 if ins.op == "compute" and not graph.node(ins.node).read_from_home)
    wrong = [[Instruction("page_in", ins.node, "home") if ins == first else ins
              for ins in stage] for stage in stages]
    with pytest.raises(PlanError, match="only a param node whose parameters live on a page tier"):
        simulate(graph, costs, wrong)
    # After its group's update, a read from home would bring the new weights: refused as a
    # compute there is.
    k, u = next((k, u) for k, u in graph.stepped_by().items()
                if graph.nodes[k].read_from_home)
    param, update = graph.nodes[k].id, graph.nodes[u].id
    late, resident = [list(stage) for stage in read_from_home(graph, stages)], False
    for stage in late:
        for at, ins in enumerate(stage):
            if ins.node == param:
                resident = ins.op != "free"
            if ins == Instruction("compute", update):
                again = [Instruction("page_in", param, "home")]
                stage[at + 1:at + 1] = [Instruction("free", param)] * resident + again
                break
        else:
            continue
        break
    with pytest.raises(PlanError, match="already stepped"):
        simulate(graph, costs, late)


def test_home_is_a_tier_for_page_ins_only():
    base = {"format": "edge-remat/plan", "version": 1, "budget_bytes": 10,
            "stages": [[{"op": "page_in", "node": "w", "tier": "home"}]]}
    assert plan_from_dict(base).stages[0][0] == Instruction("page_in", "w", "home")
    base["stages"] = [[{"op": "page_out", "node": "w", "tier": "home"}]]
    with pytest.raises(FormatError, match="tier"):
        plan_from_dict(base)


def test_the_post_pass_reads_parameters_ahead_and_the_bound_still_holds(mlp):
    graph = mlp.graph
    sync = build_problem(graph, 1.0, PROFILE, paging="none", io="sync")
    overlap = build_problem(graph, 1.0, PROFILE, paging="none", io="overlap")
    assert not sync.overlapped and overlap.overlapped  # no page tier: the reads alone
    planned_sync = evaluate(sync, keep_all(sync))
    planned = evaluate(overlap, keep_all(overlap))
    reads = [ins for stage in planned.stages for ins in stage if ins.tier == "home"]
    assert 0 < len(reads) <= sum(node.read_from_home for node in graph.nodes)
    assert not any(ins.tier == "home" for stage in planned_sync.stages for ins in stage)
    # reads issued ahead of computes before their first use, and the step shorter
    flat = [ins for stage in planned.stages for ins in stage]
    ahead = 0
    for k, ins in enumerate(flat):
        if ins.tier == "home":
            use = next(q for q in range(k + 1, len(flat)) if flat[q].op == "compute"
                       and ins.node in graph.node(flat[q].node).inputs)
            ahead += any(flat[q].op == "compute" for q in range(k + 1, use))
    assert ahead > 0
    assert planned.sim.peak_bytes <= overlap.budget_bytes
    assert planned.sim.time_s < planned_sync.sim.time_s
    # The stage bound no longer counts the reads as compute: below the overlapped step. The
    # reads' time, which one timeline or the other must carry, raises it again.
    bound = stage_lower_bound(overlap)
    assert bound < stage_lower_bound(sync)
    assert bound <= with_io_timeline(overlap, bound) <= planned.sim.time_s * (1 + 1e-9)
    # Where reading takes longer than computing (a LoRA model's frozen base, which no update
    # reads or writes, on a flash 100x slower), the reads alone bound the step above the
    # stage bound; solve() reports that bound.
    slower = Profile("measured", {}, idle_w=0.0, active_w=1.0, name="slower flash",
                     tiers={"flash": Tier(read_bytes_per_s=2e5, write_bytes_per_s=1e5,
                                          latency_s=1e-4)})
    lora = capture_model("llama-tiny-lora", optimizer="adamw", params_home="flash",
                         refined=False).graph
    reading = build_problem(lora, 1.0, slower, paging="none", io="overlap")
    bound = stage_lower_bound(reading)
    plan = solve(reading, "auto", time_limit=5).plan
    assert bound < with_io_timeline(reading, bound) == pytest.approx(plan.solver["lower_bound"])
    assert plan.solver["lower_bound"] <= plan.predicted["time_s"] * (1 + 1e-9)
    assert "reads from home" in plan.solver["bound_scope"]
    # the shortcut's trials place the reads as whole runs do
    assert schedule_io(overlap, planned_sync.stages) == \
        schedule_io(overlap, planned_sync.stages, whole_runs=True)


@pytest.mark.parametrize("paging_io", ["overlap", "sync"])
def test_parameters_read_from_home_train_bitwise_like_eager(mlp, paging_io, tmp_path):
    graph = mlp.graph
    p = build_problem(graph, 0.8, PROFILE, paging="none")
    plan = solve(p, "heuristic:split", time_limit=10).plan
    assert plan.predicted["home_reads"] > 0
    report = run_plan(graph, plan, 2, str(tmp_path / "pages"), captured=mlp,
                      check_gradients=True, paging_io=paging_io)
    assert report["grad_check"]["bitwise_equal"]
    for step in report["steps"]:
        assert step["computes"] == plan.predicted["computes"]
        assert step["recomputed"] == plan.predicted["recomputed"]
        assert step["page_ins"] == 0
        assert step["overlapped"] == (paging_io == "overlap")
        assert (step["home_read_s"] > 0) == (paging_io == "overlap")
        assert step["ledger_peak_bytes"] <= plan.predicted["peak_bytes"]
    # the share of the IO thread's time hidden: its reads from home are that time
    hidden = report["summary"]["paging_hidden_share"]
    assert (hidden is not None and 0.0 <= hidden <= 1.0) == (paging_io == "overlap")


@pytest.mark.parametrize("io", ["overlap", "sync"])
def test_a_frozen_base_on_meta_is_read_ahead_by_the_plan_or_else_by_the_weight_store(io,
                                                                                      tmp_path):
    from edge_remat_agent.executor.stores import open_parameter_home
    captured = capture_model("llama-tiny-lora", optimizer="adamw", params_home="flash",
                             refined=False)
    graph = captured.graph
    plan = solve(build_problem(graph, 0.5, PROFILE, paging="none", io=io),
                 "heuristic:split").plan
    assert (plan.predicted["home_reads"] > 0) == (io == "overlap")
    # A plan made for overlap places its reads from home itself (ahead where that pays),
    # counted in its peak: the weight store reads nothing ahead beside them, outside the
    # plan. A plan made stop-the-world leaves reading ahead to the store, in the order it
    # loads the groups.
    loads = [] if io == "overlap" else [graph.node(ins.node).attrs["params"]
                                         for ins in plan.instructions()
                                         if graph.node(ins.node).kind == "param"
                                         and ins.op == "compute"]
    frozen = {name for name, param in captured.module.named_parameters()
              if not param.requires_grad}
    with open_parameter_home(graph, captured.module, str(tmp_path / "home"), plan=plan) as home:
        assert home.frozen.groups == [[n for n in group if n in frozen] for group in loads
                                      if any(n in frozen for n in group)]
        assert home.frozen.groups or io == "overlap"
    report = run_plan(graph, plan, 2, str(tmp_path / "run"), seed=0,
                      captured=capture_model("llama-tiny-lora", optimizer="adamw",
                                             params_home="flash", refined=False))
    assert report["grad_check"]["bitwise_equal"]
    assert report["weights"]["prefetch_groups"] == (0 if io == "overlap" else 1)


def test_the_run_report_says_how_many_parameter_reads_the_plan_issues_ahead():
    from edge_remat.reports.run_report import build_report, report_text
    step = {"step": 1, "loss": 1.0, "step_time_s": 1.0, "ledger_peak_bytes": 10,
            "rss_peak_bytes": 100}
    report = build_report(mode="planned", status="finished", device="b", model="m", steps=1,
                          result={"steps": [step], "budget_bytes": 20},
                          plan={"budget_bytes": 20, "predicted": {"peak_bytes": 10,
                                                                  "time_s": 1.0,
                                                                  "home_reads": 7}})
    assert report["home_reads"] == 7
    assert "7 parameter reads from home ahead" in report_text(report)


def test_trials_of_reads_from_home_score_what_whole_steps_do():
    """A param node's compute tried as a read from home (in its place, or hoisted) is scored
    from the base's timeline state as page-in moves are: against whole runs of the same
    trials, on random graphs with param nodes homed on flash, the same makespans and the
    same placed plans, never a longer step than the schedule given, some reads kept
    ahead, and the time bound (with the reads the IO timeline must carry) below the step."""
    import random

    from edge_remat.planner import overlap
    from helpers.overlap_schedules import random_paging_schedule
    trials = kept = 0
    for seed in range(16):
        p, stages = random_paging_schedule(seed, homed=True)
        ops = [(overlap.OP_CODES[ins.op], p.graph.index[ins.node], ins.tier)
               for stage in stages for ins in stage]
        base = overlap._makespan(p, ops)
        whole, shortcut = overlap._WholeRuns(p, ops, base), overlap._Trials(p, ops, base)
        rng = random.Random(seed)
        reads = [k for k, op in enumerate(ops) if op[0] == overlap.COMPUTE
                 and p.home_reads[op[1]]]
        for j in rng.sample(reads, min(8, len(reads))):
            read = (overlap.PAGE_IN, ops[j][1], "home")
            for c in [j] + rng.sample(range(j), min(8, j)):
                assert shortcut.score(c, j, read) == pytest.approx(whole.score(c, j, read),
                                                                   rel=1e-12)
                trials += 1
        placed = overlap.schedule_io(p, stages)
        assert placed == overlap.schedule_io(p, stages, whole_runs=True)
        step = overlap._makespan(p, overlap._resolved(p, [(0, ins) for stage in placed
                                                          for ins in stage]))
        assert step <= base
        bound = stage_lower_bound(p)
        assert with_io_timeline(p, bound) <= step * (1 + 1e-9)
        kept += any(ins.tier == "home" for stage in placed for ins in stage)
    assert trials > 20 and kept > 0
