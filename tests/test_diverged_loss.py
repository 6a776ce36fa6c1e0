"""A loss that turns NaN or inf during a run (the model's doing: here a learning rate of 1e6)
was reported as if all were well. Now the first such step is said once, as a `warning:` line
while the run goes on, with what to try, and the report (the board's and the host's) keeps it
and how many steps had one. With --stop-on-nonfinite the run stops after that step instead:
exit 1 with one error line, its report written, the last checkpoint before it kept."""

from __future__ import annotations

import json

import pytest

from helpers.bad_inputs import cli, refused
from helpers.board_fixtures import local_bench_device, stop_agent
from helpers.executor_plans import every_forward_recomputed
from edge_remat.remote import progress_printer
from edge_remat.reports.run_report import build_report, report_text
from edge_remat_agent.capture import capture_model
from edge_remat_agent.daemon.registry import JobContext
from edge_remat_agent.diverged import remedy_for
from edge_remat_agent.executor.checkpoint_step import checkpoint_step
from edge_remat_agent.executor.jobs import run_job
from edge_remat_agent.plain_train import plain_train_job
from edge_remat_agent.run_command import summary_text

STEPS, LR = 5, 1e6
# a linear layer squared: at lr 1e6 step 2's loss is ~2e17, step 3's overflows to inf, then nan
BLOWS_UP = """
import torch
from torch import nn


class Squared(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(16, 16)

    def forward(self, x):
        return self.layer(torch.relu(self.layer(x))).pow(2).mean()


def make(batch=4):
    return Squared(), (torch.randn(batch, 16),)
"""
# steps 3, 4 and 5 are not finite; what to try names this run's --lr and the clipping it lacks
REMEDY = ("try a smaller --lr (this run's is 1e+06) or clipping the gradients "
          "(--clip-grad-norm 1.0 on run or graph); else look for a division by zero or an "
          "overflow in the model's forward")
FIRST = {"step": 3, "loss": "inf", "count": 3, "remedy": REMEDY}
WARNING = ("the loss is not finite (inf) at step 3 and at 2 later steps: training diverged "
           f"(the model's doing, not the plan's); {REMEDY}")
STOPPED = ("stopped at step 3 of 5 (--stop-on-nonfinite): the loss is not finite (inf): "
           f"training diverged; {REMEDY}")


def from_the_start(out) -> str:
    """What to try where the run stops there with a checkpoint after every step: not a
    --resume, whose checkpoint (after step 2) holds the weights whose forward is step 3's."""
    return REMEDY.replace("(this run's is 1e+06)", "(this run's is 1e+06; again from the start: "
                          "the checkpoint after step 2 holds the weights that gave step 3's "
                          f"loss, which --resume {out} would repeat)")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """One file for the module: the profile cache's key holds the model's spec, so the board
    is profiled for it by the first planned `run` alone (~25 s), the others plan with it."""
    path = tmp_path_factory.mktemp("model") / "blows_up.py"
    path.write_text(BLOWS_UP)
    return f"{path}:make"


def _assert_the_host_warns(records: list, mode: str, model: str, result: dict) -> None:
    """The host's progress line and its report (planned or plain) name the step, how many
    followed, and what to try, once."""
    assert _late_host(records) == [f"warning: {WARNING}"]
    host = build_report(mode=mode, status="finished", device="bench", model=model,
                        steps=STEPS, result=result)
    assert host["nonfinite_loss"] == FIRST and host["stopped_at_step"] is None
    assert f"warning       {WARNING}" in report_text(host)


def _late_host(records: list) -> list[str]:
    """What a host that polled only once, after the last step, says (it sees the newest
    progress alone: the daemon writes it at most every 0.2 s)."""
    said = []
    show = progress_printer(said.append)
    show({"id": "job-1", "state": "finished", "progress": records[-1]})
    show({"id": "job-1", "state": "finished", "progress": records[-1]})  # said once only
    return [line for line in said if line.startswith("warning:")]


def _board_inputs(model: str, root) -> None:
    """root/inputs: the model's graph and a plan that recomputes every forward node."""
    captured = capture_model(model, seed=0)
    (root / "inputs").mkdir()
    captured.graph.save(root / "inputs" / "graph.json")
    every_forward_recomputed(captured.graph).save(root / "inputs" / "plan.json")


def _run_job(root, name: str, **params) -> tuple[dict, dict, list]:
    """The run job on root/inputs, in root/name: (its result, its run_report.json, progress)."""
    records: list = []
    ctx = JobContext("run-test", root / name, root, records.append)
    result = run_job(ctx, {"plan": "inputs/plan.json", "graph": "inputs/graph.json",
                           "steps": STEPS, "seed": 0, "lr": LR, **params})
    ctx.flush()
    return result, json.loads((root / name / "files" / "run_report.json").read_text()), records


