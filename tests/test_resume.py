"""Checkpoints (--checkpoint-every) and resuming (--resume): a run of 6 steps and a run of 3
steps resumed for 3 more end bit for bit the same (parameters, optimizer state, losses), with
AdamW, a cosine schedule with warmup, real data and dropout; with parameters and optimizer
state homed on flash; with gradient accumulation. Then the same through `edge-remat run` on a
local board, a run killed by its memory limit resumed from its last checkpoint, a run job its
board's daemon restarted mid-job going on from its own checkpoint and reporting every step,
one restarted after its last step's checkpoint saving its outputs without training again,
`deploy --resume` after a job SIGKILLed on the board, and the refusals of options and files a
resume cannot go on from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers.executor_plans import problem_near_floor

from edge_remat_agent.capture import capture_model
from edge_remat_agent.executor.checkpoint import Checkpointing, read_checkpoint
from edge_remat_agent.executor.errors import BadInput
from edge_remat_agent.executor.run import run_plan
from edge_remat_agent.formats import Tier
from edge_remat.planner.solve import solve

FLASH = {"flash": Tier(read_bytes_per_s=5e8, write_bytes_per_s=2e8, latency_s=1e-4)}
TRAINING = dict(lr_schedule="cosine", warmup=2, seed=0)
IDENTITY = {"--model": "gpt-tiny", "--optimizer": "adamw"}


def _planned(home: str, accumulate: int = 1):
    """gpt-tiny (dropout 0.1) for AdamW, captured afresh (the run trains its module), and a
    plan that recomputes and pages near the floor."""
    captured = capture_model("gpt-tiny", batch=2, seq=16, optimizer="adamw", params_home=home,
                             refined=False, accumulate=accumulate)
    plan = solve(problem_near_floor(captured.graph, 0.5, "flash", FLASH),
                 "heuristic:paging").plan
    return captured, plan


def _run(tmp_path: Path, name: str, home: str, steps: int, accumulate: int = 1,
         stop_after: int | None = None, resume: Path | None = None, every: int = 2):
    captured, plan = _planned(home, accumulate)
    checkpoint = tmp_path / f"{name}.pt"
    if resume is not None:
        checkpoint.write_bytes(resume.read_bytes())  # the next part replaces it
    checkpointing = Checkpointing(path=checkpoint, every=every, identity=IDENTITY,
                                  stop_after=stop_after,
                                  resume=read_checkpoint(checkpoint) if resume else None)
    report = run_plan(captured.graph, plan, steps, str(tmp_path / f"pages-{name}"),
                      captured=captured, data="text", keep_parameters=True,
                      checkpointing=checkpointing, **TRAINING)
    return report, captured.module.state_dict(), checkpoint


def _assert_same_checkpoint(mine: Path, theirs: Path) -> None:
    a, b = torch.load(mine), torch.load(theirs)
    assert a.keys() == b.keys()
    assert any(k.startswith("optimizer/") and k.endswith("exp_avg_sq") for k in a)
    for key in a:
        if isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key], b[key]), key
    assert a["checkpoint"]["steps_done"] == b["checkpoint"]["steps_done"]


def _assert_same_outputs(whole: Path, part: Path) -> None:
    """An uninterrupted run's folder and a resumed one's: the same checkpoint and weights."""
    _assert_same_checkpoint(whole / "checkpoint.pt", part / "checkpoint.pt")
    theirs = torch.load(part / "weights.pt")
    for name, value in torch.load(whole / "weights.pt").items():
        assert torch.equal(value, theirs[name]), name


@pytest.mark.slow
@pytest.mark.parametrize("home,accumulate", [("ram", 1), ("flash", 1), ("flash", 2)],
                         ids=["ram", "flash", "flash-accumulate"])
def test_six_steps_equal_three_then_three_resumed(tmp_path, home, accumulate):
    whole, whole_params, whole_checkpoint = _run(tmp_path, "whole", home, 6, accumulate)
    first, _, first_checkpoint = _run(tmp_path, "first", home, 6, accumulate, stop_after=3)
    second, second_params, second_checkpoint = _run(tmp_path, "second", home, 6, accumulate,
                                                    resume=first_checkpoint)
    assert [s["step"] for s in first["steps"]] == [1, 2, 3]
    assert [s["step"] for s in second["steps"]] == [4, 5, 6]
    losses = [s["loss"] for s in first["steps"] + second["steps"]]
    assert losses == [s["loss"] for s in whole["steps"]]
    assert whole_params.keys() == second_params.keys()
    for name in whole_params:
        assert torch.equal(whole_params[name], second_params[name]), name
    _assert_same_checkpoint(whole_checkpoint, second_checkpoint)
    assert second["checkpoint"]["resumed_from_step"] == 3
    assert whole["checkpoint"]["written"] == 3  # after steps 2, 4 and the last, 6
    assert second["grad_check"]["bitwise_equal"] is True  # checked on its first step, 4
    # not merely the same file: resuming without the optimizer state goes elsewhere
    state = torch.load(first_checkpoint)
    assert any(k.startswith("optimizer/") for k in state)


@pytest.mark.slow
def test_the_resumed_run_refuses_a_checkpoint_of_other_options(tmp_path):
    _, _, checkpoint = _run(tmp_path, "first", "ram", 4, stop_after=2)
    captured, plan = _planned("ram")
    resume = read_checkpoint(checkpoint)
    with pytest.raises(BadInput, match="--optimizer adamw, this run has sgd"):
        run_plan(captured.graph, plan, 4, str(tmp_path / "p"), captured=captured,
                 checkpointing=Checkpointing(identity={**IDENTITY, "--optimizer": "sgd"},
                                             resume=resume))
    with pytest.raises(BadInput, match="after step 2, and this run would stop at step 2"):
        run_plan(captured.graph, plan, 2, str(tmp_path / "p"), captured=captured,
                 checkpointing=Checkpointing(identity=IDENTITY, resume=resume))


def test_a_damaged_or_foreign_checkpoint_is_one_line(tmp_path):
    damaged = tmp_path / "damaged.pt"
    damaged.write_bytes(b"PK\x03\x04 not a zip at all")
    with pytest.raises(BadInput, match="is not a checkpoint torch.load reads"):
        read_checkpoint(damaged)
    weights = tmp_path / "weights.pt"
    torch.save({"w": torch.zeros(2)}, weights)
    with pytest.raises(BadInput, match="is no edge-remat checkpoint"):
        read_checkpoint(weights)
    with pytest.raises(BadInput, match="no checkpoint at"):
        read_checkpoint(tmp_path / "missing.pt")


# -- through `edge-remat run` on a local board -------------------------------------------------

REPO = Path(__file__).resolve().parents[1]
QUICK = dict(profile=str(REPO / "profiles" / "this-machine.json"), plots=False, time_limit=3)
GPT = dict(device="bench", model="gpt-tiny", batch=2, seq=16, optimizer="adamw", data="text",
           lr_schedule="cosine", warmup=2, budget="70%", params_home="flash", paging="flash",
           checkpoint_every=2, **QUICK)


def _losses(report: dict) -> list:
    return report["loss"]


@pytest.mark.slow
@pytest.mark.loopback
def test_run_resumed_from_the_board_equals_the_uninterrupted_run(tmp_path):
    """`run --steps 6` against `run --steps 6 --stop-after 3` then `run --resume OUT`, with
    the host's copy of the checkpoint gone (a host that never got it): the board's is found,
    fetched, checked and read where it lies."""
    from helpers.board_fixtures import local_board
    from edge_remat.run import RunOptions, run
    whole, part = tmp_path / "whole", tmp_path / "part"
    with local_board(tmp_path, "bench"):
        uninterrupted = run(RunOptions(steps=6, out=str(whole), **GPT))
        first = run(RunOptions(steps=6, stop_after=3, out=str(part), **GPT))
        assert first["checkpoint"]["step"] == 3 and (part / "checkpoint.pt").is_file()
        (part / "checkpoint.pt").unlink()
        said = []
        second = run(RunOptions(steps=6, resume=str(part), **GPT), say=said.append)
    assert any("fetching the checkpoint of job" in line for line in said), said
    assert second["message"] == "finished steps 4..6 (3 steps, resumed after step 3)"
    table = (part / "report.txt").read_text()
    assert "\n   4  " in table and "\n   6  " in table and "\n   1  " not in table, table
    assert _losses(first) + _losses(second) == _losses(uninterrupted)
    _assert_same_outputs(whole, part)


@pytest.mark.slow
@pytest.mark.loopback
def test_a_resume_with_other_options_or_a_bad_checkpoint_is_refused_in_one_line(tmp_path):
    from typer.testing import CliRunner
    from helpers.board_fixtures import local_board
    from edge_remat.cli import app
    from edge_remat.run import RunOptions, run
    part = tmp_path / "part"
    with local_board(tmp_path, "bench"):
        run(RunOptions(steps=4, stop_after=2, out=str(part), **GPT))
        common = ["run", "--device", "bench", "--model", "gpt-tiny", "--seq", "16",
                  "--optimizer", "adamw", "--data", "text", "--lr-schedule", "cosine",
                  "--warmup", "2", "--budget", "70%", "--params-home", "flash", "--paging",
                  "flash", "--profile", QUICK["profile"], "--no-plots", "--resume", str(part)]
        cases = [(["--batch", "4", "--steps", "4"], "had --batch 2, this run has 4"),
                 (["--batch", "2", "--steps", "5"], "had --steps 4, this run has 5"),
                 (["--batch", "2", "--steps", "4", "--out", str(tmp_path / "other")],
                  "leave out --out"),
                 (["--batch", "2", "--steps", "4", "--stop-after", "2"],
                  f"--resume {part}: the run there is complete (its checkpoint is after step "
                  "2, the last of this run): to train on, give --stop-after more than 2")]
        runner = CliRunner()
        for extra, words in cases:
            result = runner.invoke(app, common + extra)
            assert result.exit_code == 2, result.output
            assert words in result.output and "Traceback" not in result.output
        (part / "checkpoint.pt").write_bytes(b"not a checkpoint")
        (part / "checkpoint.json").unlink()  # the board's copy is not looked for
        result = runner.invoke(app, common + ["--batch", "2", "--steps", "4"])
        assert result.exit_code == 2 and "is not a checkpoint torch.load reads" in \
            result.output, result.output
        result = runner.invoke(app, common[:-1] + [str(tmp_path / "none"), "--batch", "2"])
        assert result.exit_code == 2 and "no such folder" in result.output, result.output
        # deploy --checkpoint-every: the last checkpoint comes back beside the report
        result = runner.invoke(app, ["deploy", str(part / "plan.json"), "--graph",
                                     str(part / "graph.json"), "--device", "bench", "--steps",
                                     "3", "--checkpoint-every", "2", "--data", "text",
                                     "--out", str(tmp_path / "deployed")])
    assert result.exit_code == 0, result.output
    assert read_checkpoint(tmp_path / "deployed" / "checkpoint.pt").steps_done == 3


KILL_ONCE = '''"""The bundled text, but drawing batch KILL_AT takes more memory than the board's
limit (and the kernel kills the run), once: the marker file beside it says it did."""
from pathlib import Path

from edge_remat_agent.data.text import text_batches

KILL_AT = 5  # step 6's batch
MARKER = Path(__file__).with_suffix(".killed")


def batches(batch, seed):
    for index, args in enumerate(text_batches(batch, 16, seed)):
        if index == KILL_AT and not MARKER.exists():
            MARKER.write_text("killed")
            hog = b"\\x01" * (4 << 30)  # every page written: charged to the memory cgroup
        yield args
'''


@pytest.mark.slow
@pytest.mark.loopback
@pytest.mark.cgroup
def test_a_run_killed_by_its_memory_limit_at_step_6_resumes_from_step_4_and_ends_as_the_uninterrupted(
        tmp_path):
    from helpers.board_fixtures import local_board
    from edge_remat.cgroup import unavailable_reason
    from edge_remat.run import RunOptions, run
    if unavailable_reason() is not None:
        pytest.skip(f"no memory cgroup: {unavailable_reason()}")
    data = tmp_path / "kill_once.py"
    data.write_text(KILL_ONCE)
    options = {**GPT, "data": f"{data}:batches", "steps": 8}
    whole, part = tmp_path / "whole", tmp_path / "part"
    with local_board(tmp_path, "bench", memory_limit_bytes=1024 * 2**20):
        data.with_suffix(".killed").write_text("the uninterrupted run is not killed")
        uninterrupted = run(RunOptions(out=str(whole), **options))
        data.with_suffix(".killed").unlink()
        said = []
        killed = run(RunOptions(out=str(part), **options), say=said.append)
        # batch 6 may be drawn ahead while step 5 runs (the suite's run once said step 5):
        # either way the last checkpoint is step 4's and the resumed run starts from it
        assert killed["status"] == "killed" and killed["killed_at_step"] in (5, 6), \
            killed["message"]
        assert killed["message"].startswith("killed by the memory limit at step ")
        assert killed["checkpoint"]["step"] == 4  # fetched from the killed job's files
        assert any(f"--resume {part} goes on" in line for line in said), said
        resumed = run(RunOptions(resume=str(part), **options))
    assert resumed["status"] == "finished"
    assert resumed["loss"] == uninterrupted["loss"][4:]  # steps 5 to 8
    _assert_same_checkpoint(whole / "checkpoint.pt", part / "checkpoint.pt")


def test_the_training_identity_holds_the_trainable_dtype():
    """Mixed precision (`--trainable-dtype fp32`) trains other adapter weights and optimizer
    state than `--dtype bf16` alone: a resume across the two is named, not tried."""
    from edge_remat.run import RunOptions
    from edge_remat.run.resume import training_identity
    from edge_remat_agent.executor.save_choice import identity_mismatch
    lora = dict(device="bench", model="gpt-tiny-lora", dtype="bf16", **QUICK)
    mixed = training_identity(RunOptions(trainable_dtype="fp32", **lora))
    said = identity_mismatch(mixed, training_identity(RunOptions(**lora)))
    assert said is not None and said.startswith(
        "the checkpoint's run had --trainable-dtype fp32, this run has (not given)")


STOP_DAEMON_ONCE = '''"""The bundled text, but drawing batch STOP_AT stops the board's agent
daemon (SIGTERM, as `agent-stop` does: it stops the job and queues it again) or kills it and
this job process (SIGKILL: its next start queues the job again), once."""
import os
import signal
import time
from pathlib import Path

from edge_remat_agent.data.text import text_batches

STOP_AT = 5  # step 6's batch
HOW = "stop"
MARKER = Path(__file__).with_suffix(".stopped")


def batches(batch, seed):
    for index, args in enumerate(text_batches(batch, 16, seed)):
        if index == STOP_AT and not MARKER.exists():
            MARKER.write_text("stopped")
            if HOW == "kill":
                os.kill(os.getppid(), signal.SIGKILL)  # the job process's parent: the daemon
                os.kill(os.getpid(), signal.SIGKILL)
            os.kill(os.getppid(), signal.SIGTERM)
            time.sleep(30)  # the daemon's SIGTERM to this job ends it before
        yield args
'''


@pytest.mark.slow
@pytest.mark.loopback
def test_a_run_job_its_daemon_restarts_mid_job_goes_on_from_its_own_checkpoint(tmp_path):
    """The daemon stopped (or killed with the job process) while the job trains step 5 or 6
    queues it again; the host's reconnect starts the daemon, which runs the job again: from
    its checkpoint after step 4, not step 0, ending as the uninterrupted run (before, the job
    began again at step 1). Its report holds all 8 steps, steps 1-4 from the first start (kept
    in the checkpoint), each marked with its start, and the step time's median leaves each
    start's first step out (before, it held steps 5-8 alone)."""
    from helpers.board_fixtures import local_board
    from edge_remat.run import RunOptions, run
    whole = tmp_path / "whole"
    with local_board(tmp_path, "bench"):
        for how in ("stop", "kill"):
            data = tmp_path / f"{how}_once.py"
            data.write_text(STOP_DAEMON_ONCE.replace('HOW = "stop"', f'HOW = "{how}"'))
            options = {**GPT, "data": f"{data}:batches", "steps": 8}
            if how == "stop":
                data.with_suffix(".stopped").write_text("the uninterrupted run is not stopped")
                uninterrupted = run(RunOptions(out=str(whole), **options))
                data.with_suffix(".stopped").unlink()
            said, part = [], tmp_path / how
            restarted = run(RunOptions(out=str(part), **options), say=said.append)
            assert any("restarted mid-job; job run-" in line and line.endswith(
                "resumed from step 4 (its newest checkpoint)") for line in said), (how, said)
            assert restarted["status"] == "finished", restarted["message"]
            assert restarted["message"] == ("finished 8 steps (the board's daemon restarted "
                                            "the job: steps 1-4 in start 1, 5-8 in start 2)")
            assert restarted["loss"] == uninterrupted["loss"]
            assert restarted["job_start"] == [1] * 4 + [2] * 4
            assert all(isinstance(t, float) and t > 0 for t in restarted["step_time_s"])
            assert any("median of steps 2-4, 6-8 (the first step of each of the job's 2 "
                       "starts left out)" in miss for miss in restarted["misses"]), \
                restarted["misses"]
            table = (part / "report.txt").read_text()
            assert "\n   1  " in table and "\n   8  " in table, table
            assert "starts    the board's daemon restarted the job: steps 1-4 in start 1, " \
                "5-8 in start 2" in table, table
            records = json.loads((part / "board" / "run_report.json").read_text())
            assert records["summary"]["steps"] == 8
            assert records["checkpoint"]["starts"] == [
                {"start": 1, "after_step": 0, "steps": 4},
                {"start": 2, "after_step": 4, "steps": 4}]
            assert records["grad_check"]["bitwise_equal"] is True
            _assert_same_outputs(whole, part)


