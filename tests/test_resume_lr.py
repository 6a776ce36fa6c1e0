"""A run resumed with another --lr (the remedy of a run that diverged: go on from its last
good checkpoint with a smaller one). Resuming used to refuse any other --lr, --lr being part
of the checkpoint's identity. Now 2 steps at lr A with a checkpoint, resumed for 2 more at lr
B, end bit for bit as plain PyTorch that sets B from step 3 (its schedule's factor still
applied; the optimizer's momentum and moments going on), on each path that steps parameters:
the fused per-node optimizers, one torch optimizer after the backward, gradient accumulation,
parameters and optimizer state homed on flash. The checkpoint and the report keep which steps
took which rate; any other option is still refused in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.executor_plans import EXAMPLE, problem_near_floor

from edge_remat_agent.capture import capture_model
from edge_remat_agent.capture.optimizer import torch_optimizer
from edge_remat_agent.executor.batches import batch_source
from edge_remat_agent.executor.checkpoint import Checkpointing, read_checkpoint
from edge_remat_agent.executor.gradcheck import deterministic
from edge_remat_agent.executor.run import run_plan
from edge_remat_agent.executor.step import plain_step
from edge_remat_agent.formats import Tier
from edge_remat_agent.lr_schedule import lr_factor
from edge_remat.planner.solve import solve

FLASH = {"flash": Tier(read_bytes_per_s=5e8, write_bytes_per_s=2e8, latency_s=1e-4)}
SHAPE = dict(batch=4, image=8)
STEPS, FIRST_PART = 4, 2
LR_A, LR_B = 0.05, 0.005

CASES = [  # label, optimizer, update, params home, accumulate, schedule, warmup
    ("sgd-momentum-fused-constant", "sgd", "fused", "ram", 1, "constant", 0),
    ("adam-step-cosine-warmup", "adam", "step", "ram", 1, "cosine", 1),
    ("adamw-flash-accumulate-linear", "adamw", "fused", "flash", 2, "linear", 1),
]


def _part(tmp_path: Path, name: str, case: tuple, lr: float, resume: Path | None = None):
    """One part of the run: the example model captured afresh, planned near its floor
    (recomputing or paging), trained at base rate `lr` to step FIRST_PART with a checkpoint,
    or from `resume`'s checkpoint to STEPS. Its report, trained weights and checkpoint."""
    _, optimizer, update, home, accumulate, schedule, warmup = case
    captured = capture_model(EXAMPLE, optimizer=optimizer, update=update, params_home=home,
                             refined=False, accumulate=accumulate, **SHAPE)
    plan = solve(problem_near_floor(captured.graph, 0.5, "flash", FLASH),
                 "heuristic:paging").plan
    checkpoint = tmp_path / f"{name}.pt"
    if resume is not None:
        checkpoint.write_bytes(resume.read_bytes())  # the part replaces it, as a job's does
    checkpointing = Checkpointing(path=checkpoint, every=1, identity=_identity(case, lr),
                                  stop_after=None if resume else FIRST_PART,
                                  resume=read_checkpoint(checkpoint) if resume else None)
    report = run_plan(captured.graph, plan, STEPS, str(tmp_path / f"pages-{name}"),
                      captured=captured, seed=0, lr=lr, lr_schedule=schedule, warmup=warmup,
                      keep_parameters=True, checkpointing=checkpointing)
    return report, captured.module.state_dict(), checkpoint


def _identity(case: tuple, lr: float) -> dict:
    """What `edge-remat run` writes into the checkpoints of a run of these options, and
    checks a resume's against (it had --lr, and refused a resume with another)."""
    from edge_remat.run import RunOptions
    from edge_remat.run.resume import training_identity
    _, optimizer, _, _, accumulate, schedule, warmup = case
    return training_identity(RunOptions(
        device="local", model=EXAMPLE, steps=STEPS, optimizer=optimizer, lr=lr,
        lr_schedule=schedule, warmup=warmup, accumulate=accumulate, **SHAPE))


def _plain(case: tuple, rates: list[float]) -> dict:
    """Plain PyTorch over the same batches: step k (from 0) at base rate rates[k] times the
    schedule's factor, set on the optimizer's param group before its step, as a user who
    lowers the rate from step 3 would; one optimizer all along (its state goes on)."""
    _, optimizer, _, _, accumulate, schedule, warmup = case
    captured = capture_model(EXAMPLE, optimizer=optimizer, **SHAPE)
    module, example_args = captured.module, captured.example_args
    opt = torch_optimizer(optimizer, module, rates[0])
    factor = lr_factor(schedule, warmup, STEPS)
    batches = batch_source(None, example_args, torch.device("cpu"), 0)
    torch.manual_seed(0)
    with deterministic(torch.device("cpu")):
        for k in range(STEPS):
            for group in opt.param_groups:
                group["lr"] = rates[k] * factor(k)
            plain_step(module, opt, *(batches(k * accumulate + j) for j in range(accumulate)))
    return module.state_dict()