def test_a_planned_run_says_at_which_step_the_loss_stopped_being_finite(model, tmp_path):
    _board_inputs(model, tmp_path)
    result, report, records = _run_job(tmp_path, "job")
    assert report["summary"]["nonfinite_loss"] == FIRST and report["stopped_at_step"] is None
    assert len(report["steps"]) == STEPS  # by default it goes on, as PyTorch's training would
    assert report["grad_check"]["bitwise_equal"]  # the plan is still exact: the model diverged
    assert f"warning      {WARNING}" in summary_text(report)
    _assert_the_host_warns(records, "planned", model, report)


def test_plain_training_says_it_too(model, tmp_path):
    records: list = []
    ctx = JobContext("plain-test", tmp_path / "job", tmp_path, records.append)
    result = plain_train_job(ctx, {"model": model, "steps": STEPS, "lr": LR})
    ctx.flush()
    assert result["nonfinite_loss"] == FIRST and len(result["loss"]) == STEPS
    _assert_the_host_warns(records, "plain", model, result)


def test_a_run_whose_loss_stays_finite_says_nothing_of_it(model, tmp_path):
    records: list = []
    ctx = JobContext("plain-test", tmp_path / "job", tmp_path, records.append)
    result = plain_train_job(ctx, {"model": model, "steps": 2, "lr": 0.01})
    ctx.flush()
    assert _late_host(records) == []
    host = build_report(mode="plain", status="finished", device="bench", model=model,
                        steps=2, result=result)
    assert host["nonfinite_loss"] is None and "not finite" not in report_text(host)


def test_a_planned_run_stops_at_the_first_nonfinite_loss_keeping_the_checkpoint_before(
        model, tmp_path):
    """stop_on_nonfinite: steps 1 and 2 train as the run that goes on trains them, step 3's
    loss is inf and the job stops there; its report is written, its last checkpoint is step
    2's (none is written of the diverged step), and no diverged weights are saved. What to
    try says that a resume from it would repeat step 3's loss (step 3's forward is of the
    weights after step 2), and so it does, at a smaller --lr too."""
    _board_inputs(model, tmp_path)
    _, went_on, _ = _run_job(tmp_path, "on", checkpoint_every=1)
    result, report, records = _run_job(tmp_path, "stop", checkpoint_every=1,
                                       stop_on_nonfinite=True, out="runs/blows-up")
    assert result["stopped_at_step"] == report["stopped_at_step"] == 3
    assert [s["loss"] for s in report["steps"]] == [s["loss"] for s in went_on["steps"][:3]]
    first = {**FIRST, "count": 1, "remedy": from_the_start("runs/blows-up")}
    assert report["summary"]["nonfinite_loss"] == records[-1]["data"]["nonfinite_loss"] == first
    assert report["grad_check"]["bitwise_equal"]
    assert checkpoint_step(tmp_path / "stop" / "files" / "checkpoint.pt") == 2
    assert checkpoint_step(tmp_path / "on" / "files" / "checkpoint.pt") == STEPS
    assert report["checkpoint"]["written"] == 2 and report["saved_weights"] is None
    assert result["files"] == ["run_report.json", "checkpoint.pt"]
    assert records[-1]["data"]["step"] == 3
    from edge_remat_agent.run_command import stopped_at_nonfinite
    assert stopped_at_nonfinite(result, STEPS) == stopped_at_nonfinite(report, STEPS) == \
        STOPPED.replace(REMEDY, from_the_start("runs/blows-up"))
    (tmp_path / "inputs" / "checkpoint.pt").write_bytes(
        (tmp_path / "stop" / "files" / "checkpoint.pt").read_bytes())
    _, resumed, _ = _run_job(tmp_path, "resumed", resume="inputs/checkpoint.pt", lr=0.01,
                             checkpoint_every=1, stop_on_nonfinite=True)
    assert resumed["stopped_at_step"] == 3 and resumed["steps"][0]["loss"] == float("inf")


# a quadratic at lr 1e4 (SGD, momentum 0.9): each step multiplies the weights by ~1e4, the
# loss 4, 1.6e9, 6.4e17, 2.6e26, 1.0e35, then inf at step 6; from the weights after step 4 at
# lr 0.01 it settles (2.5e26, 2.3e26, ...)
QUADRATIC = """
import torch
from torch import nn


class Quadratic(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(4))

    def forward(self, x):
        return (self.w * x).pow(2).sum()


def make(batch=1):
    return Quadratic(), (torch.ones(4),)
"""


