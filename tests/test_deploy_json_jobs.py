"""`deploy --json` and the board's jobs, through the real CLI and a real local board: stderr
names the job as it is sent (stdout stays one JSON object), `job-status --device D` without
an ID lists the board's jobs, so that another shell can cancel it; the cancelled deploy's
JSON says "cancelled" in its status and its job record alike; `--data` the model cannot
take says what to use instead."""

from __future__ import annotations

import json
import queue
import re
import subprocess
import threading

import pytest

from helpers.bad_inputs import BAD_INPUT, COMMAND, INTERRUPTED, cli, env, refused

pytestmark = [pytest.mark.slow, pytest.mark.loopback]


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    """A digits-cnn graph and a plan of it."""
    folder = tmp_path_factory.mktemp("digits")
    graph, plan = folder / "graph.json", folder / "plan.json"
    proc = cli("graph", "--model", "digits-cnn", "-o", graph, timeout=300)
    assert proc.returncode == 0, proc.stderr
    proc = cli("plan", "--graph", graph, "--budget", "60%", "--solver", "heuristic:split",
               "-o", plan)
    assert proc.returncode == 0, proc.stderr
    return graph, plan


def test_a_json_deploy_names_its_job_which_another_shell_lists_and_cancels(tmp_path, bench,
                                                                          digits):
    """QA: with --json stderr was silent until the end: no job id, and no command listed a
    board's jobs, so the deploy could not be cancelled from another shell. Its cancelled
    JSON said "status": "cancelled" beside a job record whose state was "failed"."""
    graph, plan = digits
    proc = subprocess.Popen([*COMMAND, "deploy", str(plan), "--device", "bench", "--graph",
                             str(graph), "--steps", "100000", "--out", str(tmp_path / "out"),
                             "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env())
    lines: queue.Queue = queue.Queue()  # stderr, read aside: a deploy that says nothing
    reader = threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr])
    reader.start()  # until its end must not hang the test
    try:
        first = lines.get(timeout=120)
        sent = re.match(r"job (run-\S+) sent to bench \(.*`edge-remat job-cancel \1 --device "
                        r"bench` stops it\)", first)
        assert sent, first
        job_id = sent.group(1)
        listed = cli("job-status", "--device", "bench")
        assert listed.returncode == 0, listed.stderr
        assert any(line.startswith(f"job {job_id} ") for line in listed.stdout.splitlines()), \
            listed.stdout
        as_json = json.loads(cli("job-status", "--device", "bench", "--json").stdout)
        assert job_id in [record["id"] for record in as_json["jobs"]], as_json
        cancel = cli("job-cancel", job_id, "--device", "bench")
        assert cancel.returncode == 0, cancel.stderr
        proc.wait(timeout=120)
        out = proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
        reader.join(timeout=30)
    err = "".join(lines.get() for _ in range(lines.qsize()))
    ended = subprocess.CompletedProcess(proc.args, proc.returncode, out, first + err)
    refused(ended, INTERRUPTED, "cancelled")
    obj = json.loads(out)  # stdout: one object, nothing else
    assert obj["status"] == "cancelled" and obj["job"]["state"] == "cancelled", obj
    assert obj["job"]["board_state"] == "failed" and obj["job"]["id"] == job_id, obj
    listed = json.loads(cli("job-status", "--device", "bench", "--json").stdout)
    assert {r["id"]: r["state"] for r in listed["jobs"]}[job_id] == "cancelled", listed


def test_job_status_without_an_id_needs_one_to_wait_or_fetch(tmp_path, bench):
    refused(cli("job-status", "--device", "bench", "--wait"), BAD_INPUT, "--wait needs a job ID")
    refused(cli("job-status", "--device", "bench", "--out", tmp_path / "o"), BAD_INPUT,
            "--out needs a job ID")
    listed = cli("job-status", "--device", "bench")
    assert listed.returncode == 0 and listed.stdout.strip() == "no jobs on bench", listed


def test_text_data_for_an_image_model_names_what_to_use(tmp_path, bench, digits):
    """QA: `deploy --data text` of a digits-cnn graph said only "data 'text' feeds models that
    take token ids [batch, seq]", exit 2, with no remedy."""
    graph, plan = digits
    proc = cli("deploy", plan, "--device", "bench", "--graph", graph, "--steps", "1", "--out",
               tmp_path / "out", "--data", "text", "--json", timeout=300)
    assert proc.returncode == BAD_INPUT, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]  # (the JSON's job record keeps the board's
    assert line.startswith("error: ") and "Traceback" not in proc.stderr, proc.stderr  # trace)
    for words in ("data 'text' feeds language models", "this model takes [256, 1, 8, 8]",
                  "use --data example", "digits", "MODULE:FUNCTION"):
        assert words in line, (words, line)
    obj = json.loads(proc.stdout)
    assert obj["job"]["bad_input"] is True and "use --data example" in obj["error"], obj