def _equal(a: dict, b: dict) -> bool:
    assert a.keys() == b.keys()
    return all(torch.equal(a[name], b[name]) for name in a)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_two_steps_at_a_then_two_resumed_at_b_equal_plain_pytorch_lowering_the_rate(
        tmp_path, case):
    first, _, checkpoint = _part(tmp_path, "first", case, LR_A)
    assert [s["step"] for s in first["steps"]] == [1, 2]
    second, trained, second_checkpoint = _part(tmp_path, "second", case, LR_B, checkpoint)
    assert [s["step"] for s in second["steps"]] == [3, 4]
    assert second["grad_check"]["bitwise_equal"] is True  # checked on step 3
    assert second["recomputed"] + second["page_outs"] > 0  # a plan, not plain training
    lowered = _plain(case, [LR_A] * FIRST_PART + [LR_B] * (STEPS - FIRST_PART))
    assert _equal(lowered, trained)
    # not the same weights either way: the rate B did train steps 3 and 4
    assert not _equal(_plain(case, [LR_A] * STEPS), trained)
    history = [{"from_step": 1, "lr": LR_A}, {"from_step": 3, "lr": LR_B}]
    assert second["optimizer"]["lr"] == LR_B and second["optimizer"]["lr_history"] == history
    assert read_checkpoint(second_checkpoint).lr_history == history
    assert "lr_history" not in first["optimizer"]  # it never changed there
    assert read_checkpoint(checkpoint).lr_history == [{"from_step": 1, "lr": LR_A}]


@pytest.mark.slow
def test_the_history_goes_on_through_a_second_resume_and_the_report_says_it_once(tmp_path):
    """A third part at B again adds nothing; the host's report and the board's summary
    (what deploy prints) say in one line where the rate changed."""
    from edge_remat.reports.run_report import build_report, report_text
    from edge_remat_agent.run_command import summary_text
    case = CASES[0]
    _, _, checkpoint = _part(tmp_path, "first", case, LR_A)
    captured = capture_model(EXAMPLE, optimizer="sgd", refined=False, **SHAPE)
    plan = solve(problem_near_floor(captured.graph, 0.5, "flash", FLASH),
                 "heuristic:paging").plan
    second = run_plan(captured.graph, plan, STEPS, str(tmp_path / "p2"), captured=captured,
                      seed=0, lr=LR_B, checkpointing=Checkpointing(
                          path=tmp_path / "second.pt", identity=_identity(case, LR_B),
                          stop_after=3,
                          resume=read_checkpoint(checkpoint)))
    captured = capture_model(EXAMPLE, optimizer="sgd", refined=False, **SHAPE)
    third = run_plan(captured.graph, plan, STEPS, str(tmp_path / "p3"), captured=captured,
                     seed=0, lr=LR_B, checkpointing=Checkpointing(
                         path=tmp_path / "third.pt", identity=_identity(case, LR_B),
                         resume=read_checkpoint(tmp_path / "second.pt")))
    changed = "--lr 0.05 for steps 1-2, 0.005 from step 3"
    assert third["optimizer"]["lr_history"] == second["optimizer"]["lr_history"] == \
        [{"from_step": 1, "lr": LR_A}, {"from_step": 3, "lr": LR_B}]
    assert f"  lr           {changed}" in summary_text(third).splitlines()
    host = build_report(mode="planned", status="finished", device="bench", model="example",
                        steps=STEPS, result=third)
    assert host["lr_history"] == third["optimizer"]["lr_history"]
    lines = report_text(host).splitlines()
    assert [line for line in lines if changed in line] == \
        [f"lr        {changed} (--resume with another --lr)"]
    # the misses number the steps from where the run went on (QA: steps 4-8 were "2-5")
    resumed = build_report(mode="planned", status="finished", device="bench", model="example",
                           steps=STEPS, result=third, plan=plan.to_dict(),
                           resumed_after_step=3)
    timed = [line for line in resumed["misses"] if line.startswith("step time: ")]
    assert len(timed) == 1 and timed[0].startswith("step time: step 4 "), resumed["misses"]
    first = build_report(mode="planned", status="finished", device="bench", model="example",
                         steps=STEPS, result={**third, "optimizer": {"lr": LR_A}})
    assert first["lr_history"] is None and "--lr" not in report_text(first)


