"""Overlapped paging: the IO timeline (simulator), the post-pass that places page-ins and
page-outs for it (planner), and the executor's IO thread, which must train to the same bits as
eager PyTorch and stay within the planned peak."""

from __future__ import annotations

import weakref

import pytest
import torch

from helpers.executor_plans import dtr_plan, with_paging
from helpers.overlap_schedules import (placed_for_overlap, random_paging_problem,
                                       random_paging_schedule)
from helpers.small_graphs import training_chain
from edge_remat.planner.build import build_problem, keep_all_peak_bytes
from edge_remat.planner.evaluate import evaluate
from edge_remat.planner.problem import Problem
from edge_remat.planner.solve import solve
from edge_remat_agent.capture import capture_module
from edge_remat_agent.capture.optimizer import torch_optimizer
from edge_remat_agent.costs import build_costs
from edge_remat_agent.executor import plain_step, run_plan
from edge_remat_agent.formats import Graph, Instruction, Node, Tier
from edge_remat_agent.pages import MemoryStore
from edge_remat_agent.profiler.memory import LiveTensorLedger
from edge_remat_agent.simulate import simulate
from edge_remat_agent.zoo import build

SLOW_FLASH = Tier(read_bytes_per_s=4.0, write_bytes_per_s=4.0, latency_s=0.1)


def chain(n: int = 4, size: int = 4, time_s: float = 1.0, sizes: dict | None = None) -> Graph:
    """n nodes in a line, then one that reads the first and the last; 1 s each."""
    nodes = [Node(id=i, name=f"n{i}", kind="forward", op="op", inputs=[i - 1] if i else [],
                  out_bytes=(sizes or {}).get(i, size), time_s=time_s) for i in range(n)]
    nodes.append(Node(id=n, name="last", kind="forward", op="op", inputs=[0, n - 1],
                      out_bytes=1, time_s=time_s))
    return Graph(nodes, name="chain")


def stages_of(*rows):
    return [[Instruction(*ins) for ins in row] for row in rows]


# -- the timeline ------------------------------------------------------------------------------

def test_a_prefetched_page_hides_behind_compute_a_late_one_does_not():
    graph = chain(sizes={3: 8})  # compute 3 is the peak: the write may be in flight before it
    fast_writes = Tier(read_bytes_per_s=4.0, write_bytes_per_s=1000.0, latency_s=0.1)
    costs = build_costs(graph, None, {"flash": fast_writes})  # 4 bytes: in 1.1 s, out 0.104 s
    late = stages_of([("compute", 0)], [("compute", 1), ("page_out", 0, "flash")],
                     [("compute", 2), ("free", 1)], [("compute", 3), ("free", 2)],
                     [("page_in", 0, "flash"), ("compute", 4), ("free", 0), ("free", 3)])
    early = [list(stage) for stage in late]
    early[4].pop(0)
    early[2].insert(0, Instruction("page_in", 0, "flash"))  # read from 2.104 s to 3.204 s
    sync = simulate(graph, costs, late, io="sync")
    assert sync.time_s == pytest.approx(5 + 1.204)
    waits = simulate(graph, costs, late, io="overlap")
    assert waits.time_s == pytest.approx(5 + 1.1)  # the write hid, the read is waited for
    hidden = simulate(graph, costs, early, io="overlap")
    assert hidden.time_s == pytest.approx(5.0)  # both hidden behind computes 1-3
    assert hidden.paging_hidden_share == pytest.approx(1.0)
    assert hidden.io_busy_s == pytest.approx(1.204) and hidden.io_wait_s == pytest.approx(0.0)
    assert hidden.peak_bytes == simulate(graph, costs, early, io="sync").peak_bytes


