"""After a run gave up on its link (OUT/report.json: `link_lost`), the way back the line names,
`job-status ID --device B --wait --out OUT/board`, rewrites that report with the job's real
final state: it stayed `link_lost` after the job had finished on the board."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
from helpers.bad_inputs import COMMAND, cli, env, refused
from helpers.board_fixtures import local_board, needs_sshd, stop_agent

from edge_remat.errors import EXIT_INTERRUPTED, EXIT_UNREACHABLE

pytestmark = [pytest.mark.slow, pytest.mark.loopback]


def _lost_run_report(out, job_id):
    """What `run` writes when it gives up on the link (orchestrate._link_lost)."""
    (out / "board").mkdir(parents=True)
    (out / "report.json").write_text(json.dumps(
        {"status": "link_lost", "message": "cannot reach bench (gave up reconnecting)",
         "model": "mlp", "device": "bench", "written": [], "job": job_id}))


def test_job_status_rewrites_the_lost_report_once_the_job_finished(tmp_path):
    out = tmp_path / "run"
    with local_board(tmp_path, "bench"):
        environ = env(EDGE_REMAT_DEVICE_CONFIGS=str(tmp_path / "configs"),
                      XDG_CACHE_HOME=str(tmp_path / "cache"))
        submit = cli("job", "sleep", "--device", "bench", "--id", "nap-1", "--detach",
                     "--param", "seconds=1", "--param", "steps=2", environ=environ)
        assert submit.returncode == 0, submit.stderr
        _lost_run_report(out, "nap-1")
        back = cli("job-status", "nap-1", "--device", "bench", "--wait", "--out", out / "board",
                   environ=environ)
    assert back.returncode == 0, back.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "finished" and report["job_state"] == "finished", report
    assert report["link_lost"].startswith("cannot reach bench"), report
    assert f"{out / 'report.json'} now says how job nap-1 ended: finished" in back.stderr


def test_a_report_of_another_job_is_left_alone(tmp_path):
    out = tmp_path / "run"
    with local_board(tmp_path, "bench"):
        environ = env(EDGE_REMAT_DEVICE_CONFIGS=str(tmp_path / "configs"),
                      XDG_CACHE_HOME=str(tmp_path / "cache"))
        assert cli("job", "sleep", "--device", "bench", "--id", "nap-2", "--detach",
                   "--param", "seconds=1", "--param", "steps=1",
                   environ=environ).returncode == 0
        _lost_run_report(out, "another-job")
        back = cli("job-status", "nap-2", "--device", "bench", "--wait", "--out", out / "board",
                   environ=environ)
    assert back.returncode == 0, back.stderr
    assert json.loads((out / "report.json").read_text())["status"] == "link_lost"


@needs_sshd
def test_a_run_that_lost_its_link_says_how_its_job_ended_after_job_status(tmp_path,
                                                                          monkeypatch):
    """The whole way: sshd stops mid-run, the run gives up (link_lost), sshd comes back, the
    job is cancelled, and job-status with the line's --out makes the report say so."""
    from helpers.board_fixtures import SshServer, ssh_device_config
    (tmp_path / "sshd").mkdir()
    sshd = SshServer(tmp_path / "sshd").start()
    workdir, out = tmp_path / "board", tmp_path / "run"
    ssh_device_config(tmp_path / "loopback.toml", sshd, workdir,
                      "connect_timeout_s = 5\nreconnect_timeout_s = 3\n"
                      "[hardware]\nsensor = \"none\"\n")
    monkeypatch.setenv("EDGE_REMAT_DEVICE_CONFIGS", str(tmp_path))
    try:
        proc = subprocess.Popen(
            [*COMMAND, "run", "--device", "loopback", "--model", "mlp",
             "--plain", "--steps", "1000000", "--out", str(out)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env())
        seen = []
        for line in proc.stderr:  # a step done (progress may skip some)
            seen.append(line)
            if "/1000000:" in line:
                break
        sshd.stop()
        stdout, err = proc.communicate(timeout=120)
        line = refused(subprocess.CompletedProcess(proc.args, proc.returncode, stdout,
                                                   "".join(seen) + err),
                       EXIT_UNREACHABLE, "gave up reconnecting", "job-status")
        back_line = re.search(r"`(edge-remat job-status [^`]+)`", line).group(1)
        job_id = back_line.split()[2]
        assert json.loads((out / "report.json").read_text())["status"] == "link_lost"
        sshd.start()
        assert cli("job-cancel", job_id, "--device", "loopback", environ=env()).returncode == 0
        back = cli(*back_line.split()[1:], environ=env())
        assert back.returncode == EXIT_INTERRUPTED, back.stderr
        report = json.loads((out / "report.json").read_text())
        assert report["status"] == "cancelled" and report["job"] == job_id, report
    finally:
        stop_agent(workdir)
        sshd.stop()
