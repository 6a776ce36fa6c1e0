"""What a step of K micro-passes costs (`--accumulate K`): the plan is one pass, but the
optimizer steps, its state moves and clipping's norms are taken in the last pass only, and
gradient sums homed on flash cross it in some passes only (accumulated_step.py).

The bytes each node is said to move in each pass are checked against what a real planned run
reads from and writes to its parameters' flash store, step by step; the step's time and energy
against the pass's, with the parameters in RAM (where only the update nodes' compute differs,
and each pass sums its gradients); the plan table and the run report give the plan's step.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from helpers.executor_plans import problem_near_floor

from edge_remat_agent.accumulated_step import accumulated_step, pass_transfers
from edge_remat_agent.capture import capture_model
from edge_remat_agent.executor.run import run_plan
from edge_remat_agent.formats import Tier
from edge_remat_agent.formats.graph import CLIP_OP, GROUP_NORMS_OP
from edge_remat_agent.pages.flash import FlashStore
from edge_remat_agent.simulate import simulate
from edge_remat.planner.solve import solve
from edge_remat.reports.report import plan_table
from edge_remat.reports.run_report import build_report

REPO = Path(__file__).resolve().parents[1]
USER_MODEL = f"{REPO / 'examples' / 'my_model.py'}:make_model"
FLASH = {"flash": Tier(read_bytes_per_s=5e8, write_bytes_per_s=2e8, latency_s=1e-4)}
HOME_KEYS = ("param", "state", "sum")  # ParameterHome's keys; activation pages are node ids
K = 3


def _plan(home: str, clip: float | None, k: int = K):
    captured = capture_model(USER_MODEL, optimizer="adamw", params_home=home, batch=4,
                             image=16, refined=False, accumulate=k, clip_grad_norm=clip)
    problem = problem_near_floor(captured.graph, 1.0, "none", FLASH)
    return captured, problem, solve(problem, "heuristic:split", time_limit=10)


class _HomeTraffic:
    """The bytes a real FlashStore reads and writes under the parameters' home keys, counted
    around its own get_many and put_many (which run as they are; get and put go through
    them)."""

    def __init__(self, monkeypatch):
        self.read = self.written = 0
        get_many, put_many = FlashStore.get_many, FlashStore.put_many

        def home(key) -> bool:
            return isinstance(key, tuple) and key[0] in HOME_KEYS

        def counted_get(store, keys):
            tensors = get_many(store, keys)
            self.read += sum(t.numel() * t.element_size()
                             for key, t in zip(keys, tensors) if home(key))
            return tensors

        def counted_put(store, items):
            self.written += sum(t.numel() * t.element_size() for key, t in items if home(key))
            return put_many(store, items)
        monkeypatch.setattr(FlashStore, "get_many", counted_get)
        monkeypatch.setattr(FlashStore, "put_many", counted_put)


@pytest.mark.parametrize("clip", [None, 1.0], ids=["no-clip", "clip"])
def test_each_pass_moves_the_bytes_a_run_moves_on_its_parameters_home(clip, tmp_path,
                                                                      monkeypatch):
    captured, _, report = _plan("flash", clip)
    graph = captured.graph
    said_read = sum(pass_transfers(n, K, j)[0] for n in graph.nodes for j in range(K))
    said_written = sum(pass_transfers(n, K, j)[1] for n in graph.nodes for j in range(K))
    # the plan's one pass, K times: what accumulated_step corrects
    assert K * sum(n.attrs["io"]["read_bytes"] for n in graph.nodes if "io" in n.attrs) \
        > said_read
    traffic, per_step = _HomeTraffic(monkeypatch), []
    run_plan(graph, report.plan, 3, str(tmp_path / "pages"), data="example",
             captured=captured, seed=0,
             progress=lambda i, steps, record: per_step.append((traffic.read, traffic.written)))
    # step 1 is the checked one (its sums go home for the check, which reads them back)
    moved = [(b[0] - a[0], b[1] - a[1]) for a, b in zip(per_step, per_step[1:])]
    assert moved == [(said_read, said_written)] * 2, (moved, said_read, said_written)


def _update_like(graph):
    return [i for i, n in enumerate(graph.nodes)
            if n.kind == "update" or n.op in (GROUP_NORMS_OP, CLIP_OP)]


@pytest.mark.parametrize("clip", [None, 1.0], ids=["no-clip", "clip"])
def test_with_parameters_in_ram_the_step_counts_the_optimizer_once(clip):
    captured, problem, report = _plan("ram", clip)
    plan, costs = report.plan, problem.costs
    sim = simulate(problem.graph, costs, plan.stages, plan.budget_bytes)
    once = _update_like(problem.graph)
    assert once and all(c == 1 for c in Counter(
        problem.graph.index[ins.node] for stage in plan.stages for ins in stage
        if ins.op == "compute" and problem.graph.index[ins.node] in once).values())
    step = plan.predicted["accumulated_step"]
    assert step == accumulated_step(problem.graph, costs, plan.stages, sim, K)
    optimizer_s = sum(costs.time_s[i] for i in once)
    optimizer_j = sum(costs.energy_j[i] for i in once)
    # summing each pass's gradients (a copy in the first pass, an add in the others), at the
    # update's own rate per byte moved
    updates = [i for i in once if "update_grads" in problem.graph.nodes[i].attrs]
    moved = {i: (2 + 3 * (K - 1)) * problem.graph.nodes[i].attrs["grad_bytes"]
             / problem.graph.nodes[i].attrs["bytes_moved"] for i in updates}
    summing_s = sum(moved[i] * costs.time_s[i] for i in updates)
    summing_j = sum(moved[i] * costs.energy_j[i] for i in updates)
    assert optimizer_s > 0 and 0 < summing_s < optimizer_s * K
    assert step["micro_batches"] == K
    assert step["time_s"] == pytest.approx(K * sim.time_s - (K - 1) * optimizer_s + summing_s)
    assert step["energy_j"] == pytest.approx(
        K * (sim.energy_compute_j + sim.energy_paging_j) - (K - 1) * optimizer_j + summing_j
        + costs.static_w * step["time_s"])
    assert accumulated_step(problem.graph, costs, plan.stages, sim, 1) is None


def test_the_plan_table_and_the_run_report_give_the_plans_step_and_older_plans_k_passes():
    _, _, report = _plan("flash", None)
    plan = report.plan.to_dict()
    step = plan["predicted"]["accumulated_step"]
    assert step["time_s"] < K * plan["predicted"]["time_s"]  # the state moves once
    args = dict(mode="planned", status="ok", device="local", model="m", steps=1, result=None,
                micro_batches=K)
    made = build_report(plan=plan, **args)
    assert (made["predicted_time_s"], made["predicted_energy_j"]) == \
        (step["time_s"], step["energy_j"])
    row = next(line for line in plan_table(plan).splitlines() if line.startswith("a step"))
    assert f"{step['time_s']:.4g} s" in row and f"{K} micro-passes" in row
    del plan["predicted"]["accumulated_step"]  # a plan written before plans said it
    assert "a step" not in plan_table(plan)
    older = build_report(plan=plan, **args)
    assert older["predicted_time_s"] == K * plan["predicted"]["time_s"]
