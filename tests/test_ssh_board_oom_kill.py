"""A job the out-of-memory killer killed on a real board over SSH: sshd on loopback with its
every session in a memory cgroup (as QA's 'pi600', a small Pi), where plain PyTorch training
of digits-cnn is killed at step 1. One killed run serves the module's tests.

- The job is "killed" wherever the host says it: job-status's list and lines, its --json status
  and the job record's state (the board's word, "failed", kept as board_state), exit 4. QA: the
  list said 'job train-plain-... failed' and the record's state "failed" beside "status":
  "killed", exit 4 (as cancelled and bad_input were before transport.errors.as_reported).
- The killed run's report says the cgroup's peak and limit, which the board's agent read as it
  found the job killed (daemon/oom.group_memory_at_kill), and says what killed it in one
  wording. QA: report.json had kernel_peak_bytes and memory_limit_bytes None, report.txt no
  peak nor limit, its header "killed by SIGKILL (the board's out-of-memory killer)" and its
  table's row "killed by the memory limit"."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from edge_remat.cgroup import unavailable_reason
from edge_remat.cli import app
from helpers.board_fixtures import SshServer, needs_sshd, ssh_device_config, stop_agent

pytestmark = [pytest.mark.slow, pytest.mark.loopback, pytest.mark.cgroup, needs_sshd,
              pytest.mark.skipif(unavailable_reason() is not None,
                                 reason=f"no memory cgroup: {unavailable_reason()}")]

LIMIT = 600 * 2**20  # QA's pi600: plain digits-cnn (batch 256, image 24) is killed at step 1
KILLED = 4


def cli(*args):
    result = CliRunner().invoke(app, [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr


@contextlib.contextmanager
def cgroup_ssh_board(root: Path, limit: int):
    """sshd on loopback, its every session (the agent, its jobs) in a memory cgroup of
    `limit`; yields the device config's path, then stops the agent and sshd, and removes the
    group."""
    from edge_remat.cgroup import MemoryCgroup
    (root / "sshd").mkdir()
    group = MemoryCgroup.ensure(f"edge-remat-test-oom-{os.getpid()}", limit)
    try:
        sshd = SshServer(root / "sshd").start(prefix=group.exec_prefix())
        try:
            yield ssh_device_config(root / "pi600.toml", sshd, root / "board",
                                    "[hardware]\nsensor = \"none\"\n")
        finally:
            stop_agent(root / "board")
            sshd.stop()
    finally:
        group.remove()


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory):
    """(device config, OUT, the run's exit status, stdout, stderr) of a plain run the board's
    out-of-memory killer killed."""
    root = tmp_path_factory.mktemp("pi600")
    patch = pytest.MonkeyPatch()
    patch.setenv("XDG_CACHE_HOME", str(root / "cache"))
    try:
        with cgroup_ssh_board(root, LIMIT) as config:
            out = root / "r"
            code, stdout, stderr = cli("run", "--device", config, "--model", "digits-cnn",
                                       "--plain", "--steps", 2, "--no-plots", "--out", out)
            yield config, out, code, stdout, stderr
    finally:
        patch.undo()


def test_a_job_the_oom_killer_killed_is_killed_in_the_list_the_record_and_its_status(
        killed_run):
    config, out, code, stdout, stderr = killed_run
    assert code == KILLED, (stdout, stderr)
    code, listed, err = cli("job-status", "--device", config, "--json")
    [record] = json.loads(listed)["jobs"]
    job_id = record["id"]
    assert (record["state"], record["board_state"]) == ("killed", "failed"), record
    assert "out-of-memory killer" in record["error"], record
    code, lines, err = cli("job-status", "--device", config)
    assert code == 0 and lines.splitlines() == [f"job {job_id} killed"], (lines, err)
    # the run's own progress lines said so as it ended
    assert f"job {job_id} killed" in stderr and f"job {job_id} failed" not in stderr, stderr

    code, said, err = cli("job-status", job_id, "--device", config, "--json")
    obj = json.loads(said)
    assert code == KILLED and obj["status"] == "killed", (said, err)
    assert obj["job"]["state"] == "killed" and obj["job"]["board_state"] == "failed", obj
    code, said, err = cli("job-status", job_id, "--device", config, "--wait")
    assert code == KILLED, (said, err)
    assert err.strip().splitlines()[-1].startswith(
        f"error: job {job_id} was killed on loopback: it ran out of memory: the job process "
        "died: it was killed by SIGKILL"), err

    code, said, err = cli("job-cancel", job_id, "--device", config, "--json")
    obj = json.loads(said)
    assert code == 0 and obj["status"] == "killed" and obj["already_ended"] is True, obj
    code, said, err = cli("job-cancel", job_id, "--device", config)
    assert code == 0 and said.startswith(f"job {job_id} had already been killed on loopback "
                                         "(out of memory); nothing to cancel"), (said, err)


def test_the_killed_runs_report_says_the_boards_cgroup_peak_and_limit_in_one_wording(killed_run):
    config, out, code, stdout, stderr = killed_run
    assert code == KILLED, (stdout, stderr)
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "killed" and report["killed_at_step"] == 1, report
    assert report["memory_limit_bytes"] == LIMIT, report
    # killed at the limit: the group's high-water mark is there (a page or so below, at most)
    assert LIMIT - 16 * 2**20 <= report["kernel_peak_bytes"] <= LIMIT, report
    source = report["kernel_peak_source"]
    assert "max_usage_in_bytes" in source or "memory.peak" in source, source
    assert "when the job was killed" in source and "read by the board's agent" in source, source
    why = "killed by SIGKILL (the board's out-of-memory killer)"
    assert report["message"] == f"{why} at step 1" and report["killed_by"] == why, report
    text = (out / "report.txt").read_text().splitlines()
    assert text[0] == (f"plain PyTorch run of digits-cnn on loopback (600.00 MiB memory "
                       f"limit): {why} at step 1"), text
    assert f"   1  {why}" in text, text
    assert not any("killed by the memory limit" in line for line in text), text
    [peak] = [line for line in text if line.startswith("kernel peak")]
    assert "of the 600.00 MiB limit (" in peak, peak
    # the run's line says the limit and the peak too
    assert err_line(stderr).endswith("needs more memory than it has (600.00 MiB limit; kernel "
                                     f"peak {report['kernel_peak_bytes'] / 2**20:.2f} MiB)"), \
        stderr


def err_line(stderr: str) -> str:
    return stderr.strip().splitlines()[-1]
