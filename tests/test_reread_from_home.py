"""A parameter group already on flash is read again, not written again: Belady's evictor drops
a param node whose group lives at home instead of paging it out, and among plans of equal cost
the planner takes the one that moves fewer bytes (the 1.1B LoRA under 2 GiB wrote 2.85 GB of
its frozen weights to flash a step, and stepped in 16.7 s where reading them again took 9.3 s)."""

from __future__ import annotations

import pytest

from edge_remat.planner.baselines import belady_paging, keep_all
from edge_remat.planner.build import build_problem
from edge_remat.planner.evaluate import evaluate
from edge_remat_agent.capture import capture_model
from edge_remat_agent.executor import run_plan
from edge_remat_agent.formats import Profile, Tier
from edge_remat_agent.simulate import simulate

FLASH = Tier(read_bytes_per_s=4e8, write_bytes_per_s=2e8, latency_s=1e-4)
PROFILE = Profile("measured", {}, idle_w=0.0, active_w=1.0, tiers={"flash": FLASH},
                  name="flash")


def llama():
    return capture_model("llama-tiny-lora", optimizer="adamw", params_home="flash",
                         refined=False)


@pytest.mark.parametrize("io", ["overlap", "sync"])
def test_belady_reads_a_param_node_from_home_again_instead_of_paging_it(io):
    graph = llama().graph
    p = build_problem(graph, 0.45, PROFILE, paging="flash", io=io)
    decisions = belady_paging(p)
    assert decisions is not None
    paged = {i for d in decisions for i, _ in d.page_out}
    again = [i for d in decisions for i in d.compute[:-1] if p.home_reads[i]]
    assert again, "the budget should make it drop some group"
    assert not paged & {i for i in range(p.n) if p.home_reads[i]}
    evaluation = evaluate(p, decisions)
    assert evaluation.fits_budget
    sim = simulate(graph, p.costs, evaluation.stages, io=io)
    assert sim.peak_bytes <= p.budget_bytes


def test_a_plan_that_reads_groups_again_trains_bit_for_bit(tmp_path):
    from edge_remat.planner.solve import solve
    graph = llama().graph
    plan = solve(build_problem(graph, 0.45, PROFILE, paging="flash"), "heuristic:paging").plan
    assert plan.predicted["recomputed"] > 0 and not any(
        graph.node(ins.node).kind == "param" for ins in plan.instructions()
        if ins.op == "page_out")
    report = run_plan(graph, plan, 2, str(tmp_path / "run"), seed=0, captured=llama())
    assert report["grad_check"]["bitwise_equal"]


def test_among_plans_of_equal_cost_the_one_moving_fewer_bytes_ranks_first():
    # A flash so fast that paging hides wholly behind compute: the plain schedule, and the
    # same with a forward output paged out and back, cost the same step.
    fast = Profile("measured", {}, idle_w=0.0, active_w=1.0, name="fast flash",
                   tiers={"flash": Tier(read_bytes_per_s=1e15, write_bytes_per_s=1e15)})
    graph = capture_model("mlp", batch=4, image=8).graph
    p = build_problem(graph, 1.0, fast, paging="flash")
    plain = keep_all(p)
    paged = keep_all(p)
    # a forward output with a gap between two uses: out after the first, back for the next
    node, first = next((i, p.next_use(i, i)) for i, n in enumerate(p.graph.nodes)
                       if n.kind == "forward" and p.next_use(i, i) is not None
                       and (p.next_use(i, p.next_use(i, i)) or 0) > p.next_use(i, i) + 1)
    use = p.next_use(node, first)
    paged[first].keep.discard(node)
    paged[first].page_out.append((node, "flash"))
    for t in range(first + 1, use):
        paged[t].keep.discard(node)
    paged[use].page_in.append((node, "flash"))
    quiet, busy = evaluate(p, plain), evaluate(p, paged)
    assert busy.sim.page_outs == 1 and busy.feasible
    assert busy.objective == pytest.approx(quiet.objective)
    assert quiet.rank < busy.rank
    # an exact solver's plan that ties the plan known before it replaces that one only where
    # it moves no more (solve's CP-SAT and MILP paths): the paging plan does not displace the
    # quiet one, nor itself lose to a plan that pages the same
    assert quiet.replaces(busy) and not busy.replaces(quiet) and busy.replaces(busy)
