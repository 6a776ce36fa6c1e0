"""Run jobs the board's agent daemon restarts, and jobs SIGKILLed on the board: a job its
daemon restarted mid-job goes on from its own checkpoint and reports every step; one
restarted after its last step's checkpoint saves its outputs without training again;
`deploy --resume` after a job SIGKILLed on the board; `run` says where a SIGKILLed job's
checkpoint is and resumes from it. (Split from test_resume.py, so that pytest-xdist's
loadfile puts the two halves on two workers.)"""

from __future__ import annotations

import json

import pytest
from helpers.resume_runs import GPT, assert_same_outputs, planned


# Stops the board's agent daemon (SIGTERM, as `agent-stop` does: it stops the job and queues it
# again) or kills it with the job process (SIGKILL: its next start queues the job again), the
# first time only: a data module's text for the job process to load (tests below).
STOP_THE_DAEMON_ONCE = '''import os
import signal
import time
from pathlib import Path

HOW = "stop"
MARKER = Path(__file__).with_suffix(".stopped")


def stop_the_daemon_once():
    if MARKER.exists():
        return
    MARKER.write_text("stopped")
    if HOW == "kill":
        os.kill(os.getppid(), signal.SIGKILL)  # the job process's parent: the daemon
        os.kill(os.getpid(), signal.SIGKILL)
    os.kill(os.getppid(), signal.SIGTERM)
    time.sleep(30)  # the daemon's SIGTERM to this job ends it before
'''


def stopping_once(how: str, module: str) -> str:
    """A data module's text: `module` with stop_the_daemon_once() (HOW: stop or kill)."""
    head = STOP_THE_DAEMON_ONCE.replace('HOW = "stop"', f'HOW = "{how}"')
    return f"{head}\n{module}"


def _stopped_once_and_not(tmp_path, module: str, steps: int):
    """On the local board "bench" (the caller's local_board), gpt-tiny for `steps` steps
    drawing from `module` (stopping_once's text): once uninterrupted (its folder
    tmp_path/whole), then with the daemon stopped, then killed, once each (folders
    tmp_path/stop, tmp_path/kill). Yields (how, the uninterrupted run's result, the restarted
    run's, the lines the host said) for each."""
    from edge_remat.run import RunOptions, run
    for how in ("stop", "kill"):
        data = tmp_path / f"{how}_once.py"
        data.write_text(stopping_once(how, module))
        options = {**GPT, "data": f"{data}:batches", "steps": steps}
        if how == "stop":
            data.with_suffix(".stopped").write_text("the uninterrupted run is not stopped")
            uninterrupted = run(RunOptions(out=str(tmp_path / "whole"), **options))
            data.with_suffix(".stopped").unlink()
        said: list = []
        restarted = run(RunOptions(out=str(tmp_path / how), **options), say=said.append)
        yield how, uninterrupted, restarted, said


STOP_AT_BATCH = '''"""The bundled text, but drawing batch STOP_AT stops the daemon once."""
from edge_remat_agent.data.text import text_batches

STOP_AT = 5  # step 6's batch


def batches(batch, seed):
    for index, args in enumerate(text_batches(batch, 16, seed)):
        if index == STOP_AT:
            stop_the_daemon_once()
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
    whole = tmp_path / "whole"
    with local_board(tmp_path, "bench"):
        for how, uninterrupted, restarted, said in _stopped_once_and_not(
                tmp_path, STOP_AT_BATCH, steps=8):
            part = tmp_path / how
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
            assert_same_outputs(whole, part)


STOP_AFTER_LAST_CHECKPOINT = '''"""The bundled text; and, once, right after the job has written the
checkpoint of its last step, before it saves its weights and report (a window too short to
hit by timing), the daemon is stopped or killed. A job process loads this module to draw its
batches: it wraps the executor's checkpoint writer there (the host, which loads it too, is
left alone)."""
import sys

from edge_remat_agent.data.text import text_batches
from edge_remat_agent.executor import run

write_checkpoint = run.write_checkpoint


def write_then_stop(path, module, home, optimizer, steps_done, batches_taken, steps, *args):
    figures = write_checkpoint(path, module, home, optimizer, steps_done, batches_taken, steps,
                               *args)
    if steps_done == steps:
        stop_the_daemon_once()
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
    whole = tmp_path / "whole"
    with local_board(tmp_path, "bench"):
        for how, uninterrupted, restarted, said in _stopped_once_and_not(
                tmp_path, STOP_AFTER_LAST_CHECKPOINT, steps=4):
            part = tmp_path / how
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
            assert_same_outputs(whole, part)


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
    captured, plan = planned("ram")
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
    assert_same_outputs(whole, part)


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
