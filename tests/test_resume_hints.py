"""What a stopped run or deploy says of its way on (QA, 2026-12-07): a job cancelled from
another terminal names the checkpoint --resume goes on from, as a Ctrl-C's does; deploy's
"still running" refusal names deploy's --out (its folder holds the job's files), not run's
OUT/board; a resume on another board than the one holding the checkpoint says where it is
and how to go on, not "run it again without --resume"; a stopped run's report lists the
profile it fetched. The whole CLI way of a cancel: test_bad_inputs_interrupts.py."""

from __future__ import annotations

import json
import time

import pytest

from edge_remat.run.options import RunOptions, RunProblem


class _Board:
    """A board as resume.py asks it: its name, its files (stat) and jobs (none here)."""

    def __init__(self, name: str, files: "set[str]" = frozenset()):
        self.name, self.files = name, set(files)

    def stat(self, remote: str, with_hash: bool = True) -> dict:
        return {"exists": remote in self.files}


def test_a_job_cancelled_elsewhere_names_the_checkpoint_to_resume_from(tmp_path):
    """QA: `job-cancel` from another terminal ended the run 130 "...was cancelled by the
    host: it did not finish; run it again to have its results", no resume hint, though
    --resume OUT went on from its checkpoint."""
    from edge_remat.run.resume import with_resume_hint
    from edge_remat.transport.errors import JobFailed, cancelled_by_host, job_failed
    from edge_remat_agent.daemon.worker import CANCELLED
    record = {"id": "run-1", "state": "failed", "error": CANCELLED}
    failed = job_failed(record, "job run-1 (run)", "bench")
    board = _Board("bench", {"jobs/run-1/files/checkpoint.pt"})
    hinted = with_resume_hint(failed, board, tmp_path / "rcan", "run-1")
    assert isinstance(hinted, JobFailed) and cancelled_by_host(hinted.record)  # still 130
    line = str(hinted)
    assert line.startswith("job run-1 (run) on bench was cancelled by the host: it did not "
                           "finish"), line
    assert (f"its last checkpoint stays on bench: the same command with --resume "
            f"{tmp_path / 'rcan'} goes on from it") in line, line
    assert "run it again to have its results" not in line, line  # which threw progress away
    # no checkpoint left: the error as it was
    assert str(with_resume_hint(failed, _Board("bench"), tmp_path, "run-1")) == str(failed)


def test_deploys_still_running_refusal_names_deploys_out(tmp_path):
    """QA: `deploy ... --resume dll` beside its job still running said "job-status ... --wait
    --out dll/board comes back for it"; that put the outputs in dll/board, and deploy
    --resume dll then said its outputs were not in dll."""
    from helpers.board_fixtures import local_board

    from edge_remat.devices import find_device
    from edge_remat.run.resume import note_job, start_resume
    from edge_remat.transport import Board
    from edge_remat_agent.wire.protocol import TERMINAL_STATES
    out = tmp_path / "dll"
    out.mkdir()
    opts = RunOptions(device="bench", model="mlp", steps=4, resume=str(out))
    with local_board(tmp_path, "bench"), Board(find_device("bench")) as board:
        job = board.submit("sleep", {"seconds": 60, "steps": 60}, None)["id"]
        try:
            note_job(out, job, board.name, 2, resumed=False)
            with pytest.raises(RunProblem) as deployed:  # deploy's identity has --graph
                start_resume(board, opts, out, print, {"--graph": "abc"})
            assert f"`edge-remat job-status {job} --device bench --wait --out {out}`" \
                in str(deployed.value), deployed.value
            with pytest.raises(RunProblem) as ran:  # run's: its job's files in OUT/board
                start_resume(board, opts, out, print)
            assert f"--wait --out {out / 'board'}`" in str(ran.value), ran.value
        finally:
            board.cancel(job)
            deadline = time.monotonic() + 60
            while board.job(job)["state"] not in TERMINAL_STATES and \
                    time.monotonic() < deadline:
                time.sleep(0.2)


