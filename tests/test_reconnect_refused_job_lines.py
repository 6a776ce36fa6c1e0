"""A reconnect that fails on what retrying cannot fix (sshd back with another host key, or
refusing the key) while a job runs: the job goes on on the board, as when reconnecting times
out, so the host exits 3 with the error's own reason (the changed key and what to do) AND the
job and the `job-status` / `job-cancel` commands to come back; `run` writes OUT/report.json
saying `link_lost`. QA: exit 3 with the reason alone, no job id, no report (Board.run_job turned
only LinkLost into JobOutOfReach). The timed-out reconnect: test_bad_inputs_interrupts.py."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
from helpers.bad_inputs import COMMAND, UNREACHABLE, env, refused, wait_for_line
from helpers.board_fixtures import SshServer, keygen, needs_sshd, ssh_device_config, stop_agent

pytestmark = [pytest.mark.slow, pytest.mark.loopback, needs_sshd]


def _refused_on_reconnect(tmp_path, monkeypatch, args, needle, change) -> tuple:
    """`edge-remat ARGS` on a loopback ssh board; once stderr shows `needle` (its job runs),
    sshd stops with its sessions and starts again after change(sshd). (the error line, the
    run's job id as the line names it, workdir)."""
    (tmp_path / "sshd").mkdir()
    sshd = SshServer(tmp_path / "sshd").start()
    workdir = tmp_path / "board"
    ssh_device_config(tmp_path / "loopback.toml", sshd, workdir,
                      "connect_timeout_s = 5\nreconnect_timeout_s = 60\n"
                      "[hardware]\nsensor = \"none\"\n")
    monkeypatch.setenv("EDGE_REMAT_DEVICE_CONFIGS", str(tmp_path))
    try:
        proc = subprocess.Popen([*COMMAND, *map(str, args)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env())
        seen = wait_for_line(proc, needle, timeout=90)
        sshd.stop()
        change(sshd)
        sshd.start()
        stdout, err = proc.communicate(timeout=120)
        done = subprocess.CompletedProcess(proc.args, proc.returncode, stdout,
                                           "".join(seen) + err)
        line = refused(done, UNREACHABLE, "job-status", "job-cancel", "may still run")
        job = re.search(r"job (\S+) may still run on loopback", line).group(1)
        return line, job, workdir
    finally:
        stop_agent(workdir)  # the job still runs there: the daemon is this machine's
        sshd.stop()


def _new_host_key(sshd: SshServer) -> None:
    sshd.host_key = keygen(sshd.root / "other_host_key")


def _no_authorized_keys(sshd: SshServer) -> None:
    sshd.authorized_keys.write_text("")


def test_run_whose_reconnect_finds_a_changed_host_key_names_the_job_and_writes_link_lost(
        tmp_path, monkeypatch):
    out = tmp_path / "run"
    line, job, _ = _refused_on_reconnect(
        tmp_path, monkeypatch, ("run", "--device", "loopback", "--model", "mlp", "--plain",
                                "--steps", "1000000", "--out", out),
        "/1000000:", _new_host_key)
    assert line.startswith("error: the host key of "), line
    assert "CHANGED" in line and "ssh-keygen -R" in line, line  # its own reason and remedy
    assert f"--out {out / 'board'}" in line, line
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "link_lost" and report["job"] == job, report
    assert "CHANGED" in report["message"], report


def test_job_whose_reconnect_is_refused_authentication_names_the_job(tmp_path, monkeypatch):
    line, job, _ = _refused_on_reconnect(
        tmp_path, monkeypatch, ("job", "sleep", "--device", "loopback", "--param",
                                "seconds=600", "--param", "steps=600"),
        "job sleep-", _no_authorized_keys)
    assert "refused authentication" in line and "authorized_keys" in line, line
    assert f"job-cancel {job} --device" in line, line
