"""After a run gave up on its link (OUT/report.json: `link_lost`), the way back the line names,
`job-status ID --device B --wait --out OUT/board`, rewrites that report with the job's real
final state: it stayed `link_lost` after the job had finished on the board. (The whole way,
sshd stopped mid-run: test_bad_inputs_interrupts.py, giving up on the link.)"""

from __future__ import annotations

import json

import pytest
from helpers.bad_inputs import cli, env
from helpers.board_fixtures import local_board

pytestmark = [pytest.mark.slow, pytest.mark.loopback]


def _come_back_after_a_lost_link(tmp_path, job_id: str, lost_job: str, said: dict = None):
    """A job run to its end on a local board, a run report saying `link_lost` for `lost_job`
    (as `run` writes it giving up: orchestrate._link_lost; or what `said` gives), then the way
    back the line names: (job-status's process, the report after it)."""
    out = tmp_path / "run"
    (out / "board").mkdir(parents=True)
    with local_board(tmp_path, "bench"):
        environ = env(EDGE_REMAT_DEVICE_CONFIGS=str(tmp_path / "configs"),
                      XDG_CACHE_HOME=str(tmp_path / "cache"))
        submit = cli("job", "sleep", "--device", "bench", "--id", job_id, "--detach",
                     "--param", "seconds=1", "--param", "steps=2", environ=environ)
        assert submit.returncode == 0, submit.stderr
        (out / "report.json").write_text(json.dumps(
            {"status": "link_lost", "message": "cannot reach bench (gave up reconnecting)",
             "model": "mlp", "device": "bench", "written": [], "job": lost_job,
             **(said or {})}))
        back = cli("job-status", job_id, "--device", "bench", "--wait", "--out", out / "board",
                   environ=environ)
    return back, json.loads((out / "report.json").read_text())


def test_job_status_rewrites_the_lost_report_once_the_job_finished(tmp_path):
    back, report = _come_back_after_a_lost_link(tmp_path, "nap-1", "nap-1")
    assert back.returncode == 0, back.stderr
    assert report["status"] == "finished" and report["job_state"] == "finished", report
    assert report["link_lost"].startswith("cannot reach bench"), report
    assert f"{tmp_path / 'run' / 'report.json'} now says how job nap-1 ended: finished" \
        in back.stderr


def test_a_report_of_another_job_is_left_alone(tmp_path):
    back, report = _come_back_after_a_lost_link(tmp_path, "nap-2", "another-job")
    assert back.returncode == 0, back.stderr
    assert report["status"] == "link_lost" and "now says" not in back.stderr


def test_an_interrupted_run_whose_job_kept_running_is_rewritten_too(tmp_path):
    """QA: after Ctrl-C with --keep-running, the way back the line named fetched the finished
    job, and OUT/report.json still said "interrupted ... keeps running"."""
    kept = {"status": "interrupted", "cancelled": False,
            "message": "interrupted (Ctrl-C); job nap-3 keeps running on bench"}
    back, report = _come_back_after_a_lost_link(tmp_path, "nap-3", "nap-3", kept)
    assert back.returncode == 0, back.stderr
    assert report["status"] == "finished" and report["interrupted"] == kept["message"]
    assert report["message"] == "the run was interrupted and its job kept running, and the " \
        "job then ended on the board: finished"
    assert "now says how job nap-3 ended: finished (it said interrupted)" in back.stderr
