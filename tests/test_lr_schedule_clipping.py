"""Learning-rate schedules (--lr-schedule, --warmup) and gradient clipping (--clip-grad-norm).

The planned executor must take plain PyTorch's steps bit for bit: the reference here is written
as a user would, with torch.optim.lr_scheduler.LambdaLR and torch.nn.utils.clip_grad_norm_, and
the schedules' factors are those of Hugging Face transformers' schedulers.
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers.executor_plans import (EXAMPLE, eager_clipped, every_forward_recomputed,
                                    keep_all, problem_near_floor, with_paging)

from edge_remat_agent.capture import CaptureError, capture_model
from edge_remat_agent.executor.errors import BadInput
from edge_remat_agent.executor.run import run_plan
from edge_remat_agent.formats import Tier
from edge_remat_agent.lr_schedule import ScheduledLr, lr_factor
from edge_remat.planner.solve import solve

FLASH = {"flash": Tier(read_bytes_per_s=5e8, write_bytes_per_s=2e8, latency_s=1e-4)}
SHAPE = dict(batch=8, image=16)
STEPS = 5


def _hf_factor(schedule: str, warmup: int, steps: int):
    """The factor as transformers' get_{linear,cosine}_schedule_with_warmup define it."""
    def factor(k):
        if k < warmup:
            return k / max(1, warmup)
        progress = (k - warmup) / max(1, steps - warmup)
        if schedule == "linear":
            return max(0.0, (steps - k) / max(1, steps - warmup))
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))
    return factor


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_each_steps_lr_is_lambdalrs_and_transformers(schedule):
    transformers = pytest.importorskip("transformers")
    make = {"linear": transformers.get_linear_schedule_with_warmup,
            "cosine": transformers.get_cosine_schedule_with_warmup}[schedule]
    ours = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.03)
    theirs = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.03)
    scheduler = make(theirs, 3, 10)
    scheduled = ScheduledLr([ours], schedule, 3, 10)
    for k in range(10):
        scheduled.at(k)
        assert ours.param_groups[0]["lr"] == theirs.param_groups[0]["lr"], k
        theirs.step()
        scheduler.step()
    assert lr_factor(schedule, 3, 10)(0) == 0.0 and lr_factor("constant", 0, 10)(9) == 1.0


@pytest.mark.parametrize("schedule,warmup,steps,words", [
    ("cosine", -1, 5, "--warmup must be 0 or more"),
    ("linear", 6, 5, "--warmup 6 is longer than the run's 5 steps"),
    ("exponential", 0, 5, "unknown --lr-schedule 'exponential'")])
def test_a_bad_schedule_is_refused_in_one_line(schedule, warmup, steps, words):
    with pytest.raises(ValueError) as error:
        lr_factor(schedule, warmup, steps)
    assert words in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("max_norm", [0, -1.0, float("nan"), float("inf")])
def test_a_max_norm_that_is_not_positive_is_refused_at_capture(max_norm):
    with pytest.raises(CaptureError, match="--clip-grad-norm must be a positive number"):
        capture_model(EXAMPLE, clip_grad_norm=max_norm, **SHAPE)


def test_the_norm_nodes_read_every_gradient_and_every_update_waits_for_them():
    graph = capture_model(EXAMPLE, clip_grad_norm=1.0, **SHAPE).graph
    groups = [n for n in graph.nodes if n.op == "grad_norms"]
    totals = [n for n in graph.nodes if n.op == "clip_grad_norm"]
    updates = [n for n in graph.nodes if n.kind == "update" and "update_grads" in n.attrs]
    assert len(totals) == 1 and len(groups) == len(updates) > 1
    total = totals[0]
    assert {v for g in groups for v, _ in g.attrs["norm_grads"]} == \
        {v for u in updates for v in u.attrs["update_grads"]}
    order = [n.id for n in graph.nodes]
    assert sorted(total.inputs) == sorted(g.id for g in groups)
    assert all(total.id in u.inputs and order.index(u.id) > order.index(total.id)
               for u in updates)
    # each group's norms right after its last gradient, not after the whole backward
    assert order.index(groups[0].id) < order.index(groups[-1].id) - 1
    # the module's parameter order, which torch stacks the norms in
    module = capture_model(EXAMPLE, **SHAPE).module
    names = [name for name, p in module.named_parameters() if p.requires_grad]
    assert total.attrs["norm_order"] == names


