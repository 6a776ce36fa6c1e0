"""`job --detach` refuses a job whose params the board's job would refuse, before anything is
sent: exit 2 and the board's own line (the host reads the params with the same code,
registry.refuse_bad_params), through the real CLI and a real local board. QA: a detached job
with bad params was accepted (exit 0, its id printed); only its record said `bad_input` later,
where no one was waiting."""

from __future__ import annotations

import json

import pytest

from helpers.bad_inputs import BAD_INPUT, cli, refused, tiny_graph, tiny_plan

pytestmark = pytest.mark.loopback

CASES = [
    ("sleep", ["--param", "steps=0"]),
    ("sleep", ["--param", "seconds=1e12"]),
    ("sleep", ["--param", "seconds=abc"]),
    ("train-plain", ["--param", "model=mlp", "--param", "accumulate=0"]),
    ("train-plain", ["--param", "model=mlp", "--param", "warmup=50"]),
    ("run", []),
    ("run", ["--param", "steps=99999999999999999999"]),
    ("run", ["--input", "plan={plan}", "--input", "graph={graph}", "--param", "steps=5",
             "--param", "lr_schedule=cosine", "--param", "warmup=9"]),
    ("run", ["--input", "plan={plan}", "--input", "graph={graph}", "--param", "save=some"]),
    ("profile", ["--param", "bogus=1"]),
    ("profile", ["--param", "busy_s=inf"]),
]


@pytest.mark.parametrize("kind,args", CASES,
                         ids=[f"{c[0]}-{'-'.join(c[1]) or 'none'}" for c in CASES])
def test_a_detached_job_the_board_would_refuse_is_refused_in_its_words(tmp_path, bench, kind,
                                                                       args):
    graph = tiny_graph(tmp_path)
    files = {"graph": graph, "plan": tiny_plan(tmp_path, graph)}
    args = [arg.format(**files) for arg in args]
    # the board's words, from the job run and waited on
    waited = refused(cli("job", kind, "--device", "bench", *args, timeout=180), BAD_INPUT)
    boards_line = waited.split(" failed on bench: ", 1)[1]
    before = {record["id"] for record in _jobs()}

    detached = cli("job", kind, "--device", "bench", "--detach", *args, timeout=120)
    line = refused(detached, BAD_INPUT)
    assert line == f"error: {boards_line}", (line, boards_line)
    assert detached.stdout == "", detached.stdout  # no job id: no job
    assert {record["id"] for record in _jobs()} == before  # nothing was submitted
    as_json = cli("job", kind, "--device", "bench", "--detach", "--json", *args, timeout=120)
    assert as_json.returncode == BAD_INPUT, as_json.stderr
    assert json.loads(as_json.stdout) == {"status": "error", "error": boards_line}


def test_a_detached_job_with_good_params_is_submitted(tmp_path, bench):
    proc = cli("job", "sleep", "--device", "bench", "--param", "seconds=0.1", "--param",
               "steps=2", "--id", "nap-ok", "--detach", timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "nap-ok", proc.stderr
    done = cli("job-status", "nap-ok", "--device", "bench", "--wait", "--json", timeout=120)
    assert done.returncode == 0 and json.loads(done.stdout)["result"]["steps"] == 2, done


def _jobs() -> list:
    listed = cli("job-status", "--device", "bench", "--json")
    assert listed.returncode == 0, listed.stderr
    return json.loads(listed.stdout)["jobs"]
