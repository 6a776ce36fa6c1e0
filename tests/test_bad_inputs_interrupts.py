"""Bad-input catalogue, interrupts and faults: Ctrl-C (SIGINT) while a board job runs cancels
it, or with --keep-running leaves it and says how to come back; `job-cancel` stops it; Ctrl-C
during a CP-SAT solve ends at once; no solver library keeps the signal for itself; a job that
fails is exit 1. All through the real CLI, with the real agent daemon on this machine."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from helpers.bad_inputs import (BAD_INPUT, COMMAND, INTERRUPTED, JOB_FAILED, REPO, UNREACHABLE,
                                cli, env, refused, tiny_graph, wait_for_line)
from helpers.board_fixtures import needs_sshd, stop_agent
from helpers.small_graphs import random_dag

pytestmark = [pytest.mark.slow, pytest.mark.loopback]


def _start(*args) -> subprocess.Popen:
    return subprocess.Popen([*COMMAND, *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env())


def _interrupt(proc: subprocess.Popen, seen: list) -> subprocess.CompletedProcess:
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "".join(seen) + err)


def _state(job_id: str, device: str = "bench") -> dict:
    proc = cli("job-status", job_id, "--device", device, "--json", environ=env())
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_ctrl_c_cancels_the_board_job(tmp_path, bench):
    proc = _start("job", "sleep", "--device", "bench", "--id", "nap-1", "--param", "seconds=60",
                  "--param", "steps=60")
    seen = wait_for_line(proc, "step 1/60")
    started = time.monotonic()
    done = _interrupt(proc, seen)
    line = refused(done, INTERRUPTED, "cancelled job nap-1")
    assert time.monotonic() - started < 20
    # said at once, before the board answers, with what a second Ctrl-C does
    assert "cancelling job nap-1 (up to 10 s; Ctrl-C again leaves it running)" in done.stderr
    state = _state("nap-1")
    assert state["status"] == "cancelled" and "cancelled" in state["error"], (line, state)


def test_sigterm_cancels_the_board_job_as_ctrl_c_does(tmp_path, bench):
    proc = _start("job", "sleep", "--device", "bench", "--id", "nap-term", "--param",
                  "seconds=60", "--param", "steps=60")
    seen = wait_for_line(proc, "step 1/60")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    refused(subprocess.CompletedProcess(proc.args, proc.returncode, out, "".join(seen) + err),
            INTERRUPTED, "interrupted (SIGTERM)", "cancelled job nap-term")
    state = _state("nap-term")
    assert state["status"] == "cancelled" and "cancelled" in state["error"], state


def test_ctrl_c_with_keep_running_then_job_cancel(tmp_path, bench):
    proc = _start("job", "sleep", "--device", "bench", "--id", "nap-2", "--param", "seconds=60",
                  "--param", "steps=60", "--keep-running")
    seen = wait_for_line(proc, "step 1/60")
    refused(_interrupt(proc, seen), INTERRUPTED, "keeps running",
            "job-status nap-2", "job-cancel nap-2")
    assert _state("nap-2")["status"] in ("running", "queued")
    cancel = cli("job-cancel", "nap-2", "--device", "bench", environ=env())
    assert cancel.returncode == 0, cancel.stderr
    assert "cancelled" in cancel.stdout
    assert _state("nap-2")["status"] == "cancelled"


def test_ctrl_c_while_waiting_for_someone_elses_job(tmp_path, bench):
    submit = cli("job", "sleep", "--device", "bench", "--id", "nap-3", "--detach",
                 "--param", "seconds=60", "--param", "steps=60", environ=env())
    assert submit.returncode == 0, submit.stderr
    proc = _start("job-status", "nap-3", "--device", "bench", "--wait")
    seen = wait_for_line(proc, "step 1/60")
    refused(_interrupt(proc, seen), INTERRUPTED, "stopped waiting", "keeps running")
    assert _state("nap-3")["status"] == "running"  # not ours to cancel
    assert cli("job-cancel", "nap-3", "--device", "bench", environ=env()).returncode == 0


def test_job_cancel_unknown_id(tmp_path, bench):
    refused(cli("job-cancel", "no-such-job", "--device", "bench", environ=env()), BAD_INPUT,
            "no-such-job")


def test_failed_job_is_exit_1(tmp_path, bench):
    refused(cli("job", "echo", "--device", "bench", "--param", "fail=boom", environ=env()),
            JOB_FAILED, "boom")


def test_ctrl_c_during_a_cp_sat_solve_writes_the_best_plan_so_far(tmp_path):
    """Ctrl-C ends the solve at once; the heuristics' plan (or CP-SAT's better one) is the
    best found so far: it is written, says so, and replays within the budget."""
    graph = tmp_path / "big.json"
    random_dag(120, 3, max_inputs=3, max_size=50).save(graph)
    plan = tmp_path / "plan.json"
    proc = _start("plan", "--graph", graph, "--budget", "0.5", "--solver", "cpsat",
                  "--time-limit", "120", "-o", plan)
    time.sleep(8)  # heuristics (a plan within a second), then CP-SAT searching
    started = time.monotonic()
    refused(_interrupt(proc, []), INTERRUPTED, "is the best found so far")
    assert time.monotonic() - started < 15  # not the 120 s time limit
    assert json.loads(plan.read_text())["solver"]["status"] == "interrupted"
    replayed = cli("simulate", plan, "--graph", graph, "--json")
    assert replayed.returncode == 0 and json.loads(replayed.stdout)["valid"], replayed.stderr


def test_sigterm_stops_planning_as_ctrl_c_does(tmp_path):
    """`timeout`, a batch scheduler or systemd stop with SIGTERM: the best plan so far is
    written all the same, and the line names the signal."""
    graph = tmp_path / "big.json"
    random_dag(120, 3, max_inputs=3, max_size=50).save(graph)
    plan = tmp_path / "plan.json"
    proc = _start("plan", "--graph", graph, "--budget", "0.5", "--solver", "cpsat",
                  "--time-limit", "120", "-o", plan)
    time.sleep(8)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    refused(subprocess.CompletedProcess(proc.args, proc.returncode, out, err), INTERRUPTED,
            "interrupted (SIGTERM)", "best found so far")
    assert json.loads(plan.read_text())["solver"]["status"] == "interrupted"
    replayed = cli("simulate", plan, "--graph", graph, "--json")
    assert replayed.returncode == 0 and json.loads(replayed.stdout)["valid"], replayed.stderr


def test_ctrl_c_before_any_plan_says_nothing_was_written_and_what_helps(tmp_path):
    """Before: a bare 'error: interrupted (Ctrl-C)'. 5000 nodes seed 1 at 0.8 plans nothing
    in its first minute (docs/planner.md), so a Ctrl-C at 5 s comes before any plan."""
    from edge_remat.synthetic import random_layered
    graph = tmp_path / "rl5000.json"
    random_layered(5000, seed=1, w=0.31).save(graph)
    plan = tmp_path / "plan.json"
    proc = _start("plan", "--graph", graph, "--budget", "0.8", "--time-limit", "60", "-o", plan)
    time.sleep(5)
    refused(_interrupt(proc, []), INTERRUPTED, "before any plan within the budget was found",
            "nothing was written", "larger --budget")
    assert not plan.exists()


def test_ctrl_c_during_a_sweep_keeps_the_budgets_solved(tmp_path):
    """The first budget is below the floor (settled at once), the second is solving when
    Ctrl-C comes, the third never starts: the first two are in the table (sweep.json beside
    the plans, which `plot --sweep DIR` reads), the second's best plan so far is written, and
    the count is of every budget asked (QA: "2 plans of 2 budgets" for 8 asked)."""
    graph = tmp_path / "big.json"
    random_dag(120, 3, max_inputs=3, max_size=50).save(graph)
    out = tmp_path / "plans"
    proc = _start("plan", "--graph", graph, "--sweep", "0.01:1.01:0.5", "--solver", "cpsat",
                  "--time-limit", "120", "-o", out)
    time.sleep(8)
    result = _interrupt(proc, [])
    refused(result, INTERRUPTED, "at budget 0.51", "2 budget(s)", "best found so far")
    assert f"1 plan of 3 budgets written to {out}/" in result.stdout, result.stdout
    table = json.loads((out / "sweep.json").read_text())
    assert table["status"] == "interrupted"
    assert [row["status"] for row in table["sweep"]] == ["infeasible", "interrupted"]
    assert sorted(p.name for p in out.iterdir()) == ["plan-0.51.json", "sweep.json"]
    replayed = cli("simulate", out / "plan-0.51.json", "--graph", graph, "--json")
    assert replayed.returncode == 0 and json.loads(replayed.stdout)["valid"], replayed.stderr


SIGINT_AFTER_SOLVE = """
import os, signal, sys, time
sys.path[:0] = {paths!r}
{solve}
try:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(2)
    print("the signal was lost")