def test_norms_taken_group_by_group_are_torchs_global_norm_bit_for_bit():
    from edge_remat_agent.grad_clip import norm_of_norms, tensor_norms
    generator = torch.Generator().manual_seed(3)
    grads = [torch.randn(*shape, generator=generator) * scale for shape, scale in
             [((64, 3, 3, 3), 1e-3), ((64,), 10.0), ((1000, 257), 0.1), ((7,), 1.0),
              ((513, 129), 3e-2)]]
    norms = tensor_norms(grads[:2]) + tensor_norms(grads[2:4]) + tensor_norms(grads[4:])
    assert torch.equal(norm_of_norms(norms), torch.nn.utils.get_total_norm(grads))


def _eager(optimizer: str, example_args, schedule: str, warmup: int, clip: float | None):
    """Plain PyTorch as a user writes it: LambdaLR with transformers' factors,
    clip_grad_norm_, the run's batches."""
    module = capture_model(EXAMPLE, optimizer=optimizer, **SHAPE).module
    factor = _hf_factor(schedule, warmup, STEPS) if schedule != "constant" else None
    return eager_clipped(module, optimizer, example_args, STEPS, clip, factor)


CASES = [  # label, optimizer, params home, update, schedule, warmup, max norm
    ("cosine-warmup", "sgd", "ram", "fused", "cosine", 2, None),
    ("clip", "adamw", "flash", "fused", "constant", 0, 1.0),
    ("cosine-warmup-clip", "adam", "flash", "fused", "cosine", 2, 1.0),
    ("linear-clip-step", "sgd", "ram", "step", "linear", 1, 1.0),
]


@pytest.mark.slow
@pytest.mark.parametrize("label,optimizer,home,update,schedule,warmup,clip", CASES,
                         ids=[c[0] for c in CASES])
def test_parameters_after_5_steps_equal_plain_pytorchs(label, optimizer, home, update,
                                                       schedule, warmup, clip, tmp_path):
    captured = capture_model(EXAMPLE, optimizer=optimizer, params_home=home, update=update,
                             refined=False, clip_grad_norm=clip, **SHAPE)
    graph = captured.graph
    problem = problem_near_floor(graph, 0.5, "flash", FLASH)
    plan = solve(problem, "heuristic:paging").plan
    report = run_plan(graph, plan, STEPS, str(tmp_path / "pages"), captured=captured, seed=0,
                      keep_parameters=True, lr_schedule=schedule, warmup=warmup)
    assert report["grad_check"]["bitwise_equal"] and report["grad_check"]["loss_equal"]
    assert report["recomputed"] + report["page_outs"] > 0 and report["page_outs"] > 0
    expected, norms = _eager(optimizer, captured.example_args, schedule, warmup, clip)
    actual = captured.module.state_dict()
    assert expected.keys() == actual.keys()
    for name in expected:
        assert torch.equal(expected[name], actual[name]), name
    if clip is not None:
        assert all(norm > clip for norm in norms), norms  # it clipped every step
        unclipped, _ = _eager(optimizer, captured.example_args, schedule, warmup, None)
        assert not all(torch.equal(unclipped[n], actual[n]) for n in actual)
    assert report["optimizer"]["lr_schedule"] == schedule
    assert report["optimizer"]["clip_grad_norm"] == clip
    # the ledger's peak stays within the plan's (the gradients are clipped in place)
    assert all(s["ledger_peak_bytes"] <= report["predicted_peak_bytes"] for s in report["steps"])


