"""Bad-input catalogue, boards: device configs, SSH configs and ports that are not what they
claim, plans and graphs the board would refuse (refused on the host: nothing is sent, the
board's workdir is never even made), model factories that fail, an unwritable HOME."""

from __future__ import annotations

import json
import os
import socket
import time

import pytest

from helpers.bad_inputs import (BAD_INPUT, JOB_FAILED, UNREACHABLE, cli, env, no_new_files,
                                refused, tiny_graph, tiny_plan, tree)
from helpers.not_sshd import HTTP_REPLY, OneShotServer

pytestmark = pytest.mark.loopback


# --- device configs ------------------------------------------------------------------------

DEVICE_CASES = [
    ("TOML syntax", "name = \"x\"\n[connection\nkind = \"local\"\n", ["x.toml"]),
    ("unknown kind", "name = \"x\"\n[connection]\nkind = \"carrier-pigeon\"\n",
     ["carrier-pigeon"]),
    ("port as text", "name = \"x\"\n[connection]\nkind = \"ssh\"\nhost = \"h\"\nport = \"abc\"\n",
     ["port"]),
    ("unknown field", "name = \"x\"\n[connection]\nkind = \"local\"\nspeed = 3\n", ["speed"]),
    ("negative RAM", "name = \"x\"\n[connection]\nkind = \"local\"\n[hardware]\nram_bytes = -1\n",
     ["ram_bytes"]),
]


@pytest.mark.parametrize("case,text,words", DEVICE_CASES, ids=[c[0] for c in DEVICE_CASES])
def test_broken_device_config(tmp_path, case, text, words):
    config = tmp_path / "x.toml"
    config.write_text(text)
    refused(cli("job", "sysinfo", "--device", config), BAD_INPUT, *words)


def test_unknown_device_name(tmp_path):
    refused(cli("job", "sysinfo", "--device", "no-such-board"), BAD_INPUT, "no-such-board")


# --- SSH: ports that are not sshd, configs paramiko cannot read ----------------------------

def _ssh_config(tmp_path, port: int, host: str = "127.0.0.1", ssh_config: str = "none") -> str:
    key = tmp_path / "key"
    key.write_text("not a key")
    path = tmp_path / "board.toml"
    path.write_text(f"""name = "board"
[connection]
kind = "ssh"
host = "{host}"
port = {port}
user = "nobody"
key = "{key}"
connect_timeout_s = 2
reconnect_timeout_s = 0
known_hosts = "{tmp_path / 'known_hosts'}"
ssh_config = "{ssh_config}"
""")
    return str(path)


@pytest.mark.parametrize("mode", ["http", "silent"])
def test_port_that_does_not_speak_ssh(tmp_path, mode):
    server = OneShotServer(HTTP_REPLY if mode == "http" else None)
    try:
        started = time.monotonic()
        refused(cli("job", "sysinfo", "--device", _ssh_config(tmp_path, server.port)),
                UNREACHABLE, "did not speak SSH", str(server.port))
        assert time.monotonic() - started < 10  # the config's 2 s, not paramiko's 15
    finally:
        server.close()