def test_lr_may_change_on_a_resume_and_nothing_else_may():
    """The identity a run (or deploy) writes into its checkpoints has no --lr; a checkpoint
    written before, which has one, is not refused for it; any other option still is, in one
    line naming it."""
    from edge_remat.run import RunOptions
    from edge_remat.run.resume import deploy_identity, training_identity
    from edge_remat_agent.executor.save_choice import identity_mismatch
    base = dict(device="bench", model="gpt-tiny", lr_schedule="cosine", warmup=2, steps=6)
    earlier = training_identity(RunOptions(lr=0.1, **base))
    assert "--lr" not in earlier and "--lr" not in deploy_identity(RunOptions(**base), "g1")
    assert identity_mismatch(earlier, training_identity(RunOptions(lr=0.01, **base))) is None
    assert identity_mismatch({**earlier, "--lr": 0.1}, earlier) is None  # an older checkpoint
    for option, value, words in [("warmup", 1, "--warmup 2, this run has 1"),
                                 ("steps", 8, "--steps 6, this run has 8"),
                                 ("lr_schedule", "linear", "--lr-schedule cosine, this run "
                                  "has linear"), ("batch", 2, "--batch 4, this run has 2")]:
        # (gpt-tiny's batch not given is its default, 4: compared as that)
        said = identity_mismatch(earlier, training_identity(
            RunOptions(lr=0.01, **{**base, option: value})))
        assert said is not None and words in said and "\n" not in said, said


def test_a_checkpoint_of_another_model_or_of_deploy_is_said_as_such():
    # QA: a checkpoint of mlp resumed as digits-cnn was said to differ in --batch, and a
    # deploy's checkpoint resumed by run in --accumulate
    from edge_remat.run import RunOptions
    from edge_remat.run.resume import deploy_identity, training_identity
    from edge_remat_agent.executor.save_choice import identity_mismatch
    mlp = training_identity(RunOptions(device="bench", model="mlp", steps=6))
    cnn = training_identity(RunOptions(device="bench", model="digits-cnn", batch=8, steps=6))
    said = identity_mismatch(mlp, cnn)
    assert said.startswith("the checkpoint's run had --model mlp, this run has digits-cnn"), said
    deployed = deploy_identity(RunOptions(device="bench", model=None, steps=6), "g1")
    said = identity_mismatch(deployed, mlp)
    assert said.startswith("the checkpoint was written by `edge-remat deploy`, and this is "
                           "`edge-remat run`: resume it with `edge-remat deploy ... --resume`")
    assert "`edge-remat run ... --resume`" in identity_mismatch(mlp, deployed)
    # the starting weights are held by their content's hash: said as such, not as a path
    said = identity_mismatch({**mlp, "--init": "ab" * 32}, mlp)
    assert "had --init (a file whose sha256 begins abababababab), this run has (not " \
        "given)" in said, said


def test_what_to_try_names_a_resume_only_from_a_checkpoint_before_the_diverged_update():
    """A run that stops at its first non-finite loss, at step 5, keeping its checkpoints:
    step 5's loss is the forward of the weights after step 4, so a resume with a smaller
    --lr (a tenth of this run's) is offered from a checkpoint after step 3 or before, not
    from one after step 4, and not without one. The board's own `run` has no --lr: its
    words do not ask for one."""
    from edge_remat_agent.diverged import LossTally, remedy_for
    remedy = remedy_for({"optimizer": "sgd"}, 0.1, resume_out="runs/a")
    assert remedy.words(5, 3).startswith(
        "try a smaller --lr (this run's is 0.1; the same command with `--resume runs/a --lr "
        "0.01` goes on from its checkpoint after step 3) or clipping the gradients")
    assert remedy.words(5, 4).startswith(
        "try a smaller --lr (this run's is 0.1; again from the start: the checkpoint after step "
        "4 holds the weights that gave step 5's loss, which --resume runs/a would repeat) or")
    assert remedy.words(5, None) == remedy_for({"optimizer": "sgd"}, 0.1).words(5, 3)
    tally = LossTally(remedy)  # as a job's progress tells it: checkpoints after 2 and 4
    for step, loss in [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0), (5, float("nan"))]:
        tally.see(step, loss)
        if step % 2 == 0:
            tally.checkpointed(step)
    assert tally.found["remedy"] == remedy.words(5, 4)
    own = remedy_for({"optimizer": "sgd"}, None, takes_lr=False, resume_out="runs/a")
    assert "--lr (" not in own.words(5, 3) and "smaller --lr" not in own.words(5, 3)
    assert own.words().startswith(
        "try a smaller learning rate (this run's is 0.01, its optimizer's own, which this "
        "command cannot change: `edge-remat deploy` of the plan takes --lr) or clipping the "
        "gradients (--clip-grad-norm 1.0 on edge-remat graph, then plan again)")