@pytest.mark.slow
def test_the_compiled_step_clips_and_schedules_as_the_measured_ones(tmp_path):
    """Once the measured steps agree, later steps run as one compiled function
    (executor/compiled_step.py), the norm nodes among them."""
    captured = capture_model(EXAMPLE, optimizer="adamw", clip_grad_norm=1.0, **SHAPE)
    report = run_plan(captured.graph, every_forward_recomputed(captured.graph), STEPS,
                      str(tmp_path), captured=captured, seed=0, lr_schedule="linear", warmup=1)
    assert report["steps"][-1]["ledger"] == "replayed" and report["recomputed"] > 0
    expected, _ = _eager("adamw", captured.example_args, "linear", 1, 1.0)
    actual = captured.module.state_dict()
    assert all(torch.equal(expected[name], actual[name]) for name in expected)


@pytest.mark.slow
def test_the_arena_executor_clips_as_plain_pytorch(tmp_path):
    """Every planned tensor at its arena offset (the norm nodes' scalars have slots too)."""
    import dataclasses

    from edge_remat.planner.arena import plan_arena
    captured = capture_model(EXAMPLE, optimizer="sgd", clip_grad_norm=1.0, **SHAPE)
    graph = captured.graph
    plan = with_paging(every_forward_recomputed(graph), graph)
    plan = dataclasses.replace(plan, arena=plan_arena(graph, plan, None, "best-fit", 5.0))
    report = run_plan(graph, plan, STEPS, str(tmp_path), captured=captured, seed=0,
                      allocator="arena", lr_schedule="cosine", warmup=2)
    assert report["recomputed"] > 0 and report["page_ins"] > 0
    expected, _ = _eager("sgd", captured.example_args, "cosine", 2, 1.0)
    actual = captured.module.state_dict()
    assert all(torch.equal(expected[name], actual[name]) for name in expected)


def test_run_plan_refuses_a_warmup_longer_than_the_run(tmp_path):
    captured = capture_model(EXAMPLE, **SHAPE)
    plan = keep_all(captured.graph)
    with pytest.raises(BadInput, match="--warmup 4 is longer than the run's 3 steps"):
        run_plan(captured.graph, plan, 3, str(tmp_path), captured=captured,
                 lr_schedule="cosine", warmup=4)


# --- the command line: bad values refused in one line, before any work ----------------------

CLI_CASES = [  # case, arguments, words the error line must hold
    ("negative warmup", ["run", "--warmup", "-1"], ["--warmup must be 0 or more"]),
    ("warmup past the steps", ["run", "--warmup", "20", "--steps", "10"],
     ["--warmup 20 is longer than the run's 10 steps", "at most --steps"]),
    ("unknown schedule", ["run", "--lr-schedule", "exponential"],
     ["exponential", "constant, linear, cosine"]),
    ("zero max norm", ["run", "--clip-grad-norm", "0"], ["--clip-grad-norm", "positive"]),
    ("negative max norm", ["graph", "--clip-grad-norm", "-1"], ["--clip-grad-norm", "positive"]),
]


@pytest.mark.slow
@pytest.mark.parametrize("case,args,words", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_bad_schedule_and_clip_values_are_one_line(tmp_path, case, args, words):
    from helpers.bad_inputs import BAD_INPUT, cli, no_new_files, refused, tree
    command, *rest = args
    extra = ["--device", "local", "--budget", "50%", "--out", tmp_path / "out"] \
        if command == "run" else ["-o", tmp_path / "graph.json"]
    before = tree(tmp_path)
    refused(cli(command, "--model", "digits-cnn", *extra, *rest), BAD_INPUT, *words)
    no_new_files(before, tmp_path)


def test_a_manifests_clip_grad_norm_is_checked(tmp_path):
    from edge_remat.fleet.manifest import ManifestError, load_manifest
    (tmp_path / "fleet.toml").write_text(
        'budgets = ["50%"]\n[[models]]\nmodel = "digits-cnn"\nclip_grad_norm = 0\n'
        '[[boards]]\ndevice = "rpi4"\n')
    with pytest.raises(ManifestError, match=r"models\[0\]\.clip_grad_norm: must be a positive"):
        load_manifest(tmp_path / "fleet.toml")
