"""`job-cancel` of a job that had already ended (failed, finished, cancelled): the cancel has
nothing to do, which is no error of its own: one plain line saying so, no `error:`, exit 0.
Through the real CLI, with the real agent daemon on this machine."""

from __future__ import annotations

import json

import pytest

from helpers.bad_inputs import JOB_FAILED, cli, env

pytestmark = pytest.mark.loopback


def _cancel(job_id: str, *extra: str):
    proc = cli("job-cancel", job_id, "--device", "bench", *extra, environ=env())
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert not any(line.startswith("error:") for line in (proc.stdout + proc.stderr)
                   .splitlines()), (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def test_cancelling_a_job_that_had_already_failed_says_so_without_error(tmp_path, bench):
    """QA: job-cancel of a job that had already failed printed the job's error as its answer
    and exited 0 (an error with status 0). Now: `job ID had already failed on bench; nothing
    to cancel (it failed: RuntimeError: boom)`, exit 0; --json says already_ended."""
    failed = cli("job", "echo", "--device", "bench", "--id", "boom-1", "--param", "fail=boom",
                 environ=env())
    assert failed.returncode == JOB_FAILED, failed.stderr
    line = _cancel("boom-1").stdout.strip()
    assert line == ("job boom-1 had already failed on bench; nothing to cancel "
                    "(it failed: RuntimeError: boom)"), line
    record = json.loads(_cancel("boom-1", "--json").stdout)
    assert record["already_ended"] is True and record["status"] == "failed", record


def test_cancelling_twice_says_the_second_time_that_it_was_cancelled_already(tmp_path,
                                                                             bench):
    submit = cli("job", "sleep", "--device", "bench", "--id", "nap-1", "--detach",
                 "--param", "seconds=60", "--param", "steps=60", environ=env())
    assert submit.returncode == 0, submit.stderr
    first = _cancel("nap-1").stdout.strip()
    assert first == "job nap-1 on bench: cancelled by the host", first
    second = _cancel("nap-1").stdout.strip()
    assert second == "job nap-1 on bench had already been cancelled; nothing to cancel", second
    record = json.loads(_cancel("nap-1", "--json").stdout)
    # cancelled, as deploy --json and job-status say it (the agent keeps it as failed)
    assert record["already_ended"] is True and record["status"] == "cancelled", record
