"""The board's inputs/ folder (plans, graphs, starting weights the host pushed) is a cache, not
a store that only grows: a daemon starting removes the files that no job it still records
names and that nobody pushed or asked after for INPUTS_KEPT_S (daemon/inputs.py). Run on a
real daemon process on loopback; files are aged with os.utime, as a day's wait would."""

from __future__ import annotations

import hashlib
import os
import time

from edge_remat_agent.daemon.inputs import INPUTS_KEPT_S
from test_daemon import daemon, wait_done  # noqa: F401 - the fixture

OLD = time.time() - INPUTS_KEPT_S - 3600


def _push(client, name: str, data: bytes) -> str:
    path = f"inputs/{name}"
    sha = hashlib.sha256(data).hexdigest()
    answer = client.call("put_file", data, path=path, offset=0, size=len(data), sha256=sha)[0]
    assert answer["done"] is True
    return path


def test_a_starting_daemon_removes_old_inputs_no_kept_job_names(daemon, tmp_path):
    inputs = tmp_path / "board" / "inputs"
    first = daemon()
    client = first.client()
    named = _push(client, "aaaa-plan.json", b'{"plan": 1}')
    _push(client, "bbbb-plan.json", b'{"plan": 2}')  # old, named by no job: removed
    _push(client, "cccc-graph.json", b'{"graph": 3}')  # named by none, but new: kept
    asked = _push(client, "dddd-init.pt", b"weights")
    half = os.urandom(1000)  # an upload cut half-way: its part file
    client.call("put_file", half[:400], path="inputs/eeee-big.pt", offset=0, size=1000,
                sha256=hashlib.sha256(half).hexdigest())
    job = client.call("submit", kind="echo", params={"plan": named})[0]["job"]
    wait_done(client, job["id"])
    for name in ("aaaa-plan.json", "bbbb-plan.json", "dddd-init.pt",
                 ".eeee-big.pt." + hashlib.sha256(half).hexdigest()[:16] + ".part"):
        os.utime(inputs / name, (OLD, OLD))
    # a push that finds the file there (the host is about to submit a job naming it)
    state = client.call("stat_file", path=asked, sha256=hashlib.sha256(b"weights").hexdigest())
    assert state[0]["exists"] is True
    client.call("stop")
    assert first.proc.wait(15) == 0

    again = daemon().client()
    assert sorted(p.name for p in inputs.iterdir()) == \
        ["aaaa-plan.json", "cccc-graph.json", "dddd-init.pt"]
    kept = again.call("job", job=job["id"])[0]["job"]
    assert kept["state"] == "finished" and kept["result"]["params"] == {"plan": named}
    assert (inputs / "aaaa-plan.json").read_bytes() == b'{"plan": 1}'


def test_an_input_whose_job_was_pruned_goes_with_it(tmp_path):
    """The job records a daemon prunes (past store.KEEP_FINISHED) no longer keep their inputs."""
    from edge_remat_agent.daemon import store
    from edge_remat_agent.daemon.layout import Layout
    layout = Layout(tmp_path / "board").ensure()
    jobs = store.JobStore(layout)
    for n in range(store.KEEP_FINISHED + 1):
        record = jobs.create("echo", {"plan": f"inputs/{n:04d}-plan.json"}, f"job-{n:04d}")
        jobs.update(record, state="finished")
        (layout.root / "inputs" / f"{n:04d}-plan.json").write_text("{}")
        os.utime(layout.root / "inputs" / f"{n:04d}-plan.json", (OLD, OLD))
    store.JobStore(layout).load()
    left = sorted(p.name for p in (layout.root / "inputs").iterdir())
    assert len(left) == store.KEEP_FINISHED and "0000-plan.json" not in left, left[:3]