def test_a_resume_on_another_board_says_where_its_checkpoint_is(tmp_path):
    """QA: deploy interrupted on `loop` ("its last checkpoint stays on loop"), then `deploy
    ... --device local --resume dx` said "no checkpoint there nor on local (... run it again
    without --resume)": advice that threw the progress away, dx/checkpoint.json naming the
    job on loop."""
    from edge_remat.run.resume import find_checkpoint, note_job
    note_job(tmp_path, "run-1", "loop", 2, resumed=False)
    note_job(tmp_path, "run-2", "loop", 2, resumed=True)
    with pytest.raises(RunProblem) as refused:
        find_checkpoint(_Board("local"), tmp_path, print)
    line = str(refused.value)
    assert "without --resume" not in line, line
    assert line.startswith(f"--resume {tmp_path}: no checkpoint there nor on local; its jobs "
                           "ran on loop (run-2, run-1), which keeps their checkpoints: the same "
                           "command with --device loop goes on from there"), line
    assert f"{tmp_path / 'checkpoint.pt'}" in line, line  # where that resume brings it
    # a record of no job (or of this board's alone): as it was
    with pytest.raises(RunProblem, match="run it again without --resume"):
        find_checkpoint(_Board("local"), tmp_path / "none", print)


def test_a_stopped_runs_report_lists_the_profile_it_fetched(tmp_path):
    """QA: a link_lost run's line said "beside what the run wrote before it stopped:
    graph.json, plan.json", leaving out profile/profile.json, which it had written too."""
    from edge_remat.run.orchestrate import _report_stopped
    out = tmp_path / "run"
    (out / "profile").mkdir(parents=True)
    for name in ("graph.json", "plan.json", "profile/profile.json"):
        (out / name).write_text("{}")
    opts = RunOptions(device="bench", model="mlp", steps=4)
    where = _report_stopped("link_lost", "gave up", {"job": "run-1"}, opts, out)
    assert where.endswith("beside what the run wrote before it stopped: graph.json, "
                          "plan.json, profile/profile.json"), where
    report = json.loads((out / "report.json").read_text())
    assert report["written"] == [str(out / "graph.json"), str(out / "plan.json"),
                                 str(out / "profile" / "profile.json")], report


SLOW_BATCHES = """
import time

import torch


def batches(batch, seed):
    generator = torch.Generator().manual_seed(seed)
    while True:
        time.sleep(0.5)  # each step waits: the cancel below lands mid-run
        yield (torch.randn(batch, 3, 32, 32, generator=generator),
               torch.randint(0, 10, (batch,), generator=generator))
"""


@pytest.mark.slow
@pytest.mark.loopback
def test_run_cancelled_from_another_terminal_names_its_resume(tmp_path, bench):
    """The whole way: `job-cancel` while `run --checkpoint-every 2` trains, after its first
    checkpoint: exit 130, the line names --resume OUT, the report says cancelled."""
    import subprocess

    from helpers.bad_inputs import COMMAND, INTERRUPTED, REPO, cli, env, refused
    data = tmp_path / "slow.py"
    data.write_text(SLOW_BATCHES)
    out = tmp_path / "rcan"
    proc = subprocess.Popen([*COMMAND, *map(str, (
        "run", "--device", "bench", "--model", "mlp", "--budget", "0.9", "--steps", "30",
        "--checkpoint-every", "2", "--data", f"{data}:batches", "--no-plots", "--profile",
        REPO / "profiles" / "this-machine.json", "--time-limit", "5", "--out", out))],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env())
    seen, deadline = [], time.monotonic() + 120
    while time.monotonic() < deadline and not any("step 3/30" in line for line in seen):
        line = proc.stderr.readline()
        if not line:
            break
        seen.append(line)
    job = next((word for line in seen for word in line.split() if word.startswith("run-")),
               None)
    if job is None:
        proc.kill()
        raise AssertionError(seen)
    assert cli("job-cancel", job, "--device", "bench", environ=env()).returncode == 0
    stdout, err = proc.communicate(timeout=60)
    refused(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, err), INTERRUPTED,
            "cancelled by the host", f"its last checkpoint stays on bench: the same command "
            f"with --resume {out} goes on from it", "report.json")
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "cancelled" and report["job"] == job, report