def test_a_run_stopped_at_a_nonfinite_loss_goes_on_from_a_checkpoint_before_at_a_smaller_lr(
        tmp_path):
    """With a checkpoint every 2 steps, a run that diverges at step 6 keeps the one after
    step 4 (step 5's loss, of those weights, was finite): what to try names the resume from
    it with a tenth of its --lr. Resumed so (at 0.01: a tenth still diverges here), the run
    goes on, each loss finite, and its report and checkpoint say which steps took which rate
    (the resume was refused before: --lr was part of the checkpoint's identity)."""
    from edge_remat_agent.executor.checkpoint import read_checkpoint
    from edge_remat_agent.run_command import stopped_at_nonfinite
    (tmp_path / "quadratic.py").write_text(QUADRATIC)
    _board_inputs(f"{tmp_path / 'quadratic.py'}:make", tmp_path)
    result, report, _ = _run_job(tmp_path, "stop", steps=8, lr=1e4, checkpoint_every=2,
                                 stop_on_nonfinite=True, out="runs/q")
    assert result["stopped_at_step"] == 6
    assert stopped_at_nonfinite(result, 8) == (
        "stopped at step 6 of 8 (--stop-on-nonfinite): the loss is not finite (inf): training "
        "diverged; try a smaller --lr (this run's is 10000; the same command with `--resume "
        "runs/q --lr 1000` goes on from its checkpoint after step 4) or clipping the gradients "
        "(--clip-grad-norm 1.0 on run or graph); else look for a division by zero or an "
        "overflow in the model's forward")
    (tmp_path / "inputs" / "checkpoint.pt").write_bytes(
        (tmp_path / "stop" / "files" / "checkpoint.pt").read_bytes())
    _, resumed, _ = _run_job(tmp_path, "resumed", steps=8, lr=0.01, checkpoint_every=2,
                             stop_on_nonfinite=True, out="runs/q",
                             resume="inputs/checkpoint.pt")
    assert [s["step"] for s in resumed["steps"]] == [5, 6, 7, 8]
    assert resumed["stopped_at_step"] is None and resumed["summary"]["nonfinite_loss"] is None
    assert resumed["steps"][0]["loss"] == report["steps"][4]["loss"]  # step 5: the same weights
    history = [{"from_step": 1, "lr": 1e4}, {"from_step": 5, "lr": 0.01}]
    assert resumed["optimizer"]["lr_history"] == history
    assert read_checkpoint(tmp_path / "resumed" / "files" / "checkpoint.pt").lr_history == history


def test_a_resumed_run_names_the_step_by_the_run_s_own_count(model, tmp_path):
    """Resumed after step 2, the job's first step is step 3: its report and its progress say
    step 3 (counted from the resumed job's first step, they said step 1)."""
    _board_inputs(model, tmp_path)
    _run_job(tmp_path, "first", checkpoint_every=1, stop_after=2)
    (tmp_path / "inputs" / "checkpoint.pt").write_bytes(
        (tmp_path / "first" / "files" / "checkpoint.pt").read_bytes())
    result, report, records = _run_job(tmp_path, "rest", resume="inputs/checkpoint.pt",
                                       check_gradients=False)
    assert [s["step"] for s in report["steps"]] == [3, 4, 5]
    assert report["summary"]["nonfinite_loss"] == FIRST
    assert records[-1]["data"]["nonfinite_loss"] == FIRST


def test_plain_training_stops_too(model, tmp_path):
    records: list = []
    ctx = JobContext("plain-test", tmp_path / "job", tmp_path, records.append)
    result = plain_train_job(ctx, {"model": model, "steps": STEPS, "lr": LR,
                                   "stop_on_nonfinite": True})
    assert result["stopped_at_step"] == 3 and result["steps"] == 3
    assert result["loss"][2] == float("inf") and result["nonfinite_loss"] == \
        {**FIRST, "count": 1}
    host = build_report(mode="plain", status="stopped", device="bench", model=model,
                        steps=STEPS, result=result)
    assert host["stopped_at_step"] == 3 and host["steps_done"] == 3


# at the optimizer's own lr (SGD 0.01, which the board's own `run` trains at): exp(50 w) with
# w = 1 is 5e21 at step 1, and step 1's update takes w past where exp overflows at step 2
RUNS_AWAY = """
import torch
from torch import nn


class Runaway(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(1, 1)
        with torch.no_grad():
            self.layer.weight.fill_(1.0)
            self.layer.bias.fill_(0.0)

    def forward(self, x):
        return -torch.exp(self.layer(x) * 50).mean()


def make(batch=4):
    return Runaway(), (torch.ones(batch, 1),)
"""