def test_a_write_in_flight_holds_its_ram_and_is_waited_for_at_the_peak():
    graph = chain(n=3, size=4)
    costs = build_costs(graph, None, {"flash": SLOW_FLASH})
    stages = stages_of([("compute", 0)], [("compute", 1), ("page_out", 0, "flash")],
                       [("compute", 2), ("free", 1)],
                       [("page_in", 0, "flash"), ("compute", 3), ("free", 0), ("free", 2)])
    sync = simulate(graph, costs, stages, io="sync")
    over = simulate(graph, costs, stages, io="overlap")
    # The write of node 0 runs from 2 s to 3.1 s. Compute 2 with it in flight would hold 12
    # bytes, over the peak (9, at compute 3): it waits for the write; the page-in, issued at
    # 4.1 s, is waited for by compute 3. Without the wait it would end at 5.1 s.
    assert over.peak_bytes == sync.peak_bytes == 9
    assert over.time_s == pytest.approx(6.2) and sync.time_s == pytest.approx(6.2)
    assert over.io_wait_s == pytest.approx(2.2)


@pytest.mark.parametrize("seed", range(6))
def test_the_post_pass_keeps_the_budget_and_never_slows_a_schedule(seed):
    graph = training_chain(10, seed)
    s = placed_for_overlap(graph, build_costs(graph, None, {"flash": SLOW_FLASH}), seed)
    after = s.after  # also: a valid plan
    assert after.fits_budget
    assert after.time_s <= s.before.time_s * (1 + 1e-9)
    assert s.before.time_s <= s.sync.evaluation.sim.time_s * (1 + 1e-9)
    assert sorted(map(str, sum(s.placed, []))) == sorted(map(str, sum(s.stages, [])))
    ev = evaluate(s.over_p, s.sync.decisions)
    assert ev.sim.time_s == pytest.approx(after.time_s) and ev.sim.io == "overlap"


def test_overlapped_plans_report_a_bound_valid_for_overlap():
    graph = training_chain(10, 1)
    costs = build_costs(graph, None, {"flash": SLOW_FLASH})
    budget = int(keep_all_peak_bytes(graph) * 0.6)
    p = Problem(graph, costs, budget, "time", None, ("flash",), "counted", None, "overlap")
    plan = solve(p, "auto", time_limit=5).plan
    assert plan.problem["io"] == "overlap" and plan.predicted["io"] == "overlap"
    assert plan.solver["lower_bound"] <= plan.predicted["time_s"] + 1e-9
    assert plan.solver["gap"] >= 0


# -- the executor ------------------------------------------------------------------------------

FLASH = Tier(read_bytes_per_s=2e8, write_bytes_per_s=1e8, latency_s=1e-4)
STEPS = 3


def make_resnet():
    return build("resnet18", batch=2, image=32)


@pytest.fixture(scope="module")
def resnet_plan():
    module, args = make_resnet()
    captured = capture_module(module, args, "resnet18")
    graph = captured.graph
    budget = int(graph.fixed_bytes + 0.45 * (keep_all_peak_bytes(graph) - graph.fixed_bytes))
    problem = build_problem(graph, budget, None, "time", None, "flash", {"flash": FLASH},
                            io="overlap")
    # Norms split from what follows them lowered keep-all's peak more than the floor: plan at
    # the floor where the 45% point is below it.
    floor = problem.smallest_budget()[0]
    if budget < floor:
        problem = build_problem(graph, floor, None, "time", None, "flash", {"flash": FLASH},
                                io="overlap")
    plan = solve(problem, "heuristic:paging", time_limit=20).plan
    plan.problem["tier_params"] = {"flash": FLASH.to_dict()}
    return captured, plan


def _hoisted(plan) -> int:
    """Page-ins issued before the instruction right before their first use."""
    flat = [ins for stage in plan.stages for ins in stage]
    count = 0
    for k, ins in enumerate(flat):
        if ins.op == "page_in" and k + 1 < len(flat):
            count += flat[k + 1].op != "compute"
    return count