STOP_AFTER_LAST_CHECKPOINT = '''"""The bundled text; and, once, right after the job has written the
checkpoint of its last step, before it saves its weights and report (a window too short to
hit by timing), the board's agent daemon is stopped (SIGTERM, as `agent-stop` does) or killed
with this job process (SIGKILL). A job process loads this module to draw its batches: it
wraps the executor's checkpoint writer there (the host, which loads it too, is left alone)."""
import os
import signal
import sys
import time
from pathlib import Path

from edge_remat_agent.data.text import text_batches
from edge_remat_agent.executor import run

HOW = "stop"
MARKER = Path(__file__).with_suffix(".stopped")
write_checkpoint = run.write_checkpoint


def write_then_stop(path, module, home, optimizer, steps_done, batches_taken, steps, *args):
    figures = write_checkpoint(path, module, home, optimizer, steps_done, batches_taken, steps,
                               *args)
    if steps_done == steps and not MARKER.exists():
        MARKER.write_text("stopped")
        if HOW == "kill":
            os.kill(os.getppid(), signal.SIGKILL)  # the job process's parent: the daemon
            os.kill(os.getpid(), signal.SIGKILL)
        os.kill(os.getppid(), signal.SIGTERM)
        time.sleep(30)  # the daemon's SIGTERM to this job ends it before
    return figures


if "_run-job" in sys.argv:  # the daemon's job process
    run.write_checkpoint = write_then_stop


def batches(batch, seed):
    yield from text_batches(batch, 16, seed)
'''