def test_closed_port(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    refused(cli("job", "sysinfo", "--device", _ssh_config(tmp_path, port)), UNREACHABLE,
            "cannot reach")


def test_host_name_that_does_not_resolve(tmp_path):
    refused(cli("job", "sysinfo", "--device", _ssh_config(tmp_path, 22, "no-such-host.invalid")),
            UNREACHABLE, "no-such-host.invalid")


def test_unparsable_ssh_config_naming_the_board(tmp_path):
    config = tmp_path / "ssh_config"
    config.write_text("Host myboard\n  HostName\n")
    refused(cli("job", "sysinfo", "--device",
                _ssh_config(tmp_path, 22, "myboard", str(config))), BAD_INPUT,
            str(config), "myboard")


def test_unparsable_ssh_config_does_not_break_other_boards(tmp_path):
    """A broken entry for another host: this board's own settings still connect (and here
    meet a closed port, exit 3, not a parse error)."""
    config = tmp_path / "ssh_config"
    config.write_text("Host elsewhere\n  HostName\n")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    refused(cli("job", "sysinfo", "--device",
                _ssh_config(tmp_path, port, ssh_config=str(config))), UNREACHABLE,
            "cannot reach")


# --- refused on the host before deploy sends anything ----------------------------------------

CAPTURED = {"source": {"model": "mlp"}}  # says which model: what the executor needs


def _deploy_refused(tmp_path, workdir, plan, graph, *words, extra=()):
    before = tree(tmp_path)
    refused(cli("deploy", plan, "--device", "bench", "--graph", graph,
                "--out", tmp_path / "out", *extra, environ=env()), BAD_INPUT, *words)
    assert not workdir.exists(), "something was sent to the board"
    no_new_files(before, tmp_path)


def test_deploy_steps_zero(tmp_path, bench):
    graph = tiny_graph(tmp_path, capture=CAPTURED)
    _deploy_refused(tmp_path, bench, tiny_plan(tmp_path, graph), graph, "--steps",
                    extra=["--steps", "0"])


def test_deploy_steps_beyond_any_run(tmp_path, bench):
    """QA: --steps 99999999999999999999 (beyond 2^64) was taken and trained forever at 0%."""
    graph = tiny_graph(tmp_path, capture=CAPTURED)
    _deploy_refused(tmp_path, bench, tiny_plan(tmp_path, graph), graph, "--steps",
                    "99999999999999999999", "10,000,000", extra=["--steps",
                                                                 "99999999999999999999"])


def test_run_steps_beyond_any_run(tmp_path, bench):
    before = tree(tmp_path)
    refused(cli("run", "--device", "bench", "--model", "mlp", "--budget", "50%", "--steps",
                "99999999999999999999", "--out", tmp_path / "out"), BAD_INPUT, "--steps",
            "10,000,000")
    assert not bench.exists(), "something was sent to the board"
    no_new_files(before, tmp_path)


def test_deploy_out_empty_is_refused_not_read_as_this_folder(tmp_path, bench):
    """QA: `deploy --out ''` wrote run_report.json and weights.pt into the current folder;
    every other command refuses an empty --out."""
    graph = tiny_graph(tmp_path, capture=CAPTURED)
    plan = tiny_plan(tmp_path, graph)
    before = tree(tmp_path)
    refused(cli("deploy", plan, "--device", "bench", "--graph", graph, "--out", "",
                cwd=tmp_path), BAD_INPUT, "--out")
    assert not bench.exists(), "something was sent to the board"
    no_new_files(before, tmp_path)


def test_deploy_plan_for_another_graph(tmp_path, bench):
    graph = tiny_graph(tmp_path, capture=CAPTURED)
    other = tiny_graph(tmp_path, "other.json", capture=CAPTURED, fixed_bytes=7)
    _deploy_refused(tmp_path, bench, tiny_plan(tmp_path, graph), other, "another graph")


def test_deploy_plan_over_its_own_budget(tmp_path, bench):
    graph = tiny_graph(tmp_path, capture=CAPTURED)
    plan = tiny_plan(tmp_path, graph)
    obj = json.loads(plan.read_text())
    obj["budget_bytes"] = 1000
    plan.write_text(json.dumps(obj))
    _deploy_refused(tmp_path, bench, plan, graph, "over its own budget")


def test_deploy_plan_freeing_twice(tmp_path, bench):
    graph = tiny_graph(tmp_path, capture=CAPTURED)
    plan = tiny_plan(tmp_path, graph)
    obj = json.loads(plan.read_text())
    obj["stages"][-1] += [{"op": "free", "node": "a"}, {"op": "free", "node": "a"}]
    plan.write_text(json.dumps(obj))
    _deploy_refused(tmp_path, bench, plan, graph, "invalid plan")


def test_deploy_planning_only_graph(tmp_path, bench):
    graph = tiny_graph(tmp_path, planning_only=True)
    _deploy_refused(tmp_path, bench, tiny_plan(tmp_path, graph), graph, "planning only")


def test_deploy_hand_written_graph(tmp_path, bench):
    graph = tiny_graph(tmp_path)
    _deploy_refused(tmp_path, bench, tiny_plan(tmp_path, graph), graph, "which model")


def test_deploy_graph_naming_a_relative_model_file(tmp_path, bench):
    """An old graph.json stored `examples/my_model.py:make_model` as given: the board, in its
    own folder, could not find the file, and failed after the job was queued."""
    graph = tiny_graph(tmp_path, capture={"source": {"model": "examples/my_model.py:make_model"}})
    _deploy_refused(tmp_path, bench, tiny_plan(tmp_path, graph), graph,
                    "relative path, examples/my_model.py", "capture it again", "absolute path")


def test_deploy_plan_without_graph_fingerprint(tmp_path, bench):
    graph = tiny_graph(tmp_path, capture=CAPTURED)
    plan = tiny_plan(tmp_path, graph)
    obj = json.loads(plan.read_text())
    obj["graph_fingerprint"] = ""
    plan.write_text(json.dumps(obj))
    _deploy_refused(tmp_path, bench, plan, graph, "graph_fingerprint")


def test_deploy_out_is_a_file(tmp_path, bench):
    graph = tiny_graph(tmp_path, capture=CAPTURED)
    plan = tiny_plan(tmp_path, graph)
    (tmp_path / "out").write_text("x")
    refused(cli("deploy", plan, "--device", "bench", "--graph", graph, "--out",
                tmp_path / "out"), BAD_INPUT, "not a folder")
    assert not bench.exists()


def test_job_kind_the_agent_lacks(tmp_path, bench):
    refused(cli("job", "teleport", "--device", "bench", timeout=120), BAD_INPUT, "teleport")


JOB_PARAM_CASES = [
    ("sleep", ["--param", "seconds=abc"], ["param 'seconds'", "'abc'", "number"]),
    ("sleep", ["--param", "steps=2.5"], ["param 'steps'", "whole number"]),
    # QA: -5 was time.sleep's "ValueError: sleep length must be non-negative", 1e300 and
    # 1e12 its "OverflowError: timestamp out of range", failed jobs (exit 1)
    ("sleep", ["--param", "seconds=-5"], ["param 'seconds'", "-5", "from 0 to 604800"]),
    ("sleep", ["--param", "seconds=1e300"], ["param 'seconds'", "from 0 to 604800"]),
    ("sleep", ["--param", "seconds=1e12"], ["param 'seconds'", "from 0 to 604800"]),
    ("sleep", ["--param", "steps=0"], ["param 'steps'", "from 1 to 100000"]),
    ("train-plain", ["--param", "model=mlp", "--param", "accumulate=0"],
     ["param 'accumulate'", "of at least 1"]),
    ("train-plain", ["--param", "model=mlp", "--param", "warmup=50"], ["--warmup 50"]),
    ("run", [], ["the run job needs a plan file (param 'plan')"]),
    # QA: `deploy --steps 99999999999999999999` trained forever at 0%: the board bounds it too
    ("run", ["--param", "steps=99999999999999999999"], ["param 'steps'", "from 1 to 10000000"]),
    ("train-plain", ["--param", "model=mlp", "--param", "steps=99999999999999999999"],
     ["param 'steps'", "from 1 to 10000000"]),
    ("profile", ["--param", "graph=/nonexistent.json"],
     ["param 'graph'", "/nonexistent.json", "relative to the agent's workdir", "--input graph="]),
    ("profile", ["--param", "graph=inputs/missing.json"],
     ["param 'graph'", "inputs/missing.json", "no file"]),
    ("profile", ["--param", "bogus=1"], ["unknown profile param 'bogus'"]),
]


@pytest.mark.parametrize("kind,args,words", JOB_PARAM_CASES,
                         ids=[f"{c[0]}-{'-'.join(c[1]) or 'none'}" for c in JOB_PARAM_CASES])
def test_a_job_param_the_board_refuses_is_bad_input_naming_it(tmp_path, bench, kind, args,
                                                               words):
    """QA: `job sleep --param seconds=abc` said "failed on local: ValueError: could not
    convert string to float: 'abc'", exit 1 (a failed job), as did a run job with no plan and
    a profile job given a path outside the workdir. The job's params are read through
    JobParams, whose refusal the record marks bad input: exit 2, one line naming the param,
    no exception class before it; --json's record says `bad_input`."""
    line = refused(cli("job", kind, "--device", "bench", *args, timeout=120), BAD_INPUT, *words)
    assert "Error:" not in line, line  # no ValueError: / BadParam: before the board's words
    proc = cli("job", kind, "--device", "bench", "--json", *args, timeout=120)
    record = json.loads(proc.stdout)["job"]
    assert proc.returncode == BAD_INPUT and record["bad_input"] is True, proc.stdout
    # the host's word for it, as the status says (the board's is kept: board_state)
    assert record["state"] == "bad_input" and record["board_state"] == "failed", record
    assert not record["error"].startswith(("ValueError", "BadParam")), record


def test_a_detached_job_whose_file_the_board_refuses_ends_as_bad_input(tmp_path, bench):
    """QA: `job sleep --param seconds=1e12 --detach` was accepted and its job then failed
    with OverflowError. Such a param is now refused at submit (test_detach_refuses_bad_params);
    a file only the board can look for is refused there, its record says bad_input and
    job-status exits 2 naming it."""
    proc = cli("job", "profile", "--device", "bench", "--param", "graph=inputs/missing.json",
               "--detach", timeout=120)
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip().splitlines()[-1]
    refused(cli("job-status", job_id, "--device", "bench", "--wait", timeout=120), BAD_INPUT,
            "param 'graph'", "inputs/missing.json", "no file")
    status = cli("job-status", job_id, "--device", "bench", "--json", timeout=120)
    assert json.loads(status.stdout)["job"]["bad_input"] is True, status.stdout


def test_a_run_job_whose_input_the_executor_refuses_is_bad_input(tmp_path, bench):
    """A run on the board that the executor refuses before anything ran (its BadInput: here a
    graph that the board's capture of the model does not reproduce, as one made with another
    torch; also a batch the model cannot take, an unknown allocator) is bad input, as a refused
    param is: exit 2, the board's words with no class name before them. It was a failed job,
    exit 1, "PlanMismatch: ..."."""
    graph = tiny_graph(tmp_path, capture=CAPTURED)  # says mlp, and is not mlp's graph
    plan = tiny_plan(tmp_path, graph)
    args = ("job", "run", "--device", "bench", "--input", f"plan={plan}", "--input",
            f"graph={graph}")
    line = refused(cli(*args, timeout=180), BAD_INPUT, "re-capturing gave a different graph",
                   "the file has 5 nodes, the capture here", "or a graph file edited by hand",
                   "Remedy: capture the graph with the same torch")
    assert "PlanMismatch" not in line and "BadInput" not in line, line
    proc = cli(*args, "--json", timeout=180)
    record = json.loads(proc.stdout)["job"]
    assert proc.returncode == BAD_INPUT and record["bad_input"] is True, proc.stdout


def test_a_run_jobs_bad_schedule_is_refused_before_the_capture(tmp_path, bench):
    """A warmup longer than the run was refused by run_plan, after the board had captured the
    model (seconds to a minute on a board); it is now refused with the params, as train-plain
    refuses it. The graph here is not the model's, so a refusal after the capture would name
    the capture's mismatch instead."""
    graph = tiny_graph(tmp_path, capture=CAPTURED)
    plan = tiny_plan(tmp_path, graph)
    line = refused(cli("job", "run", "--device", "bench", "--input", f"plan={plan}", "--input",
                       f"graph={graph}", "--param", "steps=5", "--param", "warmup=50",
                       timeout=180), BAD_INPUT, "--warmup 50", "5 steps")
    assert "re-capturing" not in line, line


def test_a_job_that_fails_with_good_params_is_still_a_failed_job(tmp_path, bench):
    """Only a refused param is bad input: the job's own failure stays exit 1."""
    refused(cli("job", "echo", "--device", "bench", "--param", "fail=boom", timeout=120),
            JOB_FAILED, "RuntimeError: boom")


def test_unwritable_home_still_reaches_the_board(tmp_path, bench):
    """The agent archive is cached under HOME; where HOME cannot be written, under /tmp."""
    home = "/sys" if os.geteuid() == 0 else str(tmp_path / "locked-home")
    if os.geteuid() != 0:
        os.mkdir(home, 0o555)
    environ = {k: v for k, v in env(HOME=home).items() if k != "XDG_CACHE_HOME"}
    proc = cli("job", "sysinfo", "--device", "bench", "--json", environ=environ)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["status"] == "finished"


# --- model factories that fail ---------------------------------------------------------------

FACTORY = '''
import torch
def raises():
    raise RuntimeError("no weights here")
def not_a_tuple():
    return 3
def grad_hook():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 1)
        def forward(self, x):
            return self.fc(x).square().mean()
    net = Net()
    net.fc.weight.register_hook(lambda g: g.clamp(-0.01, 0.01))  # eager clips, a plan would not
    return net, (torch.randn(2, 4),)
def in_place_bug():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)
        def forward(self, x):
            h = torch.sigmoid(self.fc(x))
            h.mul_(2)  # sigmoid's backward needs its output: eager's backward fails too
            return h.sum()
    return Net(), (torch.randn(2, 4),)
def on_meta():
    with torch.device("meta"):
        net = torch.nn.Linear(4, 1)
    return net, (torch.randn(2, 4),)
'''

FACTORY_CASES = [
    ("raises", "factory.py:raises", ["RuntimeError", "no weights here", "factory.py line"]),
    ("returns 3", "factory.py:not_a_tuple", ["(module, example_args)"]),
    ("no such function", "factory.py:missing", ["missing"]),
    ("no such file", "nofile.py:make", ["no such file"]),
    ("import raises", "broken.py:make", ["ZeroDivisionError"]),
    ("gradient hook", "factory.py:grad_hook", ["fc.weight", "gradient hook", "remove it"]),
    ("weights on meta", "factory.py:on_meta", ["'weight'", "meta device", "real weights"]),
    ("in-place bug", "factory.py:in_place_bug",
     ["modified by an inplace operation", "plain pytorch's backward fails the same way"]),
]


@pytest.mark.parametrize("case,spec,words", FACTORY_CASES, ids=[c[0] for c in FACTORY_CASES])
def test_model_factory_fails(tmp_path, case, spec, words):
    (tmp_path / "factory.py").write_text(FACTORY)
    (tmp_path / "broken.py").write_text("x = 1 / 0\n")
    before = tree(tmp_path)
    proc = cli("graph", "--model", spec, "-o", "g.json", cwd=tmp_path)
    line = refused(proc, BAD_INPUT, *words)
    assert proc.stderr.strip() == line  # nothing else: no warning torch printed on the way
    assert "backtrace" not in line  # torch's hint points at a traceback nobody printed
    no_new_files(before, tmp_path, allowed=["__pycache__"])


def test_a_job_run_by_another_build_of_the_agent_says_so_first(tmp_path, bench):
    """Another checkout's agent, busy on the shared board when this host connects, is kept and
    runs this host's job with its own code: the job's error (e.g. 'PlanMismatch ... another
    torch version or model code?') then blamed the wrong cause. The host knows the builds
    differ (the daemon's hello) and says that first."""
    import hashlib
    import shutil
    from pathlib import Path

    import edge_remat_agent
    from edge_remat.devices import find_device
    from edge_remat.transport import Board, JobFailed
    from edge_remat.transport.zipapp import AgentArchive, archive_bytes
    package = tmp_path / "other" / "edge_remat_agent"
    shutil.copytree(Path(edge_remat_agent.__file__).parent, package,
                    ignore=shutil.ignore_patterns("__pycache__"))
    with open(package / "__init__.py", "a") as handle:
        handle.write("\n# another checkout's build\n")
    data = archive_bytes(package)
    (tmp_path / "other.pyz").write_bytes(data)
    other = AgentArchive(tmp_path / "other.pyz", hashlib.sha256(data).hexdigest())
    device = find_device("bench")
    with Board(device, archive=other) as board:
        board.submit("sleep", {"seconds": 3, "steps": 3})
    with Board(device) as board:
        with pytest.raises(JobFailed) as failed:
            board.run_job("echo", {"fail": "PlanMismatch: another torch version?"})
    message = str(failed.value)
    assert "\n" not in message and "the board said: RuntimeError: PlanMismatch" in message, message
    assert message.index(f"the board's agent is another build ({other.sha256[:12]})") \
        < message.index("the board said: RuntimeError: PlanMismatch"), message
    with Board(device) as board:  # once idle, this host's agent replaces it: no such words
        with pytest.raises(JobFailed) as failed:
            board.run_job("echo", {"fail": "boom"})
    assert "another build" not in str(failed.value) and "boom" in str(failed.value)
