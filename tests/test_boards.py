"""Device configs and the board commands (`devices`, `job`, `job-status`, `agent-stop`) against
the local transport: the agent as a child process of this machine. `profile` and `deploy` are
tested end to end through a real sshd in test_ssh_deploy.py."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from helpers.board_fixtures import local_bench_device, python_without_torch, stop_agent
from edge_remat.cli import app
from edge_remat.devices import DeviceError, find_device, load_device
from edge_remat_agent.formats import FormatError

REPO = Path(__file__).resolve().parents[1]
SHIPPED = ["local", "jetson-nano", "jetson-orin-nano", "rpi4", "rpi5", "android-termux"]


@pytest.fixture
def configs(tmp_path, monkeypatch):
    folder, workdir = local_bench_device(tmp_path, monkeypatch)
    yield folder
    stop_agent(workdir)


def cli(*args):
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


# -- configs ---------------------------------------------------------------------------------

def test_shipped_configs_load_and_cite_their_sources():
    folder = REPO / "device_configs"
    assert set(SHIPPED) <= {p.stem for p in folder.glob("*.toml")}
    for name in SHIPPED:
        path = folder / f"{name}.toml"
        device = load_device(path)
        assert device.name == name
        text = path.read_text()
        if device.hardware.ram_bytes is not None:
            assert re.search(r"#.*Source:", text), f"{path}: ram_bytes without a cited source"
        else:
            assert "left out on purpose" in text


def test_found_by_name_by_prefix_and_by_path(configs):
    assert find_device("bench").connection.kind == "local"
    assert find_device("jetson-orin").name == "jetson-orin-nano"
    assert find_device(str(configs / "bench.toml")).name == "bench"
    with pytest.raises(DeviceError, match="ambiguous: it could be jetson-nano, jetson-orin-nano"):
        find_device("jetson")
    with pytest.raises(DeviceError, match="no device config named 'nope'.*known: .*rpi4"):
        find_device("nope")
    # a prefix of every name: it said "ambiguous: it could be android-termux, ..." (a fleet
    # manifest's `device = ""`)
    with pytest.raises(DeviceError, match="no device named \\(an empty name\\)"):
        find_device(" ")


def test_commands_a_message_names_take_the_device_as_it_can_be_found_again(configs, tmp_path):
    # QA: a run given `--device ser/serial.toml` said to come back with `--device my-serial`,
    # its `name`, which no search finds: the path is said instead
    from edge_remat.devices import device_argument
    from edge_remat.transport import Board
    elsewhere = tmp_path / "elsewhere" / "serial board.toml"
    elsewhere.parent.mkdir()
    elsewhere.write_text((configs / "bench.toml").read_text().replace(
        'name = "bench"', 'name = "my-serial"'))
    device = load_device(elsewhere)
    assert device.name == "my-serial" and device_argument(device) == f"'{elsewhere}'"
    assert device_argument(find_device("bench")) == "bench"
    assert device_argument(find_device(str(configs / "bench.toml"))) == "bench"
    back = Board(device).come_back("job-1")
    assert f"job-status job-1 --device '{elsewhere}' --wait" in back
    assert f"job-cancel job-1 --device '{elsewhere}'" in back


def test_a_broken_config_leaves_the_others_found(configs):
    """One config that is not TOML made every lookup by name or prefix fail with its error
    (only a file name typed in full still worked)."""
    (configs / "broken.toml").write_text('name = "broken\n')
    assert find_device("jetson-orin").name == "jetson-orin-nano"  # a prefix
    assert find_device("bench").name == "bench"
    with pytest.raises(DeviceError, match="known: .*rpi4.* \\(not readable: broken\\)"):
        find_device("nope")
    with pytest.raises(FormatError, match="broken.toml"):  # the one it may mean: its error
        find_device("bro")


@pytest.mark.parametrize("body, field", [
    ('[connection]\nkind = "telnet"\n', "connection.kind"),
    ('[connection]\nkind = "ssh"\n', "connection.host"),
    ('[connection]\nkind = "ssh"\nhost = "b"\nport = 99999\n', "connection.port"),
    ('[connection]\nkind = "ssh"\nhost = "b"\nhost_key_policy = "yolo"\n',
     "connection.host_key_policy"),
    ('[connection]\nkind = "serial"\n', "connection.port"),
    ('[connection]\nkind = "local"\n[hardware]\nsensor = "thermometer"\n', "hardware.sensor"),
    ('[connection]\nkind = "local"\n[hardware]\ntorch_device = "gpu"\n', "hardware.torch_device"),
    ('[connection]\nkind = "local"\nhots = "typo"\n', "connection.hots"),
    # its line and column: in the message's tail they were cut off (QA)
    ('[connection\nkind = "local"\n', "<toml line 1 col 12>"),
    # 0 s: every SSH connect failed at once as "Operation now in progress", blaming the board
    ('[connection]\nkind = "ssh"\nhost = "b"\nconnect_timeout_s = 0\n',
     "connection.connect_timeout_s"),
])
def test_bad_configs_name_the_file_and_the_field(tmp_path, body, field):
    path = tmp_path / "bad.toml"
    path.write_text(body)
    with pytest.raises(FormatError) as err:
        load_device(path)
    assert str(path) in str(err.value) and f"'{field}'" in str(err.value)


def test_a_config_in_latin_1_is_said_to_be_no_utf8(tmp_path):
    """QA: a comment with an accented letter in Latin-1 was an internal error (exit 70)."""
    path = tmp_path / "latin.toml"
    path.write_bytes('# carte \xe9mul\xe9e\n[connection]\nkind = "local"\n'.encode("latin-1"))
    with pytest.raises(FormatError) as err:
        load_device(path)
    assert str(err.value) == f"{path}: field '<toml>': expected UTF-8 text (TOML files are " \
        "UTF-8), got 'byte 0xe9 at offset 8'"


def test_a_config_section_given_as_a_value_is_called_a_table(tmp_path):
    """`connection = "local"` was told "expected a JSON object, got 'str'" in a TOML file."""
    path = tmp_path / "c.toml"
    path.write_text('connection = "local"\n')
    with pytest.raises(FormatError) as err:
        load_device(path)
    assert "field 'connection': expected a table ([name] or name = {...}), got 'local'" \
        in str(err.value)


def test_serial_config_reads_port_and_baud(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('[connection]\nkind = "serial"\nport = "/dev/ttyUSB0"\nbaud = 115200\n')
    device = load_device(path)
    assert device.connection.device == "/dev/ttyUSB0" and device.connection.baud == 115200
    assert device.address() == "/dev/ttyUSB0 @ 115200 baud"


# -- commands --------------------------------------------------------------------------------

def test_devices_lists_every_config(configs):
    code, out, _ = cli("devices")
    assert code == 0
    for name in ["bench"] + SHIPPED:
        assert re.search(rf"^{re.escape(name)}\s", out, re.M), out


def test_configs_sharing_a_name_are_said_with_the_one_a_run_takes(configs):
    """Two rows named rpi4 in the listing, and nothing said of which `--device rpi4` reaches
    (the file named rpi4.toml, before another config's `name`)."""
    (configs / "shadow.toml").write_text('name = "rpi4"\n[connection]\nkind = "local"\n')
    code, out, err = cli("devices")
    assert code == 0
    assert "warning: 2 device configs are named 'rpi4' (" in err and "shadow.toml" in err
    assert err.rstrip().endswith(f"--device rpi4 takes {REPO / 'device_configs' / 'rpi4.toml'},"
                                 " whose file name it is")
    assert find_device("rpi4").connection.kind == "ssh"
    assert "warning" not in cli("devices", "bench")[2]


def test_devices_shows_an_emulated_boards_limit_without_asking_it(configs):
    """`devices` said "(ask board)" for an emulated board though its config gives the limit;
    only --check showed it."""
    local_config(configs, "limited", hardware="memory_limit_bytes = 629145600\n")
    code, out, _ = cli("devices", "limited")
    assert code == 0, out
    assert re.search(r"^limited\s.*600\.00 MiB \(limit\)", out, re.M), out


def test_devices_check_reports_versions_ram_and_disk(configs):
    code, out, _ = cli("devices", "bench", "--check", "--json")
    assert code == 0, out
    (row,) = json.loads(out)["devices"]
    check = row["check"]
    assert check["ok"] and check["python"] and check["ram_free_bytes"] > 0
    assert check["disk_free_bytes"] > 0 and "sleep" in check["job_kinds"]


def local_config(configs: Path, name: str, connection: str = "", hardware: str = "") -> None:
    workdir = configs.parent / f"board-{name}"
    (configs / f"{name}.toml").write_text(
        f'name = "{name}"\n[connection]\nkind = "local"\nworkdir = "{workdir}"\n{connection}'
        f'[hardware]\nsensor = "none"\n{hardware}')


def checked(tmp_path, name: str):
    """`devices NAME --check` on a local_config board; its agent stopped after."""
    try:
        return cli("devices", name, "--check")
    finally:
        stop_agent(tmp_path / f"board-{name}")


def test_devices_check_fails_a_board_without_torch_with_the_install_hint(configs, tmp_path):
    """A local board run by a Python without torch stands in for a board without it. QA: TORCH
    MISSING, and exit 0, while deploy exits 3 on the same board."""
    python = python_without_torch()
    if python is None:
        pytest.skip("no Python without torch on this machine (install python3 from the OS)")
    local_config(configs, "bare", connection=f'python = "{python}"\n')
    code, out, err = checked(tmp_path, "bare")
    assert code == 3 and "failed the check: bare" in err, (out, err)
    assert re.search(r"^bare\s.*\sMISSING\s", out, re.M), out
    assert "bare has no torch" in out and "pip install torch" in out


@pytest.mark.parametrize("where", ["a-file", "a-file/pages", "unmounted/pages"])
def test_devices_check_fails_a_page_dir_that_cannot_hold_pages(configs, tmp_path, where):
    """QA: a page_dir that is a file (or lies under one; likewise a read-only one) passed the
    check and failed inside the job, after the capture. One whose parent is missing (a drive
    not mounted) was made with its parents, on the system's own disk."""
    (tmp_path / "a-file").write_text("not a folder")
    local_config(configs, "nopages", hardware=f'page_dir = "{tmp_path / where}"\n')
    code, out, err = checked(tmp_path, "nopages")
    assert code == 3 and "failed the check: nopages" in err, (out, err)
    assert "nopages's page_dir cannot hold pages" in out
    assert "set [hardware] page_dir in" in out and str(configs / "nopages.toml") in out
    assert not (tmp_path / "unmounted").exists()


def test_devices_check_reports_the_page_dirs_free_space(configs, tmp_path):
    local_config(configs, "pages", hardware=f'page_dir = "{tmp_path / "new-pages"}"\n')
    try:
        code, out, _ = cli("devices", "pages", "--check", "--json")
    finally:
        stop_agent(tmp_path / "board-pages")
    assert code == 0, out
    check = json.loads(out)["devices"][0]["check"]
    assert check["page_dir"] == str(tmp_path / "new-pages")  # made, as the run would
    assert check["page_dir_free_bytes"] > 0 and (tmp_path / "new-pages").is_dir()


def test_a_workdir_with_less_room_than_the_agent_fails_the_check():
    """The disk figures stand in for a full board (a fixture, not a full filesystem). QA:
    FREE DISK 0 B passed."""
    from types import SimpleNamespace
    from edge_remat.remote import unusable_because
    board = SimpleNamespace(name="full", device=None, require_torch=lambda: None,
                            transport=SimpleNamespace(archive=SimpleNamespace(size=300_000)))
    info = {"disk_free_bytes": 0, "workdir": "/w", "page_dir": {"ok": True}}
    (problem,) = unusable_because(board, info)
    assert "full has 0 B free in its workdir /w" in problem and "1 MiB kept free" in problem
    assert "set workdir" in problem
    assert unusable_because(board, {**info, "disk_free_bytes": 2 << 20}) == []


def test_devices_check_of_an_unreachable_board_says_why(configs):
    (configs / "gone.toml").write_text('[connection]\nkind = "ssh"\nhost = "127.0.0.1"\n'
                                       'port = 1\nconnect_timeout_s = 2\n')
    code, out, err = cli("devices", "gone", "--check")
    assert code == 3 and "error: 1 of 1 board failed the check: gone" in err  # unreachable
    assert re.search(r"^gone: cannot reach 127\.0\.0\.1:1: Connection refused", out, re.M), out
    # --json: the error contract's status and error (it had neither), stderr pointing at the
    # JSON rather than at the lines "above" that --json does not print
    code, out, err = cli("devices", "gone", "--check", "--json")
    answer = json.loads(out)
    assert code == 3 and answer["status"] == "failed"
    assert answer["error"] == "1 of 1 board failed the check: gone"
    assert "Connection refused" in answer["devices"][0]["check"]["error"]
    assert err.strip() == ("error: 1 of 1 board failed the check: gone (why: each board's "
                           "`check.error` in the JSON)")
    assert json.loads(cli("devices", "bench", "--json")[1])["status"] == "done"


def test_job_runs_and_prints_one_json_object(configs, tmp_path):
    data = tmp_path / "data.txt"
    data.write_text("hello board")
    code, out, err = cli("job", "echo", "--device", "bench", "--param", "n=3", "--param",
                         "name=x", "--input", f"file={data}", "--out", str(tmp_path / "out"),
                         "--json")
    assert code == 0, err
    answer = json.loads(out)
    assert answer["status"] == "finished"
    assert answer["result"]["params"]["n"] == 3 and answer["result"]["file_bytes"] == 11
    assert Path(answer["fetched"][0]).name == "echo.json"


def test_detached_job_and_coming_back_for_it(configs):
    code, out, _ = cli("job", "sleep", "--device", "bench", "--params",
                       '{"seconds": 0.3, "steps": 3}', "--id", "nap-1", "--detach")
    assert code == 0 and out.strip() == "nap-1"
    code, out, _ = cli("job-status", "nap-1", "--device", "bench", "--wait", "--json")
    assert code == 0
    assert json.loads(out)["result"]["steps"] == 3


def test_a_cancelled_job_is_reported_cancelled_with_exit_130(configs):
    """After job-cancel, job-status --wait said "failed" and exited 1 (a job failed)."""
    code, out, _ = cli("job", "sleep", "--device", "bench", "--params",
                       '{"seconds": 30, "steps": 10}', "--id", "nap-2", "--detach")
    assert code == 0, out
    code, out, _ = cli("job-cancel", "nap-2", "--device", "bench")
    assert code == 0 and "cancelled by the host" in out, out
    code, out, err = cli("job-status", "nap-2", "--device", "bench", "--wait")
    assert code == 130, (out, err)
    assert "job nap-2 cancelled" in err and "failed" not in err, err
    assert err.strip().splitlines()[-1].startswith(
        "error: job nap-2 on bench was cancelled by the host: it did not finish"), err
    code, out, _ = cli("job-status", "nap-2", "--device", "bench", "--json")
    assert code == 130 and json.loads(out)["status"] == "cancelled"


def test_a_job_quiet_for_a_while_is_shown_again_saying_how_long(configs, monkeypatch):
    """A job phase that reports nothing for minutes left the terminal silent (profile on the
    emulated arm64 board: 9+ min). Its line comes again every QUIET_S (30 s; 0.5 s here),
    saying how long it has been at it, then the finish once."""
    from edge_remat.transport import board
    monkeypatch.setattr(board, "QUIET_S", 0.5)
    monkeypatch.setattr(board, "WAIT_POLL_S", 0.2)
    code, out, err = cli("job", "sleep", "--device", "bench", "--params",
                         '{"seconds": 2.5, "steps": 1}', "--id", "nap-quiet")
    assert code == 0, err
    lines = err.strip().splitlines()
    still = [line for line in lines if "(still at it: " in line or "(still queued: " in line]
    assert len(still) >= 2, lines
    assert all(line.startswith("job nap-quiet running") and "since the job was sent)" in line
               for line in still), still
    assert lines[-1].startswith("job nap-quiet finished") and "still" not in lines[-1], lines


def test_a_jobs_state_line_comes_once_on_stderr_and_stdout_holds_its_result(configs):
    """QA: `job echo` printed its last line twice, on stderr as progress and again on stdout
    before the result, so stdout without --json was no JSON; job-status --wait the same."""
    code, out, err = cli("job", "echo", "--device", "bench", "--param", "msg=hi",
                         "--id", "echo-once")
    assert code == 0, err
    assert json.loads(out)["params"]["msg"] == "hi", out
    assert [line for line in err.splitlines() if line.startswith("job echo-once finished")] \
        == [err.strip().splitlines()[-1]], err
    code, out, err = cli("job-status", "echo-once", "--device", "bench", "--wait")
    assert code == 0 and json.loads(out)["params"]["msg"] == "hi", (out, err)
    assert err.strip().splitlines()[-1].startswith("job echo-once finished"), err
    code, out, _ = cli("job-status", "echo-once", "--device", "bench")  # no wait: no progress
    assert code == 0 and out.startswith("job echo-once finished"), out


def test_a_job_of_the_emulated_board_is_named_there_by_job_status_and_job_cancel(configs,
                                                                                  tmp_path):
    """QA: `job-status ID --device local` for a job of a `--memory-limit` run said "no job ...
    (it may have been pruned)"; it lies in the emulated board's folder of its own. (A job
    folder made here stands for the one such a run leaves; no limited agent runs, so the
    limit to give is not known.)"""
    (tmp_path / "board-limited" / "jobs" / "run-x1").mkdir(parents=True)
    for command in (["job-status", "run-x1"], ["job-cancel", "run-x1"]):
        code, out, err = cli(*command, "--device", "bench")
        assert code != 0 and "no job 'run-x1'" in err, (out, err)
        assert "job run-x1 ran on the board that `--memory-limit` emulates on bench (a folder " \
               "of its own): give the --memory-limit its run was given to reach it" in err, err
    code, out, err = cli("job-status", "run-x2", "--device", "bench")
    assert code != 0 and "no job 'run-x2'" in err and "--memory-limit" not in err, err


def test_job_status_counts_its_own_wait_not_the_sending():
    """job-status --wait on a job another command sent said "1m30s since the job was sent"
    of its own 1m30s, the job sent minutes before (QA): it names its own wait."""
    from edge_remat.remote import progress_printer
    said: list = []
    show = progress_printer(said.append, since="job-status began waiting")
    record = {"id": "j", "kind": "sleep", "state": "running", "rev": 3}
    show(record)
    show(record)
    assert said[-1].endswith("since job-status began waiting)"), said


def test_a_jobs_end_is_said_once_though_a_second_wait_sees_it_again():
    """QA: a deploy's last line, and a profile's under a plan, came twice: a second wait on
    the same job (after its outputs, or a reconnect) shows the same finished record again."""
    from edge_remat.remote import progress_printer
    said = []
    show = progress_printer(said.append)
    record = {"id": "job-1", "kind": "run", "state": "finished", "rev": 7,
              "progress": {"fraction": 1.0, "message": "step 3/3"}}
    show(record)
    show(dict(record))
    assert len(said) == 1 and said[0].startswith("job job-1 finished"), said


def test_work_quiet_for_a_while_on_the_host_says_it_is_still_at_it(tmp_path):
    """The arm64 board's build stages (pip downloading 2.7 GB of wheels quietly, the rootfs's
    debootstrap between its stage lines) said nothing for minutes: each says, every QUIET_S,
    that it is still at it and how far it got."""
    import subprocess

    from edge_remat.heartbeat import still_saying
    said = []
    folder = tmp_path / "wheels"
    folder.mkdir()
    grow = "for i in 1 2 3 4 5 6; do head -c 1000000 /dev/zero > f$i; sleep 0.2; done"
    with still_saying(said.append, "arm64 board: wheels",
                      lambda: f"{sum(f.stat().st_size for f in folder.iterdir())} bytes so far",
                      every_s=0.3):
        subprocess.run(["sh", "-c", grow], cwd=folder, check=True)
    count = len(said)
    time.sleep(0.5)
    assert len(said) == count, "it stops with the block"
    assert 2 <= count <= 6, said
    assert all(re.fullmatch(r"arm64 board: wheels: still at it, \d+s \(\d+ bytes so far\)", line)
               for line in said), said
    sizes = [int(line.split("(")[1].split()[0]) for line in said]
    assert sizes == sorted(sizes) and sizes[-1] > sizes[0], said


def test_failed_job_exits_1_with_its_error(configs):
    code, out, err = cli("job", "echo", "--device", "bench", "--param", "fail=bad weights",
                         "--json")
    assert code == 1
    assert json.loads(out)["status"] == "failed"
    assert err.strip().endswith("RuntimeError: bad weights")


@pytest.mark.parametrize("args, message", [
    (["job", "dance", "--device", "bench"], "no job kind 'dance'"),
    (["job", "echo", "--device", "nowhere"], "no device config named 'nowhere'"),
    (["job", "echo", "--device", "bench", "--param", "novalue"], "KEY=VALUE"),
    (["job", "echo", "--device", "bench", "--input", "f=/no/such/file"], "an existing file"),
    (["job-status", "nope", "--device", "bench"], "no job 'nope'"),
])
def test_bad_input_is_one_line_and_exit_2(configs, args, message):
    code, _, err = cli(*args)
    assert code == 2, err
    assert message in err and len(err.strip().splitlines()) == 1


def test_agent_stop_stops_the_daemon(configs, tmp_path):
    assert cli("job", "echo", "--device", "bench")[0] == 0
    assert (tmp_path / "board" / "agent.sock").exists()
    code, out, _ = cli("agent-stop", "--device", "bench")
    assert code == 0 and "stopped" in out
    assert not (tmp_path / "board" / "agent.sock").exists()
    # none runs now: said so, and none started to be stopped (QA: "agent on bench stopped",
    # a daemon started and stopped in its log)
    log = (tmp_path / "board" / "daemon.log").read_text()
    code, out, _ = cli("agent-stop", "--device", "bench")
    assert code == 0 and out.strip() == "no agent runs on bench: nothing to stop", out
    assert (tmp_path / "board" / "daemon.log").read_text() == log


def test_agent_stop_if_idle_leaves_a_busy_agent_running_and_exits_0(configs):
    """QA: --if-idle on a busy board exited 3, the status of an unreachable board; and a plain
    agent-stop interrupted someone's job saying only "agent on ... stopped"."""
    code, out, _ = cli("job", "sleep", "--device", "bench", "--param", "seconds=30",
                       "--detach", "--json")
    assert code == 0, out
    job = json.loads(out)["job"]
    code, out, err = cli("agent-stop", "--device", "bench", "--if-idle")
    assert code == 0, err
    assert f"agent on bench left running: it is busy with job {job} (--if-idle)" in out
    code, out, err = cli("agent-stop", "--device", "bench")
    assert code == 0, err
    assert f"agent on bench stopped; it interrupted job {job}, which starts again" in out


def test_a_host_waiting_on_a_job_says_when_the_daemon_started_it_again(configs, tmp_path):
    """The daemon stopped under a job the host waits on starts it again at its next start; the
    host says so rather than showing its progress going back without a word."""
    import threading
    from edge_remat.transport import Board
    said = []
    with Board(find_device("bench"), on_event=said.append) as board:
        job = board.submit("sleep", {"seconds": 4, "steps": 4})["id"]
        stopper = threading.Timer(1.5, lambda: cli("agent-stop", "--device", "bench"))
        stopper.start()
        record = board.wait(job, timeout_s=60)
        stopper.join()
    assert record["state"] == "finished" and record["restarts"] == 1
    # the sleep job keeps a checkpoint a step; its new start's progress says from which
    picked_up = record["result"]["resumed_from"]
    how = f"resumed from step {picked_up}" if picked_up else "started again from the beginning"
    assert any(f"job {job} {how}" in line for line in said), said


def test_a_guard_armed_before_the_first_ctrl_c_ignores_its_echo_however_soon():
    """Board.run_job waits under a guard armed before any Ctrl-C: the first interrupts, its
    echo (milliseconds later, before the cancelling has begun: under load the suite saw
    'error: interrupted (Ctrl-C)' where the job should have been cancelled) is ignored, and
    one after the window is a second Ctrl-C."""
    import os
    import signal

    from edge_remat.transport.board import echoes_ignored
    with echoes_ignored(0.5):
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)  # the echo: nothing
        time.sleep(0.05)
        time.sleep(0.5)
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