except KeyboardInterrupt:
    print("KeyboardInterrupt")
"""

# Each CP-SAT solve the planner runs in its own process, then Ctrl-C.
SOLVES = {
    "cpsat": """
from helpers.small_graphs import training_chain
from edge_remat.planner.build import build_problem
from edge_remat.planner.cpsat import solve_cpsat
solve_cpsat(build_problem(training_chain(6, 1), "0.7"), time_limit=2.0)
""",
    # the LNS's exact window round (planner/window.py), as it runs where no highspy is loaded
    "window": """
from edge_remat.planner.build import build_problem
from edge_remat.planner.events import from_decisions
from edge_remat.planner.feasible import feasible_schedule
from edge_remat.planner.window import solve_window
from edge_remat.synthetic import random_layered
p = build_problem(random_layered(60, seed=3), "0.8", order="given")
solve_window(from_decisions(p, feasible_schedule(p, 30)), p.budget_bytes - p.fixed, 0, 16)
""",
}


@pytest.mark.parametrize("solve", sorted(SOLVES))
def test_cp_sat_leaves_sigint_to_python(solve):
    """OR-Tools' default (catch_sigint_signal) swallows Ctrl-C during a solve and puts the C
    handler in Python's place for good after it: Ctrl-C after a CP-SAT plan (or an LNS window
    round) would kill the host silently, mid-run, with no cancel."""
    from helpers.bad_inputs import REPO
    paths = [str(REPO / "host"), str(REPO / "agent"), str(REPO / "tests")]
    script = SIGINT_AFTER_SOLVE.format(paths=paths, solve=SOLVES[solve])
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "KeyboardInterrupt", \
        (proc.returncode, proc.stdout, proc.stderr)


def test_ctrl_c_in_run_before_the_board_writes_a_report(tmp_path, bench):
    """`run` interrupted while it captures: exit 130, and OUT/report.json says so."""
    out = tmp_path / "run"
    proc = _start("run", "--device", "bench", "--model", "mlp", "--budget", "0.9",
                  "--steps", "2", "--out", out)
    wait_for_line(proc, "capturing")
    refused(_interrupt(proc, []), INTERRUPTED, "before any job ran on the board", "report.json")
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "interrupted"


def test_sigterm_in_run_writes_the_report_as_ctrl_c_does(tmp_path, bench):
    out = tmp_path / "run"
    proc = _start("run", "--device", "bench", "--model", "mlp", "--budget", "0.9",
                  "--steps", "2", "--out", out)
    wait_for_line(proc, "capturing")
    proc.send_signal(signal.SIGTERM)
    stdout, err = proc.communicate(timeout=60)
    refused(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, err), INTERRUPTED,
            "interrupted (SIGTERM)", "report.json")
    assert json.loads((out / "report.json").read_text())["status"] == "interrupted"


SLOW_BATCHES = """
import time