def test_the_boards_own_run_stops_too(tmp_path):
    """`edge-remat-agent run --stop-on-nonfinite`: exit 1 with one error line after the
    report; its report file (-o) written, two steps in it."""
    import subprocess
    import sys
    from helpers.bad_inputs import env
    (tmp_path / "runs_away.py").write_text(RUNS_AWAY)
    _board_inputs(f"{tmp_path / 'runs_away.py'}:make", tmp_path)
    done = subprocess.run([sys.executable, "-m", "edge_remat_agent", "run",
                           "inputs/plan.json", "--graph", "inputs/graph.json", "--steps", "4",
                           "--stop-on-nonfinite", "-o", "report.json"], capture_output=True,
                          text=True, cwd=tmp_path, timeout=300, env=env())
    line = refused(done, 1, "stopped at step 2 of 4 (--stop-on-nonfinite): the loss is not "
                   "finite (-inf)", "this run's is 0.01")
    assert done.stderr.splitlines()[-2].startswith(
        "warning: the loss is not finite (-inf) at step 2: training diverged") and \
        done.stderr.splitlines()[-1] == line
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["stopped_at_step"] == 2 and len(report["steps"]) == 2
    assert "warning      the loss is not finite (-inf) at step 2" in done.stdout


def test_what_to_try_follows_the_options_the_run_did_not_take(model):
    """Clipping is offered only where the gradients are not clipped, fp32 trained parameters
    only under a half-precision model that trains its parameters in it (the graph's capture
    records both), the learning rate always: its optimizer's default where --lr is not given."""
    bf16 = capture_model(model, seed=0, dtype="bf16", clip_grad_norm=1.0).graph.capture
    assert remedy_for(bf16, None).words() == (
        "try a smaller --lr (this run's is 0.01) or training in fp32 rather than bf16 "
        "(--trainable-dtype fp32 with a frozen base, else --dtype fp32; on run or graph); else "
        "look for a division by zero or an overflow in the model's forward")
    # a LoRA model's capture under --dtype bf16 --trainable-dtype fp32 records this much
    mixed = {"source": {"dtype": "bf16", "trainable_dtype": "fp32"}, "clip_grad_norm": 1.0,
             "optimizer": "adam"}
    assert remedy_for(mixed, 2e-4).words().startswith(
        "try a smaller --lr (this run's is 0.0002); else")
    # plain training's params say the same things
    assert remedy_for({"dtype": "fp16", "optimizer": "adamw"}, None).words().startswith(
        "try a smaller --lr (this run's is 0.001), clipping the gradients (--clip-grad-norm 1.0 "
        "on run or graph) or training in fp32 rather than fp16")


@pytest.mark.slow  # a real board round: the agent, profiling, planning, training
# 100%: a budget every graph meets; the profile measured here decides the floor (its kernels'
# scratch), which was 95% of the plain peak in one full-suite run and below 90% in others.
@pytest.mark.parametrize("how", [["--budget", "100%"], ["--plain"]], ids=["planned", "plain"])
def test_run_warns_once_and_its_report_says_so(model, tmp_path, monkeypatch, how):
    _, workdir = local_bench_device(tmp_path, monkeypatch)
    try:
        done = cli("run", "--device", "bench", "--model", model, *how, "--steps", STEPS,
                   "--lr", LR, "--out", tmp_path / "out", "--no-plots", timeout=300)
    finally:
        stop_agent(workdir)
    assert done.returncode == 0, done.stderr
    _assert_warned_once(done.stderr)
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["nonfinite_loss"] == FIRST and report["status"] == "finished"
    assert WARNING in (tmp_path / "out" / "report.txt").read_text()


def _assert_warned_once(stderr: str, remedy: str = REMEDY) -> None:
    """One warning line, as the host first saw the step (one poll may see steps 3 and 4)."""
    import re
    warned = [line for line in stderr.splitlines() if "not finite" in line
              and not line.startswith("error: ")]
    assert len(warned) == 1 and re.fullmatch(
        r"warning: the loss is not finite \(inf\) at step 3( and at \d later steps?)?: "
        r"training diverged \(the model's doing, not the plan's\); " + re.escape(remedy),
        warned[0]), stderr


@pytest.mark.slow  # a real board round, as above
@pytest.mark.parametrize("how", [["--budget", "100%", "--checkpoint-every", "1"], ["--plain"]],
                         ids=["planned", "plain"])