@pytest.mark.slow  # trains ResNet-18
@pytest.mark.parametrize("paging_io", ["overlap", "sync"])
def test_overlapped_paging_trains_bitwise_like_eager(resnet_plan, paging_io, tmp_path):
    captured, plan = resnet_plan
    assert plan.predicted["page_ins"] > 0 and plan.predicted["io"] == "overlap"
    module, args = make_resnet()
    mine = capture_module(module, args, "resnet18")
    report = run_plan(mine.graph, plan, STEPS, str(tmp_path / "pages"), captured=mine, seed=5,
                      paging_io=paging_io)
    assert report["paging_io"] == paging_io
    assert report["grad_check"]["bitwise_equal"], report["grad_check"]
    reference, reference_args = make_resnet()
    optimizer = torch_optimizer("sgd", reference)
    torch.manual_seed(5)
    losses = [plain_step(reference, optimizer, reference_args) for _ in range(STEPS)]
    assert [r["loss"] for r in report["steps"]] == losses
    for (name, a), (_, b) in zip(mine.module.state_dict().items(),
                                 reference.state_dict().items()):
        assert torch.equal(a, b), name
    summary = report["summary"]
    assert summary["ledger_within_prediction"], summary
    for record in report["steps"]:
        assert record["overlapped"] == (paging_io == "overlap")
        assert record["page_ins"] == plan.predicted["page_ins"]
        assert record["page_in_s"] > 0 and record["page_out_s"] > 0
    if paging_io == "overlap":
        assert 0.0 <= summary["paging_hidden_share"] <= 1.0
        assert summary["predicted_paging_hidden_share"] is not None


@pytest.mark.slow
def test_the_post_pass_issues_page_ins_ahead_of_their_use(resnet_plan):
    _, plan = resnet_plan
    assert _hoisted(plan) > 0


class WatchedStore(MemoryStore):
    """A page store that keeps a weak reference to every tensor it is given to write."""

    tier = "flash"

    def __init__(self):
        super().__init__()
        self.written: dict = {}  # node -> {value name: its last write's tensor, weakly}

    def put(self, key, tensor):
        self.written.setdefault(key[0], {})[key[1]] = weakref.ref(tensor)
        return super().put(key, tensor)


def test_a_written_page_stays_alive_while_the_ledger_counts_it(user_capture, monkeypatch):
    # The ledger counts storages by address: a write's tensor freed while its key is still
    # registered (the IO thread dropped it at the write's end, the executor's thread had not
    # seen the end yet) let the next tensor at that address count as already counted, and
    # the ledger went over the plan by the two sizes' difference in about one run in four.
    captured = user_capture()
    plan = with_paging(dtr_plan(captured.graph), captured.graph)
    store = WatchedStore()
    checked, dead = [], []
    unregister = LiveTensorLedger.unregister

    def watched(self, key):
        if isinstance(key, tuple) and key[0] == "paging out":
            refs = store.written.get(key[1], {}).values()
            checked.append(key)
            dead.extend(key for ref in refs if ref() is None)
        return unregister(self, key)

    monkeypatch.setattr(LiveTensorLedger, "unregister", watched)
    report = run_plan(captured.graph, plan, 2, None, captured=captured, stores={"flash": store},
                      seed=3, paging_io="overlap")
    assert report["paging_io"] == "overlap" and report["grad_check"]["bitwise_equal"]
    assert checked and not dead
    summary = report["summary"]
    assert summary["ledger_peak_bytes"] == summary["predicted_peak_bytes"], summary


class ReadLog(MemoryStore):
    """A page store that notes the address of every tensor it reads back."""

    tier = "flash"

    def __init__(self):
        super().__init__()
        self.read_ptrs: list[int] = []

    def get(self, key):
        tensor = super().get(key)
        self.read_ptrs.append(tensor.untyped_storage().data_ptr())
        return tensor


def test_a_prefetched_page_is_allocated_where_the_plan_counts_it(user_capture):
    # torch's allocator profiler is thread-local: a page read into a tensor that the IO thread
    # allocated is invisible to it (benchmarks/end_to_end.py measured ours under the plan's
    # peak). The executor's thread allocates it at the page-in's issue; the IO thread fills it.
    from edge_remat_agent.profiler.allocations import allocation_events
    from torch.profiler import ProfilerActivity, profile
    captured = user_capture()
    plan = with_paging(dtr_plan(captured.graph), captured.graph)
    store = ReadLog()
    run_plan(captured.graph, plan, 1, None, captured=captured, stores={"flash": store}, seed=3,
             paging_io="overlap")
    store.read_ptrs.clear()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        report = run_plan(captured.graph, plan, 1, None, captured=captured,
                          stores={"flash": store}, seed=3, paging_io="overlap")
    assert report["grad_check"]["bitwise_equal"] and report["steps"][0]["page_ins"] > 0
    seen = {ptr for _, ptr, size, _ in allocation_events(prof) if size > 0}
    assert store.read_ptrs and set(store.read_ptrs) <= seen