import torch


def batches(batch, seed):
    generator = torch.Generator().manual_seed(seed)
    while True:
        time.sleep(0.5)  # each step waits: the Ctrl-C below lands mid-run
        yield (torch.randn(batch, 3, 32, 32, generator=generator),
               torch.randint(0, 10, (batch,), generator=generator))
"""


def test_ctrl_c_after_a_checkpoint_names_the_resume_and_a_fresh_run_keeps_it(tmp_path, bench):
    """QA: Ctrl-C at step 3 of 6 (a checkpoint after step 2 on the board) said only "cancelled
    job ..."; the same command again, without --resume, rewrote OUT's record with its own job
    alone, and --resume OUT after that run's Ctrl-C found no checkpoint."""
    data = tmp_path / "slow.py"
    data.write_text(SLOW_BATCHES)
    out = tmp_path / "run"
    args = ("run", "--device", "bench", "--model", "mlp", "--budget", "0.9", "--steps", "6",
            "--checkpoint-every", "2", "--data", f"{data}:batches", "--no-plots",
            "--profile", REPO / "profiles" / "this-machine.json", "--time-limit", "5",
            "--out", out)
    proc = _start(*args)
    first = _interrupt(proc, wait_for_line(proc, "step 3/6", timeout=120))
    refused(first, INTERRUPTED, "cancelled job", "its last checkpoint stays on bench",
            f"--resume {out} goes on from it")
    proc = _start(*args)  # again, without --resume: warned, and stopped before its first step
    second = _interrupt(proc, wait_for_line(proc, "running the plan", timeout=120))
    assert "holds the checkpoint of an earlier run" in second.stderr, second.stderr
    assert "its last checkpoint" not in second.stderr
    resumed = cli("run", *args[1:], "--resume", out, "--json", timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming after step 2" in resumed.stderr
    assert json.loads(resumed.stdout)["status"] == "finished"
    # deploy's Ctrl-C named no checkpoint either (QA), its plan the run's
    deployed = tmp_path / "deployed"
    proc = _start("deploy", out / "plan.json", "--graph", out / "graph.json", "--device",
                  "bench", "--steps", "6", "--checkpoint-every", "2", "--data",
                  f"{data}:batches", "--out", deployed)
    refused(_interrupt(proc, wait_for_line(proc, "step 3/6", timeout=120)), INTERRUPTED,
            "cancelled job", "its last checkpoint stays on bench",
            f"--resume {deployed} goes on from it")


def test_a_run_whose_job_is_cancelled_elsewhere_writes_its_report_with_the_last_step(
        tmp_path, bench):
    """QA: `job-cancel` from another terminal at step 3 ended the run with exit 130 and no
    OUT/report.json, the steps' losses lost; a Ctrl-C's report had no step either. Both now
    write the report, with the job and its last step (its loss) as the board said it."""
    data = tmp_path / "slow.py"
    data.write_text(SLOW_BATCHES)
    out = tmp_path / "run"
    args = ("run", "--device", "bench", "--model", "mlp", "--budget", "0.9", "--steps", "30",
            "--data", f"{data}:batches", "--no-plots", "--profile",
            REPO / "profiles" / "this-machine.json", "--time-limit", "5")
    proc = _start(*args, "--out", out)
    seen = wait_for_line(proc, "step 3/30", timeout=120)
    job = next(word for line in seen for word in line.split() if word.startswith("run-"))
    cancel = cli("job-cancel", job, "--device", "bench", environ=env())
    assert cancel.returncode == 0, cancel.stderr
    stdout, err = proc.communicate(timeout=60)
    refused(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, err), INTERRUPTED,
            "cancelled by the host", "report.json")
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "cancelled" and report["job"] == job, report
    assert report["last_step"]["step"] >= 3 and report["last_step"]["loss"] > 0, report
    # Ctrl-C's report says the last step too
    out = tmp_path / "interrupted"
    proc = _start(*args, "--out", out)
    refused(_interrupt(proc, wait_for_line(proc, "step 2/30", timeout=120)), INTERRUPTED,
            "cancelled job", "report.json")
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "interrupted" and report["last_step"]["step"] >= 2, report


