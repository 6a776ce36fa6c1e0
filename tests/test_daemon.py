"""The agent daemon, run for real as a process on loopback: jobs survive disconnects, a clean
stop, a crash of the daemon itself; files move in resumable chunks; bad requests get clear
errors."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.board_fixtures import agent_command, stop_agent
from edge_remat.errors import killed_by_memory
from edge_remat_agent.daemon.oom import (group_memory_at_kill, group_memory_limit,
                                          oom_killer_ran, oom_kills)
from edge_remat_agent.daemon.worker import NOT_OOM, OOM_RAN, describe_exit
from edge_remat_agent.wire.framing import FrameStream, PipeChannel
from edge_remat_agent.wire.protocol import Client, RemoteError

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="the agent runs on POSIX boards")


class DaemonProcess:
    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.proc = None
        self.port = None

    def start(self) -> "DaemonProcess":
        self.proc = subprocess.Popen(
            agent_command() + ["serve", "--tcp", "127.0.0.1:0", "--workdir", str(self.workdir)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        assert line.startswith("listening on"), self.proc.stderr.read()
        self.port = int(line.strip().rsplit(":", 1)[1])
        return self

    def client(self) -> Client:
        return Client(FrameStream(socket.create_connection(("127.0.0.1", self.port))))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(15)


@pytest.fixture
def daemon(tmp_path):
    started = []

    def start():
        d = DaemonProcess(tmp_path / "board").start()
        started.append(d)
        return d

    yield start
    for d in started:
        d.stop()


def wait_done(client: Client, job_id: str, timeout: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout
    rev = None
    while time.monotonic() < deadline:
        job = client.call("wait", job=job_id, after_rev=rev, timeout_s=2)[0]["job"]
        rev = job["rev"]
        if job["state"] in ("finished", "failed"):
            return job
    raise AssertionError(f"job {job_id} not done within {timeout} s: {job}")


def wait_for_step(client: Client, job_id: str, step: int, timeout: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout
    rev = None
    while time.monotonic() < deadline:
        job = client.call("wait", job=job_id, after_rev=rev, timeout_s=1)[0]["job"]
        rev = job["rev"]
        if ((job.get("progress") or {}).get("data") or {}).get("step", 0) >= step:
            return job
    raise AssertionError(f"job {job_id} never reached step {step}")


def wait_for_running(client: Client, job_id: str, timeout: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.call("job", job=job_id)[0]["job"]
        if job["state"] == "running":
            return job
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} never started")


def test_hello_names_the_agent_and_its_job_kinds(daemon):
    hello = daemon().client().hello("test")
    assert hello["protocol"] == 1
    assert {"sysinfo", "echo", "sleep", "torch-check"} <= set(hello["job_kinds"])
    assert hello["job_kinds"]["torch-check"]["needs_torch"] is True


def test_sysinfo_reports_versions_ram_and_disk(daemon):
    info = daemon().client().call("sysinfo")[0]
    assert info["python"].count(".") == 2
    assert info["ram_total_bytes"] > info["ram_free_bytes"] > 0
    assert info["disk_free_bytes"] > 0


def test_job_survives_a_disconnect_and_the_host_fetches_its_result(daemon):
    d = daemon()
    first = d.client()
    job = first.call("submit", kind="sleep", params={"seconds": 1.0, "steps": 10})[0]["job"]
    wait_for_step(first, job["id"], 2)
    first.close()  # the host goes away mid-job
    second = d.client()
    done = wait_done(second, job["id"])
    assert done["state"] == "finished"
    assert done["result"]["starts"] == 1 and done["result"]["resumed_from"] == 0


def test_submit_with_the_same_id_is_the_same_job(daemon):
    client = daemon().client()
    a = client.call("submit", kind="echo", params={"x": 1}, job="j-1")[0]
    b = client.call("submit", kind="echo", params={"x": 1}, job="j-1")[0]
    assert a["created"] and not b["created"] and a["job"]["id"] == b["job"]["id"]
    with pytest.raises(RemoteError) as err:
        client.call("submit", kind="echo", params={"x": 2}, job="j-1")
    assert err.value.code == "conflict"


def test_jobs_run_one_after_another(daemon):
    client = daemon().client()
    ids = [client.call("submit", kind="sleep", params={"seconds": 0.3, "steps": 3})[0]["job"]["id"]
           for _ in range(3)]
    jobs = [wait_done(client, i) for i in ids]
    for earlier, later in zip(jobs, jobs[1:]):
        assert earlier["finished_s"] <= later["started_s"]


def test_failing_job_reports_its_error(daemon):
    client = daemon().client()
    job = client.call("submit", kind="echo", params={"fail": "no such layer: fc9"})[0]["job"]
    done = wait_done(client, job["id"])
    assert done["state"] == "failed"
    assert done["error"] == "RuntimeError: no such layer: fc9"


def test_killed_job_process_is_reported_not_hidden(daemon):
    client = daemon().client()
    job = client.call("submit", kind="sleep", params={"seconds": 5, "steps": 50})[0]["job"]
    running = wait_for_step(client, job["id"], 1)
    os.kill(running["pid"], signal.SIGKILL)  # what the out-of-memory killer does
    done = wait_done(client, job["id"])
    assert done["state"] == "failed"
    assert "SIGKILL" in done["error"] and "out-of-memory" in done["error"]


def test_a_job_whose_folder_is_removed_while_it_runs_says_so_and_the_next_job_runs(daemon):
    """Before, the record's save into the missing folder raised in the worker: the job read
    'internal error in the agent' and the worker thread died, so no later job ever ran."""
    started = daemon()
    client = started.client()
    job = client.call("submit", kind="sleep", params={"seconds": 3, "steps": 30})[0]["job"]
    wait_for_step(client, job["id"], 1)
    job_dir = started.workdir / "jobs" / job["id"]
    while job_dir.exists():  # the job writes in it as it goes: 2 of 8 rmtrees met a new file
        shutil.rmtree(job_dir, ignore_errors=True)
    done = wait_done(client, job["id"])
    assert done["state"] == "failed"
    assert done["error"].startswith(f"the job's working directory {job_dir} vanished while it "
                                    "ran (removed on the board)"), done["error"]
    assert json.loads((job_dir / "job.json").read_text())["error"] == done["error"]
    after = client.call("submit", kind="echo", params={"say": "still here"})[0]["job"]
    assert wait_done(client, after["id"])["state"] == "finished"


@pytest.mark.skipif(oom_kills() is None, reason="this kernel hides its out-of-memory count")
def test_a_sigkill_from_a_person_is_not_called_out_of_memory(daemon):
    # The kernel counted no out-of-memory kill while the job ran (unless some other process on
    # this machine happened to be killed for memory meanwhile: then the old guess stands).
    client = daemon().client()
    job = client.call("submit", kind="sleep", params={"seconds": 5, "steps": 50})[0]["job"]
    running = wait_for_step(client, job["id"], 1)
    before = oom_kills()
    os.kill(running["pid"], signal.SIGKILL)
    error = wait_done(client, job["id"])["error"]
    if oom_kills() == before:
        assert NOT_OOM in error and "a person or a program on the board killed it" in error
        assert not killed_by_memory(error)  # the host reports a failed job (1), not killed (4)


def test_the_out_of_memory_count_is_read_from_vmstat(tmp_path):
    # A fixture file stands in for /proc/vmstat: this machine cannot be made to OOM-kill on cue.
    vmstat = tmp_path / "vmstat"
    vmstat.write_text("nr_free_pages 12\noom_kill 7\nnuma_hit 3\n")
    assert oom_kills(vmstat) == 7
    assert oom_kills(tmp_path / "missing") is None
    vmstat.write_text("nr_free_pages 12\n")  # a kernel older than 4.13
    assert oom_kills(vmstat) is None
    assert oom_killer_ran(7, 8) is True and oom_killer_ran(7, 7) is False
    assert oom_killer_ran(None, 8) is None


def test_the_boards_own_group_gives_its_limit_and_at_a_kill_its_peak(tmp_path):
    # A fixture tree stands in for / of a board whose sessions run in a 600 MiB cgroup (v1)
    limit = 600 * 2**20
    files = {"proc/meminfo": "MemTotal: 8000000 kB\n", "proc/self/cgroup": "4:memory:/pi600\n",
             "sys/fs/cgroup/memory/pi600/memory.limit_in_bytes": f"{limit}\n",
             "sys/fs/cgroup/memory/pi600/memory.max_usage_in_bytes": f"{limit - 4096}\n"}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert group_memory_limit(str(tmp_path)) == {"memory_limit_bytes": limit}
    killed = group_memory_at_kill(str(tmp_path))
    assert killed["memory_limit_bytes"] == limit and killed["kernel_peak"]["bytes"] == limit - 4096
    (tmp_path / "sys/fs/cgroup/memory/pi600/memory.limit_in_bytes").write_text(
        "9223372036854771712\n")  # v1's "no limit": a unit of accounting, nothing to say
    assert group_memory_limit(str(tmp_path)) == {} == group_memory_at_kill(str(tmp_path))


def test_each_sigkill_story_is_told_and_read_by_the_host():
    unknown = describe_exit(-signal.SIGKILL)
    by_oom = describe_exit(-signal.SIGKILL, oom_killer_ran=True)
    by_someone = describe_exit(-signal.SIGKILL, oom_killer_ran=False)
    assert "out-of-memory killer?" in unknown and killed_by_memory(unknown)
    assert OOM_RAN in by_oom and killed_by_memory(by_oom)
    assert NOT_OOM in by_someone and not killed_by_memory(by_someone)
    assert describe_exit(-signal.SIGTERM) == "it was killed by SIGTERM"


def test_cancel_a_running_job(daemon):
    client = daemon().client()
    job = client.call("submit", kind="sleep", params={"seconds": 5, "steps": 50})[0]["job"]
    wait_for_step(client, job["id"], 1)
    client.call("cancel", job=job["id"])
    done = wait_done(client, job["id"])
    assert done["state"] == "failed" and done["error"] == "cancelled by the host"


def test_a_cancelled_job_that_outlasts_sigterm_is_still_called_cancelled(daemon):
    # Each step sleeps 8 s, past the 5 s the worker waits after SIGTERM before SIGKILL.
    # Before, the SIGKILL that ends the cancel was reported as a stranger's kill -9.
    client = daemon().client()
    job = client.call("submit", kind="sleep", params={"seconds": 16, "steps": 2})[0]["job"]
    wait_for_running(client, job["id"])
    time.sleep(1.5)  # inside the first step's sleep, its SIGTERM handler installed
    client.call("cancel", job=job["id"])
    done = wait_done(client, job["id"])
    assert done["state"] == "failed"
    # (a SIGTERM that beat the handler ends it at once: "cancelled by the host" alone)
    assert done["error"] in ("cancelled by the host (killed after it ignored SIGTERM for 5 s)",
                             "cancelled by the host")


def test_clean_stop_then_restart_resumes_the_job_and_keeps_results(daemon, tmp_path):
    d = daemon()
    client = d.client()
    finished = client.call("submit", kind="echo", params={"keep": "me"})[0]["job"]
    wait_done(client, finished["id"])
    job = client.call("submit", kind="sleep", params={"seconds": 2.0, "steps": 20})[0]["job"]
    wait_for_step(client, job["id"], 3)
    assert client.call("stop")[0]["stopping"] is True
    assert d.proc.wait(15) == 0  # stopped cleanly, not killed
    record = json.loads((tmp_path / "board" / "jobs" / job["id"] / "job.json").read_text())
    assert record["state"] == "queued" and "interrupted" in record["note"]

    again = daemon().client()
    done = wait_done(again, job["id"])
    assert done["state"] == "finished"
    assert done["result"]["resumed_from"] >= 3 and done["result"]["starts"] == 2
    kept = again.call("job", job=finished["id"])[0]["job"]
    assert kept["state"] == "finished" and kept["result"]["params"] == {"keep": "me"}


def test_daemon_killed_mid_job_adopts_the_job_instead_of_rerunning_it(daemon):
    d = daemon()
    client = d.client()
    job = client.call("submit", kind="sleep", params={"seconds": 2.0, "steps": 20})[0]["job"]
    wait_for_step(client, job["id"], 2)
    d.proc.kill()
    d.proc.wait()
    again = daemon().client()
    done = wait_done(again, job["id"])
    assert done["state"] == "finished"
    assert done["result"]["starts"] == 1 and done["result"]["resumed_from"] == 0


def test_file_transfer_is_chunked_checked_and_resumable(daemon, tmp_path):
    d = daemon()
    client = d.client()
    data = os.urandom(600_000)
    sha = hashlib.sha256(data).hexdigest()
    first = client.call("put_file", data[:200_000], path="inputs/blob.bin", offset=0,
                        size=len(data), sha256=sha)[0]
    assert first == {**first, "have": 200_000, "done": False}
    client.close()  # the link drops; the host comes back and asks how much the board has
    client = d.client()
    state = client.call("stat_file", path="inputs/blob.bin", sha256=sha)[0]
    assert state["exists"] is False and state["partial"] == 200_000
    with pytest.raises(RemoteError) as err:
        client.call("put_file", data[:1000], path="inputs/blob.bin", offset=0, size=len(data),
                    sha256=sha)
    assert err.value.code == "offset" and err.value.details["have"] == 200_000
    last = client.call("put_file", data[200_000:], path="inputs/blob.bin", offset=200_000,
                       size=len(data), sha256=sha)[0]
    assert last["done"] is True
    assert (tmp_path / "board" / "inputs" / "blob.bin").read_bytes() == data
    header, body = client.call("get_file", path="inputs/blob.bin", offset=100, length=50)
    assert header["size"] == len(data) and body == data[100:150]


def test_tcp_clients_may_not_replace_the_agent_code(daemon):
    client = daemon().client()  # any local user can reach a loopback port
    for path in ("agents/evil.pyz", "agent.current"):
        with pytest.raises(RemoteError, match="only under inputs/"):
            client.call("put_file", b"x", path=path, offset=0, size=1,
                        sha256=hashlib.sha256(b"x").hexdigest())


def test_damaged_upload_is_refused(daemon, tmp_path):
    client = daemon().client()
    with pytest.raises(RemoteError, match="hash to"):
        client.call("put_file", b"abc", path="inputs/x", offset=0, size=3, sha256="0" * 64)
    assert not (tmp_path / "board" / "inputs" / "x").exists()


@pytest.mark.parametrize("path", ["../outside", "/etc/passwd", "jobs/x/job.json", "~/x"])
def test_paths_outside_the_inputs_are_refused(daemon, path):
    client = daemon().client()
    with pytest.raises(RemoteError) as err:
        client.call("put_file", b"x", path=path, offset=0, size=1, sha256="0" * 64)
    assert err.value.code == "bad_request"


def test_bad_requests_get_clear_errors(daemon):
    client = daemon().client()
    with pytest.raises(RemoteError, match="no job kind 'teleport'.*sleep"):
        client.call("submit", kind="teleport", params={})
    with pytest.raises(RemoteError, match="no job 'nope'"):
        client.call("job", job="nope")
    with pytest.raises(RemoteError, match="unknown request 'dance'"):
        client.call("dance")
    with pytest.raises(RemoteError) as err:
        client.call("hello", protocol=99)
    assert err.value.code == "protocol" and "protocol 1" in err.value.message


@pytest.mark.parametrize("request_type, fields, code", [
    ("submit", {"kind": ["echo"], "params": {}}, "unknown_kind"),
    ("submit", {"kind": "echo", "params": {}, "job": [1]}, "bad_request"),
    ("submit", {"kind": "echo", "params": {}, "job": 7}, "bad_request"),
    ("get_file", {"path": "inputs/x.bin", "length": -1}, "bad_request"),
    ("get_file", {"path": "inputs/x.bin", "length": "all"}, "bad_request"),
    ("get_file", {"path": "inputs/x.bin", "length": None}, "bad_request"),
    ("get_file", {"path": "inputs/x.bin", "offset": True}, "bad_request"),
    ("put_file", {"path": "inputs/y.bin", "offset": True, "size": 5, "sha256": "0" * 64},
     "bad_request"),
])
def test_a_field_of_the_wrong_type_is_a_bad_request_not_an_internal_error(
        daemon, tmp_path, request_type, fields, code):
    # Found by sending random requests to a daemon: these answered "internal" with a Python
    # error (unhashable list, int("all")), and a negative length read the whole file into one
    # reply. The connection stays usable after each refusal.
    board = daemon()
    (tmp_path / "board" / "inputs").mkdir(exist_ok=True)
    (tmp_path / "board" / "inputs" / "x.bin").write_bytes(b"x" * 1000)
    client = board.client()
    with pytest.raises(RemoteError) as refused:
        client.call(request_type, **fields)
    assert refused.value.code == code, refused.value.message
    assert client.call("ping")[0]["ok"]


def test_random_requests_are_each_answered_and_none_is_an_internal_error(daemon, tmp_path):
    """Seeded random requests: every type (and unknown ones), each with a few fields set to
    values of every JSON type (null, booleans, huge and negative numbers, strings that are
    paths out of the workdir, lists, objects). Each gets an answer on the same connection, and
    none is `internal` (a Python error in the daemon, not a refusal). Jobs submitted are echo
    jobs, which end at once whatever their params."""
    import random
    rng = random.Random(7)
    board = daemon()
    (tmp_path / "board" / "inputs").mkdir(exist_ok=True)
    (tmp_path / "board" / "inputs" / "x.bin").write_bytes(b"x" * 5000)
    values = [None, True, False, 0, -1, 2**70, 1.5, "", "x", "../../etc/passwd", "/etc/passwd",
              "inputs/x.bin", "inputs", [], [1], {}, {"a": 1}]
    fields = ["protocol", "client", "page_dir", "kind", "params", "job", "after_rev",
              "timeout_s", "path", "sha256", "hash", "size", "offset", "length", "if_idle"]
    types = ["hello", "ping", "sysinfo", "submit", "job", "wait", "jobs", "cancel",
             "stat_file", "put_file", "get_file", "dance", None, 5]
    client = board.client()
    codes = set()
    for _ in range(300):
        request = {field: rng.choice(values) for field in rng.sample(fields, rng.randint(0, 4))}
        kind = rng.choice(types)
        if kind == "submit" and rng.random() < 0.5:
            request.update(kind="echo", params={"x": rng.choice(values)})
        if kind == "wait":
            request["timeout_s"] = 0.01  # a long poll's other fields still vary
        try:
            client.call(kind, os.urandom(rng.choice([0, 10, 3000])), **request)
            codes.add("ok")
        except RemoteError as refused:
            assert refused.code != "internal", (kind, request, refused.message)
            codes.add(refused.code)
    assert {"ok", "bad_request", "unknown_job", "unknown_kind", "protocol"} <= codes, codes


def test_an_answer_over_the_frame_limit_is_an_error_reply_not_a_dropped_link(daemon):
    # Four jobs with 400 kB of params each make a job list over the 1 MiB header limit; the
    # daemon's connection thread died on it and the host saw the link close.
    client = daemon().client()
    for i in range(4):
        client.call("submit", kind="echo", params={"fail": "x", "pad": "a" * 400_000},
                    job=f"big{i}")
    with pytest.raises(RemoteError, match="too large to send") as refused:
        client.call("jobs")
    assert refused.value.code == "internal"
    assert client.call("job", job="big0")[0]["job"]["id"] == "big0"


def test_a_damaged_job_record_is_ignored_and_the_daemon_serves(daemon, tmp_path):
    # A job.json edited by hand ("order": "x") stopped the daemon from starting at all
    # (ValueError while loading the records): the board answered nobody until it was removed.
    first = daemon()
    client = first.client()
    job = client.call("submit", kind="echo", params={"x": 1}, job="kept")[0]["job"]
    assert wait_done(client, job["id"])["state"] == "finished"
    client.close()
    first.stop()
    for name, damage in [("order", {"order": "x"}), ("state", {"state": "weird"}),
                         ("params", {"params": 5})]:
        damaged = tmp_path / "board" / "jobs" / f"damaged-{name}"
        damaged.mkdir(parents=True)
        record = json.loads((tmp_path / "board" / "jobs" / "kept" / "job.json").read_text())
        (damaged / "job.json").write_text(json.dumps({**record, "id": damaged.name, **damage}))
    client = daemon().client()
    assert [j["id"] for j in client.call("jobs")[0]["jobs"]] == ["kept"]
    job = client.call("submit", kind="echo", params={"x": 2})[0]["job"]
    assert wait_done(client, job["id"])["state"] == "finished"


def test_refuses_to_listen_on_a_public_interface(tmp_path):
    result = subprocess.run(agent_command() + ["serve", "--tcp", "0.0.0.0:7070", "--workdir",
                                               str(tmp_path)], capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 2
    assert "loopback only" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_one_daemon_per_workdir(daemon, tmp_path):
    daemon()
    result = subprocess.run(agent_command() + ["serve", "--tcp", "127.0.0.1:0", "--workdir",
                                               str(tmp_path / "board")],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "already runs" in result.stderr


def test_stdio_relay_starts_a_daemon_that_outlives_it(tmp_path):
    workdir = tmp_path / "board"
    relay = subprocess.Popen(agent_command() + ["serve", "--stdio", "--workdir", str(workdir)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL)
    try:
        client = Client(FrameStream(PipeChannel(relay.stdout.fileno(), relay.stdin.fileno(),
                                                close_fds=False)))
        assert client.hello("test")["protocol"] == 1
        job = client.call("submit", kind="sleep", params={"seconds": 0.5, "steps": 5})[0]["job"]
        relay.stdin.close()  # the SSH session ends
        assert relay.wait(10) == 0
        sock = socket.socket(socket.AF_UNIX)
        sock.connect(str(workdir / "agent.sock"))  # the daemon is still there ...
        done = wait_done(Client(FrameStream(sock)), job["id"])
        assert done["state"] == "finished"  # ... and so is the job
    finally:
        stop_agent(workdir)
    assert not (workdir / "agent.sock").exists()


def test_a_daemon_whose_socket_was_removed_is_stopped_and_replaced(tmp_path, monkeypatch):
    # Removed under it (a workdir cleaned by hand), its socket answered nobody, no other
    # daemon could take the lock, and `stop` said none ran: the board was lost until a reboot.
    from edge_remat_agent.daemon import launcher
    from edge_remat_agent.daemon.layout import Layout
    workdir = tmp_path / "board"
    layout = Layout(workdir)
    lost = subprocess.Popen(agent_command() + ["serve", "--daemon", "--workdir", str(workdir)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not (workdir / "agent.sock").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        (workdir / "agent.sock").unlink()
        said = launcher.stop_daemon(layout)
        assert "answered on no socket" in said and lost.wait(15) is not None
        assert launcher.stop_daemon(layout) == f"no agent daemon runs for {workdir}"

        lost = subprocess.Popen(agent_command() + ["serve", "--daemon", "--workdir",
                                                   str(workdir)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while not (workdir / "agent.sock").exists() and time.monotonic() < deadline + 30:
            time.sleep(0.05)
        (workdir / "agent.sock").unlink()
        monkeypatch.setattr(launcher, "STARTING_S", 0.0)  # its lock is not a starting one's
        sock = launcher.ensure_daemon(layout, timeout=30)  # what a host's connection does
        sock.close()
        assert lost.wait(15) is not None  # the lost one was stopped, a new one answers
    finally:
        if lost.poll() is None:
            lost.kill()
        stop_agent(workdir)


def daemon_run_by(python, workdir) -> subprocess.Popen:
    """An agent daemon for `workdir` started by the interpreter at path `python`, once its
    socket is there."""
    daemon = subprocess.Popen([str(python), *agent_command()[1:], "serve", "--daemon",
                               "--workdir", str(workdir)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not (workdir / "agent.sock").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return daemon


def test_a_daemon_whose_python_is_gone_is_replaced_when_idle(tmp_path):
    # Started from a virtual environment since deleted (.ci/check-wheel's, a user's), it still
    # answered the host, and every job it started failed ("internal error in the agent").
    from edge_remat_agent.daemon import launcher
    from edge_remat_agent.daemon.layout import Layout
    workdir = tmp_path / "board"
    python = tmp_path / "venv-python"
    python.symlink_to(sys.executable)
    stale = daemon_run_by(python, workdir)
    try:
        python.unlink()  # the environment is deleted
        client = Client(FrameStream(launcher.ensure_daemon(Layout(workdir), timeout=30)))
        assert stale.wait(15) is not None  # the stale daemon was stopped ...
        assert client.hello("test")["executable"] == sys.executable  # ... a new one answers
        job = client.call("submit", kind="sleep", params={"seconds": 0.1, "steps": 1})[0]["job"]
        assert wait_done(client, job["id"])["state"] == "finished"
    finally:
        if stale.poll() is None:
            stale.kill()
        stop_agent(workdir)


def test_an_idle_daemon_of_another_python_is_replaced_by_the_configured_one(tmp_path):
    """QA: with the device config's `python` changed, the daemon started before under the old
    one kept answering for its idle hour (devices --check named the old interpreter). The
    front end runs the configured Python: an idle daemon of another is replaced."""
    from edge_remat_agent.daemon import launcher
    from edge_remat_agent.daemon.layout import Layout
    workdir = tmp_path / "board"
    other = tmp_path / "other-python"
    other.symlink_to(sys.executable)  # another path: another interpreter as far as it knows
    old = daemon_run_by(other, workdir)
    try:
        client = Client(FrameStream(launcher.ensure_daemon(Layout(workdir), timeout=30)))
        assert old.wait(15) is not None
        assert client.hello("test")["executable"] == sys.executable
    finally:
        if old.poll() is None:
            old.kill()
        stop_agent(workdir)


def test_out_of_disk_names_the_margin_it_keeps(tmp_path, monkeypatch):
    """A disk with room for the file but not for the 1 MiB kept free (its free space stands in
    for a nearly full board). QA: "the board has 1093632 bytes free ..., the file needs
    139294" read as a refusal with room to spare."""
    import collections
    from edge_remat_agent.daemon import files
    from edge_remat_agent.daemon.layout import Layout
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(files.shutil, "disk_usage", lambda path: usage(2 << 20, 0, 1093632))
    data = b"x" * 139294
    request = {"path": "inputs/page.bin", "offset": 0, "size": len(data),
               "sha256": hashlib.sha256(data).hexdigest()}
    with pytest.raises(files.RequestError) as refused:
        files.put_file(Layout(tmp_path).ensure(), request, data)
    assert "the file needs 139294 bytes and 1048576 more (1 MiB) are kept free" in str(
        refused.value)