def test_the_post_pass_keeps_to_the_plans_time_limit():
    """When each page-in's candidates were scored on the whole step's timeline, a random
    layered graph of 2000 nodes at 35% with flash (about a thousand page-ins) took 19 s for
    one plan's post-pass, so `plan --time-limit 4` took 43 s (2026-12-05). Trials run from the
    base's state now take about 2 s there, so this plan keeps to its limit with or without the
    pass's own deadline (tested below); it stays valid and never slower than stop-the-world.
    The limit is that run's 4 s: at 2 s the first plan came at 1.5 s alone, and under the
    whole suite's load none came in time (CI, 2026-12-05)."""
    from edge_remat.planner.ordering import ORDER_SHARE
    from edge_remat.synthetic import random_layered
    graph = random_layered(2000, seed=1, w=0.31)
    flash = Tier(read_bytes_per_s=90e6, write_bytes_per_s=40e6)
    limit = 4.0
    p = build_problem(graph, "0.35", paging="flash", tiers={"flash": flash},
                      order_time_s=ORDER_SHARE * limit)  # as `plan` gives it
    report = solve(p, "auto", time_limit=limit)
    solver = report.plan.solver
    assert solver["solve_time_s"] <= limit + 1.5, solver
    sim = simulate(graph, p.costs, report.plan.stages, p.budget_bytes, io="overlap")
    assert sim.peak_bytes <= p.budget_bytes
    sync = simulate(graph, p.costs, report.plan.stages, p.budget_bytes, io="sync")
    assert 0 < sim.time_s <= sync.time_s * (1 + 1e-9)


def test_past_its_deadline_the_post_pass_leaves_page_ins_where_the_plan_put_them():
    import time

    from edge_remat.planner.overlap import hoisting_until, schedule_io
    p, stages = random_paging_schedule(4)  # one whose page-ins the pass moves up

    def order(placed):  # all but the page-outs, which the pass moves first
        return [ins for stage in placed for ins in stage if ins.op != "page_out"]
    with hoisting_until(time.perf_counter()):
        late = schedule_io(p, stages)
    assert order(late) == order(stages)
    assert order(schedule_io(p, stages)) != order(stages)  # in time, page-ins move up
    with hoisting_until(None):  # no deadline of its own: the pass runs whole
        assert schedule_io(p, stages) == schedule_io(p, stages, whole_runs=True)


def test_trials_run_from_the_base_score_what_whole_steps_do():
    """The post-pass scores a trial (a page-in moved up, a page-out down) from the base's
    timeline state where they part, and stops where its state is the base's shifted in time.
    Against each trial run as a whole step, on random issue points (not only those the pass
    tries), with slow and fast flash, compute shares, writes waited for at the limit, and
    trials that raise the synchronous peak (the timeline's limit): the same makespans, and the
    same placed plans."""
    import random

    from edge_remat.planner import overlap
    kinds, trials = set(), 0
    for seed in range(12):
        p, stages = random_paging_schedule(seed)
        lowered = [(overlap.OP_CODES[ins.op], p.graph.index[ins.node], ins.tier)
                   for stage in stages for ins in stage]
        writes_early = overlap._issue_page_outs_early(lowered, lowered, p.deps)[1]
        rng = random.Random(seed)
        for ops in (lowered, writes_early):  # as lowered, and as the pass first moves it
            base = overlap._makespan(p, ops)
            whole, shortcut = overlap._WholeRuns(p, ops, base), overlap._Trials(p, ops, base)
            page_ins = [k for k, op in enumerate(ops) if op[0] == overlap.PAGE_IN]
            page_outs = [k for k, op in enumerate(ops) if op[0] == overlap.PAGE_OUT]
            moves = [(c, j) for j in rng.sample(page_ins, min(4, len(page_ins)))
                     for c in rng.sample(range(j), min(4, j))]  # up
            moves += [(c, j) for j in rng.sample(page_outs, min(4, len(page_outs)))
                      for c in rng.sample(range(j + 1, len(ops)), min(4, len(ops) - j - 1))]
            for c, j in moves:
                size, first, last = p.sizes[ops[j][1]], min(c, j), max(c, j)
                raised = size + max(shortcut.before[first] + p.fixed,
                                    *shortcut.trace[first:last + 1])
                kinds.add((c < j, raised > shortcut.limit, shortcut._waits_from(0) > 0))
                assert shortcut.score(c, j) == pytest.approx(whole.score(c, j), rel=1e-12)
                trials += 1
        placed = overlap.schedule_io(p, stages)
        assert placed == overlap.schedule_io(p, stages, whole_runs=True)
        assert (overlap.delay_page_outs(p, placed) ==
                overlap.delay_page_outs(p, placed, whole_runs=True))
    assert kinds == {(up, raised, waits) for up in (True, False) for raised in (True, False)
                     for waits in (True, False)}
    assert trials > 500


