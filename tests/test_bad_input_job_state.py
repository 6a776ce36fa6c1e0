"""A job whose input the board refused (a param, a graph its capture does not reproduce) is in
state `bad_input` wherever the host prints it, through the real CLI and a real local board:
the --json status and the job record's state alike (the board's word, `failed`, kept as
`board_state`), job-status's record and its list. QA: `job ... --json` and `deploy ... --json`
said "status": "failed", exit 2, beside a job record saying `bad_input`."""

from __future__ import annotations

import json

import pytest

from helpers.bad_inputs import BAD_INPUT, cli, refused, tiny_graph, tiny_plan

pytestmark = pytest.mark.loopback


def _said_bad_input(obj: dict, job_id: str) -> None:
    assert obj["status"] == "bad_input", obj
    record = obj["job"]
    assert record["id"] == job_id and record["state"] == "bad_input", record
    assert record["board_state"] == "failed" and record["bad_input"] is True, record


def test_a_refused_job_param_is_bad_input_in_every_json_and_line(tmp_path, bench):
    proc = cli("job", "sleep", "--device", "bench", "--param", "steps=0", "--id", "nap-0",
               "--json", timeout=120)
    assert proc.returncode == BAD_INPUT, proc.stderr
    _said_bad_input(json.loads(proc.stdout), "nap-0")

    status = cli("job-status", "nap-0", "--device", "bench", "--json", timeout=120)
    assert status.returncode == BAD_INPUT, status.stderr
    _said_bad_input(json.loads(status.stdout), "nap-0")
    refused(cli("job-status", "nap-0", "--device", "bench", "--wait", timeout=120), BAD_INPUT,
            "param 'steps'", "from 1 to 100000")

    listed = json.loads(cli("job-status", "--device", "bench", "--json").stdout)
    assert [(r["id"], r["state"], r["board_state"]) for r in listed["jobs"]] == \
        [("nap-0", "bad_input", "failed")], listed
    lines = cli("job-status", "--device", "bench").stdout.splitlines()
    assert lines == ["job nap-0 bad_input"], lines

    cancel = json.loads(cli("job-cancel", "nap-0", "--device", "bench", "--json").stdout)
    assert cancel["status"] == "bad_input" and cancel["already_ended"] is True, cancel


def test_a_deploy_the_board_refuses_is_bad_input_in_its_json(tmp_path, bench):
    """The board's capture of the model does not reproduce the graph (made by another torch,
    or edited): the executor refuses it before training, bad input."""
    graph = tiny_graph(tmp_path, capture={"source": {"model": "mlp"}})
    plan = tiny_plan(tmp_path, graph)
    proc = cli("deploy", plan, "--device", "bench", "--graph", graph, "--steps", "1", "--out",
               tmp_path / "out", "--json", timeout=180)
    assert proc.returncode == BAD_INPUT, proc.stderr
    obj = json.loads(proc.stdout)
    _said_bad_input(obj, obj["job"]["id"])
    assert "re-capturing gave a different graph" in obj["error"], obj


def test_a_job_that_failed_otherwise_stays_failed(tmp_path, bench):
    proc = cli("job", "echo", "--device", "bench", "--param", "fail=bad weights", "--id",
               "echo-1", "--json", timeout=120)
    obj = json.loads(proc.stdout)
    assert proc.returncode == 1 and obj["status"] == "failed", proc.stdout
    assert obj["job"]["state"] == "failed" and "board_state" not in obj["job"], obj