def test_run_stops_at_the_first_nonfinite_loss_when_asked(model, tmp_path, monkeypatch, how):
    """exit 1, one error line naming the step and what to try, after the warning; the report
    written (status stopped) and, with checkpoints, the last one before the step kept. Then
    the same command resumed from it with a smaller --lr: taken (it was refused: --lr was part
    of the checkpoint's identity), and, as what to try said, it repeats step 3's loss; its
    report says which steps took which --lr."""
    _, workdir = local_bench_device(tmp_path, monkeypatch)
    out = tmp_path / "out"
    command = ["run", "--device", "bench", "--model", model, *how, "--steps", STEPS, "--lr",
               LR, "--out", out, "--no-plots", "--stop-on-nonfinite"]
    try:
        done = cli(*command, timeout=300)
        report = json.loads((out / "report.json").read_text())  # before a resume's replaces it
        table = (out / "report.txt").read_text()
        kept = checkpoint_step(out / "checkpoint.pt") if "--plain" not in how else None
        resumed = None if "--plain" in how else \
            cli(*command, "--resume", out, "--lr", 0.01, timeout=300)
    finally:
        stop_agent(workdir)
    remedy = REMEDY if "--plain" in how else from_the_start(out)
    assert refused(done, 1) == f"error: {STOPPED.replace(REMEDY, remedy)}"
    _assert_warned_once(done.stderr, remedy)
    assert report["status"] == "stopped" and report["stopped_at_step"] == 3
    assert report["steps_done"] == 3 and report["nonfinite_loss"] == {**FIRST, "count": 1,
                                                                      "remedy": remedy}
    assert report["message"] == "stopped at step 3 of 5: the loss is not finite " \
        "(--stop-on-nonfinite)"
    assert "stopped at step 3 of 5" in table
    if "--plain" in how:
        return
    assert report["checkpoint"]["step"] == 2 and kept == 2
    assert "is in " + str(out / "checkpoint.pt") in done.stderr
    assert not (out / "weights.pt").exists()  # diverged weights are not saved
    assert "resuming after step 2" in resumed.stderr
    refused(resumed, 1, "stopped at step 3 of 5 (--stop-on-nonfinite)")
    again = json.loads((out / "report.json").read_text())
    assert again["steps_done"] == 1 and again["resumed_after_step"] == 2
    assert again["lr_history"] == [{"from_step": 1, "lr": LR}, {"from_step": 3, "lr": 0.01}]
    assert "\nlr        --lr 1e+06 for steps 1-2, 0.01 from step 3 (--resume with another " \
        "--lr)\n" in (out / "report.txt").read_text()


@pytest.mark.slow  # a real board round: the agent, the plan's run
def test_deploy_stops_too(model, tmp_path, monkeypatch):
    _board_inputs(model, tmp_path)
    _, workdir = local_bench_device(tmp_path, monkeypatch)
    out = tmp_path / "out"
    try:
        done = cli("deploy", tmp_path / "inputs" / "plan.json", "--device", "bench", "--graph",
                   tmp_path / "inputs" / "graph.json", "--steps", STEPS, "--lr", LR,
                   "--out", out, "--stop-on-nonfinite", timeout=300)
        assert refused(done, 1) == f"error: {STOPPED}"
        # Had the link been lost (a run's report then says link_lost), the way back reads
        # the stopped job as stopped, not finished (run/come_back.py)
        job = next((workdir / "jobs").glob("run-*")).name  # the deploy's job, on the board
        lost = tmp_path / "lost"
        (lost / "board").mkdir(parents=True)
        (lost / "report.json").write_text(json.dumps({"status": "link_lost", "job": job,
                                                      "message": "cannot reach bench"}))
        back = cli("job-status", job, "--device", "bench", "--wait", "--out", lost / "board")
    finally:
        stop_agent(workdir)
    _assert_warned_once(done.stderr)
    report = json.loads((out / "run_report.json").read_text())
    assert report["stopped_at_step"] == 3 and len(report["steps"]) == 3
    assert "warning      the loss is not finite (inf) at step 3: training" in done.stdout
    assert back.returncode == 0, back.stderr
    settled = json.loads((lost / "report.json").read_text())
    assert settled["status"] == "stopped" and settled["job_state"] == "finished", settled
    assert settled["board_report"] == str(lost / "board" / "run_report.json")
    # and its steps, as `run` would have said them (QA: steps_done and loss were missing)
    assert settled["steps_done"] == 3 and settled["stopped_at_step"] == 3, settled
    assert settled["loss"][:2] == [step["loss"] for step in report["steps"][:2]]
    assert settled["nonfinite_loss"]["step"] == 3 and settled["measured_peak_bytes"] > 0