def test_page_outs_delayed_shorten_some_steps_and_never_lengthen_one():
    """A write issued as early as it can be may hold back the reads queued behind it on the
    one IO timeline; issued later (within the budget) they go first."""
    from edge_remat.planner.overlap import delay_page_outs, schedule_io
    shorter = 0
    for seed in (0, 1, 2, 3, 10):
        p, stages = random_paging_schedule(seed)
        placed = schedule_io(p, stages)
        before = simulate(p.graph, p.costs, placed, p.budget_bytes, io="overlap")
        after = simulate(p.graph, p.costs, delay_page_outs(p, placed), p.budget_bytes,
                         io="overlap")
        assert after.peak_bytes <= p.budget_bytes
        assert after.time_s <= before.time_s * (1 + 1e-12)
        shorter += after.time_s < before.time_s * (1 - 1e-9)
    assert shorter >= 2  # seeds 2 and 10 (2026-12-05)


def test_the_plan_solve_returns_has_its_page_outs_delayed():
    _, p = random_paging_problem(24)
    report = solve(p, "heuristic:paging", time_limit=5)
    placed_only = evaluate(p, report.decisions)  # what every candidate is compared by
    assert report.plan.predicted["time_s"] < placed_only.sim.time_s * (1 - 1e-6)
    assert report.plan.predicted["peak_bytes"] <= p.budget_bytes
    replayed = simulate(p.graph, p.costs, report.plan.stages, p.budget_bytes, io="overlap")
    assert replayed.time_s == pytest.approx(report.plan.predicted["time_s"], rel=1e-12)


def test_an_accepted_move_updates_the_bases_ram_and_writes_over_its_stretch():
    import random

    from edge_remat.planner import overlap
    from edge_remat_agent.timeline import first_writes
    for seed in (2, 5, 7):
        p, stages = random_paging_schedule(seed)
        ops = [(overlap.OP_CODES[ins.op], p.graph.index[ins.node], ins.tier)
               for stage in stages for ins in stage]
        trials, rng = overlap._Trials(p, ops, overlap._makespan(p, ops)), random.Random(seed)
        for _ in range(20):
            j = rng.choice([k for k, op in enumerate(trials.ops) if op[0] != overlap.COMPUTE
                            and op[0] != overlap.FREE])
            up = trials.ops[j][0] == overlap.PAGE_IN
            if (up and j == 0) or (not up and j == len(trials.ops) - 1):
                continue
            c = rng.randrange(0, j) if up else rng.randrange(j + 1, len(trials.ops))
            trials.accept(c, j, trials.score(c, j))
            assert (trials.trace, trials.before) == overlap._sync_levels(p, trials.ops)
            assert trials.writes == first_writes(trials.ops)
            assert trials.limit == max(trials.trace)
            assert trials.makespan == pytest.approx(overlap._makespan(p, trials.ops), rel=1e-12)