@pytest.mark.slow
@pytest.mark.loopback
def test_a_run_job_restarted_after_its_last_checkpoint_saves_its_outputs_without_training(
        tmp_path):
    """The daemon stopped (or killed with the job process) after the job wrote its checkpoint
    after step 4 of 4, before it saved its weights and report: the job started again trains
    nothing and ends as the uninterrupted run (its weights from that checkpoint, its report of
    the 4 steps the first start trained, saying so). Before, it began again at step 1."""
    from helpers.board_fixtures import local_board
    from edge_remat.run import RunOptions, run
    whole = tmp_path / "whole"
    with local_board(tmp_path, "bench"):
        for how in ("stop", "kill"):
            data = tmp_path / f"{how}_once.py"
            data.write_text(STOP_AFTER_LAST_CHECKPOINT.replace('HOW = "stop"',
                                                               f'HOW = "{how}"'))
            options = {**GPT, "data": f"{data}:batches", "steps": 4}
            if how == "stop":
                data.with_suffix(".stopped").write_text("the uninterrupted run is not stopped")
                uninterrupted = run(RunOptions(out=str(whole), **options))
                data.with_suffix(".stopped").unlink()
            said, part = [], tmp_path / how
            restarted = run(RunOptions(out=str(part), **options), say=said.append)
            assert any("restarted mid-job; job run-" in line and line.endswith(
                "had trained all its steps before (its checkpoint is after step 4, its last): "
                "it saves its outputs from that checkpoint without training again")
                for line in said), (how, said)
            assert restarted["status"] == "finished", restarted["message"]
            assert restarted["message"] == (
                "finished 4 steps (the board's daemon restarted the job: steps 1-4 in start 1; "
                "start 2 trained nothing (the checkpoint after step 4 was the last step's) and "
                "saved the outputs from it)")
            assert restarted["loss"] == uninterrupted["loss"]
            assert restarted["job_start"] == [1] * 4
            report = json.loads((part / "board" / "run_report.json").read_text())
            assert report["checkpoint"]["written"] == 0  # nothing trained, nothing written
            assert report["checkpoint"]["restarted_after_step"] == 4
            assert restarted["checkpoint"]["step"] == 4
            assert report["grad_check"]["bitwise_equal"] is True  # the first start's
            assert restarted["weights"]["tensors"] == uninterrupted["weights"]["tensors"]
            _assert_same_outputs(whole, part)