def test_a_job_cancelled_between_its_own_checks_stops_at_once(daemon, tmp_path):
    """QA: Ctrl-C while a profile measured the board (flash, power, footprint) or a run
    captured its graph: those phases never look at ctx.cancelled, so the job sat out the
    5 s grace and was SIGKILLed, the host waiting 10-15 s ("up to 10 s", it said). Here the
    profile job's idle-power window (30 s, no check inside) is cancelled."""
    client = daemon().client()
    job = client.call("submit", kind="profile",
                      params={"sizes": [4096, 65536], "idle_s": 30, "busy_s": 0.1,
                              "no_footprint": True})[0]["job"]
    log = tmp_path / "board" / "jobs" / job["id"] / "log.txt"
    deadline = time.monotonic() + 60
    while not (log.exists() and "power:" in log.read_text()):  # the idle window began
        assert time.monotonic() < deadline, "the profile job never reached its power pass"
        time.sleep(0.1)
    time.sleep(0.5)
    cancelled_at = time.monotonic()
    client.call("cancel", job=job["id"])
    done = wait_done(client, job["id"])
    assert done["state"] == "failed" and done["error"] == "cancelled by the host", done
    assert time.monotonic() - cancelled_at < 4.0  # not the grace's SIGKILL


def test_a_cancel_sent_behind_an_abandoned_wait_is_answered_at_once(daemon):
    """QA: Ctrl-C while the host long-polled a job that reported no progress (a capture on
    the board) sent its cancel on the same connection, where it waited behind the 10 s poll:
    the board got the cancel 10 s after Ctrl-C. The wait is abandoned here as the host's
    KeyboardInterrupt leaves it: sent, its answer never read."""
    client = daemon().client()
    job = client.call("submit", kind="sleep", params={"seconds": 30, "steps": 1})[0]["job"]
    wait_for_running(client, job["id"])
    rev = client.call("job", job=job["id"])[0]["job"]["rev"]
    client.stream.send({"type": "wait", "id": 10**6, "job": job["id"], "after_rev": rev,
                        "timeout_s": 8})
    asked = time.monotonic()
    answer = client.call("cancel", job=job["id"])[0]  # skips the wait's answer by its id
    assert answer["type"] == "reply" and time.monotonic() - asked < 2.0
    done = wait_done(client, job["id"])
    assert done["error"] == "cancelled by the host" and time.monotonic() - asked < 4.0, done