def test_plan_survives_a_tiny_graph_with_cp_sat(tmp_path):
    """The threaded CP-SAT solve still returns plans (and exits 0) when nobody interrupts."""
    graph = tiny_graph(tmp_path)
    proc = cli("plan", "--graph", graph, "--budget", "0.8", "--solver", "cpsat",
               "--time-limit", "5", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["status"] in ("optimal", "timeout")


@needs_sshd
def test_ssh_reconnect_keeps_the_host_pages_forward(tmp_path):
    """A link dropped mid-run: the board reconnects, and the reverse forward the run job was
    told about (127.0.0.1:PORT on the board) is asked for again on the same port."""
    import torch

    from helpers.board_fixtures import loopback_ssh_board
    from edge_remat.devices import find_device
    from edge_remat.transport import Board
    from edge_remat.transport.host_pages import host_pages
    from edge_remat_agent.pages.link import connect_store

    said = []
    with loopback_ssh_board(tmp_path) as (config, _, _):
        with Board(find_device(str(config)), on_event=said.append) as board:
            with host_pages(board, True, said.append) as params:
                address = params["host_pages"]
                page = torch.arange(1000, dtype=torch.float32)
                store = connect_store(address)
                store.put(1, page)
                store.close()
                board.transport.close()  # the link drops: its forward goes with it
                board._session = None
                board.sysinfo()  # the next request reconnects
                assert any("forwarded again" in message for message in said), said
                store = connect_store(address, timeout_s=10)  # the board's side, port unchanged
                store.put(2, page * 2)
                assert torch.equal(store.get(2), page * 2)
                store.close()


# -- an emulated board that two hosts share -------------------------------------------------

EMULATED = "shared-emulated"


@pytest.fixture
def emulated(tmp_path):
    """An emulated board (this machine in a 1 GiB memory cgroup); its cgroup, with whatever
    still runs in it, is removed at the end."""
    from edge_remat.cgroup import unavailable_reason
    from edge_remat.devices import find_device
    from edge_remat.transport.emulated import remove_board_cgroup
    from helpers.board_fixtures import local_board
    if unavailable_reason() is not None:
        pytest.skip(f"no memory cgroup: {unavailable_reason()}")
    with local_board(tmp_path, EMULATED, memory_limit_bytes=2**30) as root:
        device = find_device(EMULATED)
        try:
            yield root / "board"
        finally:
            remove_board_cgroup(device)


def _job_record(workdir, job_id: str) -> dict:
    return json.loads((workdir / "jobs" / job_id / "job.json").read_text())


def _alive(pid) -> bool:
    """A running process (a killed one may linger a moment as a zombie)."""
    import psutil
    try:
        return psutil.Process(int(pid)).status() != psutil.STATUS_ZOMBIE
    except (psutil.Error, TypeError, ValueError):
        return False


@pytest.mark.cgroup
def test_a_run_that_ends_on_an_emulated_board_leaves_another_hosts_job(tmp_path, emulated):
    """Host B's job runs; host A's `run` queues behind it and is interrupted: A cancels its
    own job and leaves the board up, B's job process and the daemon untouched."""
    submit = cli("job", "sleep", "--device", EMULATED, "--id", "host-b", "--detach",
                 "--param", "seconds=60", "--param", "steps=60", environ=env())
    assert submit.returncode == 0, submit.stderr
    proc = _start("run", "--device", EMULATED, "--model", "mlp", "--plain", "--steps", "2",
                  "--out", tmp_path / "run-a")
    seen = wait_for_line(proc, " queued")
    result = _interrupt(proc, seen)
    refused(result, INTERRUPTED, "cancelled job")
    record = _job_record(emulated, "host-b")
    assert record["state"] == "running" and _alive(record["pid"]), record
    assert "stay up" in result.stderr
    assert cli("job-cancel", "host-b", "--device", EMULATED, environ=env()).returncode == 0


@pytest.mark.cgroup
def test_run_keep_running_on_an_emulated_board_leaves_its_job_running(tmp_path, emulated):
    import re
    proc = _start("run", "--device", EMULATED, "--model", "mlp", "--plain", "--steps",
                  "1000000", "--keep-running", "--out", tmp_path / "run")
    seen = wait_for_line(proc, "/1000000:")  # a step done (progress may skip some)
    line = refused(_interrupt(proc, seen), INTERRUPTED, "keeps running", "job-status")
    job_id = re.search(r"job (\S+) keeps running", line).group(1)
    record = _job_record(emulated, job_id)
    assert record["state"] == "running" and _alive(record["pid"]), record
    assert _state(job_id, EMULATED)["status"] == "running"
    assert _job_record(emulated, job_id)["restarts"] == 0
    assert cli("job-cancel", job_id, "--device", EMULATED, environ=env()).returncode == 0


@needs_sshd
def test_giving_up_on_the_link_names_the_job_and_the_way_back(tmp_path, monkeypatch):
    """sshd stops mid-run and reconnecting gives up: exit 3, the line names the job and the
    job-status / job-cancel commands, OUT/report.json says the link was lost; and the job is
    there to come back to once sshd is up again; the job-status line the error names (with its
    --out) then rewrites the report with how the job ended (it stayed link_lost)."""
    import re

    from helpers.board_fixtures import SshServer, ssh_device_config
    (tmp_path / "sshd").mkdir()
    sshd = SshServer(tmp_path / "sshd").start()
    workdir, out = tmp_path / "board", tmp_path / "run"
    ssh_device_config(tmp_path / "loopback.toml", sshd, workdir,
                      "connect_timeout_s = 5\nreconnect_timeout_s = 3\n"
                      "[hardware]\nsensor = \"none\"\n")
    monkeypatch.setenv("EDGE_REMAT_DEVICE_CONFIGS", str(tmp_path))
    try:
        proc = _start("run", "--device", "loopback", "--model", "mlp", "--plain",
                      "--steps", "1000000", "--out", out)
        seen = wait_for_line(proc, "/1000000:")  # a step done (progress may skip some)
        sshd.stop()
        stdout, err = proc.communicate(timeout=120)
        line = refused(subprocess.CompletedProcess(proc.args, proc.returncode, stdout,
                                                   "".join(seen) + err),
                       UNREACHABLE, "gave up reconnecting", "job-status", "job-cancel")
        job_id = re.search(r"job (\S+) may still run on loopback", line).group(1)
        report = json.loads((out / "report.json").read_text())
        assert report["status"] == "link_lost" and report["job"] == job_id, report
        sshd.start()
        cancel = cli("job-cancel", job_id, "--device", "loopback", environ=env())
        assert cancel.returncode == 0 and job_id in cancel.stdout, cancel.stderr
        back = re.search(r"`edge-remat (job-status [^`]+)`", line).group(1)
        assert f"--out {out / 'board'}" in back, back
        came_back = cli(*back.split(), environ=env())
        assert came_back.returncode == INTERRUPTED, came_back.stderr
        report = json.loads((out / "report.json").read_text())
        assert report["status"] == "cancelled" and report["job"] == job_id, report
        assert report["link_lost"].startswith("cannot reach"), report
    finally:
        stop_agent(workdir)
        sshd.stop()


def test_the_way_back_to_a_job_on_a_board_emulated_by_memory_limit_reaches_it(tmp_path):
    """`run --device D --memory-limit` emulates a board in a workdir of its own; the come-back
    lines named `--device D` alone, whose agent is another, so job-status did not find the
    job. They now carry --memory-limit, which job-status and job-cancel take."""
    import re
    import shlex

    from edge_remat.cgroup import unavailable_reason
    from edge_remat.devices import find_device
    from edge_remat.transport.emulated import emulated_device, remove_board_cgroup
    from helpers.board_fixtures import local_board
    if unavailable_reason() is not None:
        pytest.skip(f"no memory cgroup: {unavailable_reason()}")
    with local_board(tmp_path, "plain-local"):
        device = emulated_device(find_device("plain-local"), 2**30)
        try:
            proc = _start("run", "--device", "plain-local", "--memory-limit", "1GiB",
                          "--model", "mlp", "--plain", "--steps", "1000000", "--keep-running",
                          "--out", tmp_path / "run")
            seen = wait_for_line(proc, "/1000000:")
            line = refused(_interrupt(proc, seen), INTERRUPTED, "keeps running")
            status, cancel = re.findall(r"`edge-remat ([^`]+)`", line)
            assert "--memory-limit 1073741824" in status, line
            done = cli(*shlex.split(status.replace(" --wait", "")) + ["--json"],
                       environ=env())
            assert json.loads(done.stdout.splitlines()[-1])["status"] == "running", done
            assert cli(*shlex.split(cancel), environ=env()).returncode == 0
            # the job over, the board's agent is stopped and its cgroup removed, as at a
            # run's end (QA: after job-status --wait both stayed up an hour, the idle exit)
            from edge_remat.cgroup import MemoryCgroup
            from edge_remat.transport.emulated import cgroup_name
            from edge_remat_agent.daemon.launcher import connect_daemon
            from edge_remat_agent.daemon.layout import Layout
            assert connect_daemon(Layout(device.connection.workdir)) is None
            assert MemoryCgroup.existing(cgroup_name(device)) is None
        finally:
            stop_agent(device.connection.workdir)
            remove_board_cgroup(device)


def test_ctrl_c_during_devices_check_of_a_silent_port_ends_at_once(tmp_path):
    """The checks ran in a thread pool, whose threads the process joins before it exits: a
    Ctrl-C waited out the board's connect_timeout_s (10.6 s for a 10 s timeout)."""
    import socket
    silent = socket.create_server(("127.0.0.1", 0))  # listens, never answers
    config = tmp_path / "silent.toml"
    config.write_text(f'name = "silent"\n[connection]\nkind = "ssh"\nhost = "127.0.0.1"\n'
                      f"port = {silent.getsockname()[1]}\nconnect_timeout_s = 30\n")
    try:
        proc = _start("devices", str(config), "--check")
        time.sleep(2.0)  # connecting by now
        started = time.monotonic()
        refused(_interrupt(proc, []), INTERRUPTED, "interrupted")
        assert time.monotonic() - started < 5
    finally:
        silent.close()


def test_ctrl_c_in_an_extensions_initialisation_while_run_plans_writes_the_report(tmp_path,
                                                                                   bench):
    """QA: SIGINT 1 s after `run` said "planning:" met OR-Tools' pybind11 initialisation:
    `error: internal error (ImportError: initialization failed)`, exit 70, no report.json."""
    import os

    from test_anytime_interrupt import _ortools_whose_init_meets_ctrl_c
    stub = _ortools_whose_init_meets_ctrl_c(tmp_path / "stub")
    environ = env()
    environ["PYTHONPATH"] = os.pathsep.join([str(stub), environ["PYTHONPATH"]])
    out = tmp_path / "run"
    # A budget that needs recomputation: where the plain schedule fits, no solver starts, nor
    # where a paging plan hides its paging behind compute (this profile has tiers): no paging.
    proc = cli("run", "--device", "bench", "--model", "digits-cnn", "--budget", "0.5",
               "--paging", "none", "--steps", "1", "--profile", REPO / "profiles" / "this-machine.json", "--out", out,
               environ=environ)
    refused(proc, INTERRUPTED, "interrupted (Ctrl-C)", "report.json")
    assert json.loads((out / "report.json").read_text())["status"] == "interrupted"


def test_ctrl_c_while_a_job_reports_no_progress_cancels_within_seconds(tmp_path, bench):
    """QA: Ctrl-C 1 s into `deploy`'s capture on the board (no progress for ~15 s) ended
    9.6 s later, the board's job ~9 s after its cancel was due: the cancel waited behind the
    host's 10 s long poll on the same connection, then the job sat out its SIGTERM grace."""
    proc = _start("job", "sleep", "--device", "bench", "--id", "nap-2", "--param", "seconds=60",
                  "--param", "steps=1")
    seen = wait_for_line(proc, "running")
    time.sleep(1.0)  # the host is in its long poll now
    started = time.monotonic()
    done = _interrupt(proc, seen)
    refused(done, INTERRUPTED, "cancelled job nap-2")
    assert time.monotonic() - started < 5.0
    state = _state("nap-2")
    assert state["status"] == "cancelled", state
    assert state["job"]["error"] == "cancelled by the host", state  # not killed after a grace


@pytest.mark.parametrize("apart_s", [0.001, 0.003, 0.01])
def test_two_sigints_at_once_cancel_the_board_job_as_one_does(tmp_path, bench, apart_s):
    """`pkill -INT -f "edge-remat ..."` signals both `timeout` and the command under it, and
    `timeout` passes its own on: two SIGINTs milliseconds apart. The second is the first's
    echo, not a second Ctrl-C, even when it lands before the cancelling has begun."""
    proc = _start("job", "sleep", "--device", "bench", "--id", "nap-twice", "--param",
                  "seconds=60", "--param", "steps=60")
    seen = wait_for_line(proc, "step 1/60")
    proc.send_signal(signal.SIGINT)
    time.sleep(apart_s)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    refused(subprocess.CompletedProcess(proc.args, proc.returncode, out, "".join(seen) + err),
            INTERRUPTED, "cancelled job nap-twice")
    assert _state("nap-twice")["status"] == "cancelled"