KILL_JOB_ONCE = '''"""The bundled text, but drawing batch KILL_AT SIGKILLs the job process (a
person or a program on the board, not the memory limit), once."""
import os
import signal
from pathlib import Path

from edge_remat_agent.data.text import text_batches

KILL_AT = 3  # step 4's batch: the last checkpoint is step 2's


def batches(batch, seed):
    marker = Path(__file__).with_suffix(".killed")
    for index, args in enumerate(text_batches(batch, 16, seed)):
        if index == KILL_AT and not marker.exists():
            marker.write_text("killed")
            os.kill(os.getpid(), signal.SIGKILL)
        yield args
'''


@pytest.mark.slow
@pytest.mark.loopback
def test_deploy_resumes_a_job_sigkilled_on_the_board_and_refuses_other_options(tmp_path):
    """`deploy --checkpoint-every 2` whose job is SIGKILLed at step 3 or 4 (not by a memory
    limit): `deploy --resume OUT` finds its checkpoint after step 2 on the board (through
    OUT/checkpoint.json) and ends as the uninterrupted deploy; other lr options or data are
    refused in one line, exit 2, naming the option."""
    from typer.testing import CliRunner
    from helpers.board_fixtures import local_board
    from edge_remat.cli import app
    captured, plan = _planned("ram")
    graph_path, plan_path = tmp_path / "graph.json", tmp_path / "plan.json"
    captured.graph.save(graph_path)
    plan.save(plan_path)
    data = tmp_path / "kill_once.py"
    data.write_text(KILL_JOB_ONCE)
    whole, part = tmp_path / "whole", tmp_path / "part"
    common = ["deploy", str(plan_path), "--graph", str(graph_path), "--device", "bench",
              "--steps", "6", "--lr-schedule", "cosine", "--warmup", "2", "--data",
              f"{data}:batches"]
    runner = CliRunner()
    with local_board(tmp_path, "bench"):
        data.with_suffix(".killed").write_text("the uninterrupted deploy is not killed")
        result = runner.invoke(app, common + ["--checkpoint-every", "2", "--out", str(whole)])
        assert result.exit_code == 0, result.output
        data.with_suffix(".killed").unlink()
        result = runner.invoke(app, common + ["--checkpoint-every", "2", "--out", str(part)])
        assert result.exit_code != 0 and "SIGKILL" in result.output, result.output
        assert f"its last checkpoint stays on bench: the same command with --resume {part} " \
            "goes on from it" in result.output, result.output
        assert not (part / "checkpoint.pt").exists()
        for extra, words in [(["--warmup", "1"], "had --warmup 2, this run has 1"),
                             (["--data", "text"], "had --data " + f"{data}:batches")]:
            result = runner.invoke(app, common + extra + ["--resume", str(part)])
            assert result.exit_code == 2, result.output
            assert words in result.output and "Traceback" not in result.output, result.output
        result = runner.invoke(app, common + ["--resume", str(part), "--json"])
    assert result.exit_code == 0, result.output
    assert "resuming after step 2" in result.output, result.output
    resumed = json.loads(result.stdout.strip().splitlines()[-1])["result"]
    assert resumed["checkpoint"]["resumed_from_step"] == 2 and resumed["steps"] == 4
    before = json.loads((whole / "run_report.json").read_text())["steps"]
    after = json.loads((part / "run_report.json").read_text())["steps"]
    assert [s["loss"] for s in after] == [s["loss"] for s in before][2:]
    _assert_same_outputs(whole, part)


@pytest.mark.slow
@pytest.mark.loopback
def test_a_run_sigkilled_on_the_board_says_and_resumes_from_the_boards_checkpoint(tmp_path):
    """A run job SIGKILLed by something else than the memory limit fails (not a killed
    report, no checkpoint fetched), saying its checkpoint stays on the board; --resume finds
    it there through OUT/checkpoint.json and runs the steps after it."""
    from helpers.board_fixtures import local_board
    from edge_remat.run import RunOptions, run
    from edge_remat.transport import JobFailed
    data = tmp_path / "kill_once.py"
    data.write_text(KILL_JOB_ONCE)
    options = {**GPT, "data": f"{data}:batches", "steps": 6}
    part = tmp_path / "part"
    with local_board(tmp_path, "bench"):
        with pytest.raises(JobFailed, match=f"stays on bench: the same command with --resume "
                                            f"{part} goes on from it"):
            run(RunOptions(out=str(part), **options))
        assert not (part / "checkpoint.pt").exists()
        said = []
        resumed = run(RunOptions(resume=str(part), **options), say=said.append)
    assert any("fetching the checkpoint of job" in line for line in said), said
    assert resumed["message"] == "finished steps 3..6 (4 steps, resumed after step 2)"
