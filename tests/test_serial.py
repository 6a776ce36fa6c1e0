"""The serial transport over a real pseudo-terminal pair from socat: hello and the agent itself
pushed over the link, files in chunks, corrupted frames retried, a pulled cable (socat killed
and restarted) mid-job that reconnects and resumes the same job, and a port opened without
asserting DTR/RTS."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from helpers.board_fixtures import PtyPair, agent_command, needs_socat, stop_agent
from edge_remat.devices import load_device
from edge_remat.transport import Board, BoardUnreachable
from edge_remat.transport.serial import PySerialPort, open_serial_port
from edge_remat.transport.zipapp import build_agent_archive
from edge_remat_agent.wire.serial_link import SerialLink, decode_packet, DATA
from edge_remat_agent.wire.tty import TtyPort

pytestmark = [needs_socat, pytest.mark.loopback]


@pytest.fixture
def ptys(tmp_path):
    pair = PtyPair(tmp_path).start()
    yield pair
    pair.kill()


@pytest.fixture
def board_agent(ptys, tmp_path):
    """`edge-remat-agent serve --serial` on the board's end of the line."""
    workdir = tmp_path / "board"
    proc = subprocess.Popen(agent_command() + ["serve", "--serial", ptys.board_end,
                                               "--workdir", str(workdir)],
                            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "agent.log", "wb"))
    yield workdir
    proc.terminate()
    proc.wait(10)
    stop_agent(workdir)


def serial_device(tmp_path, ptys, **fields):
    conn = {"kind": "serial", "port": ptys.host_end, "baud": 921600, "connect_timeout_s": 5,
            "reconnect_timeout_s": 30}
    conn.update(fields)
    text = 'name = "serial-loop"\n[connection]\n' + "".join(
        f"{k} = {v!r}\n".replace("'", '"') for k, v in conn.items())
    path = tmp_path / "serial.toml"
    path.write_text(text)
    return load_device(path)


def test_hello_then_the_agent_itself_is_pushed_over_the_link(board_agent, ptys, tmp_path):
    archive = build_agent_archive()
    with Board(serial_device(tmp_path, ptys)) as board:
        hello = board.hello()
        assert board.transport.pushed_agent is True  # the board ran from source: pushed
        assert hello["build"] == archive.sha256  # and it now runs the pushed archive
        assert (board_agent / "agents" / archive.name).read_bytes() == archive.path.read_bytes()
        assert board.sysinfo()["ram_free_bytes"] > 0
    with Board(serial_device(tmp_path, ptys)) as board:
        board.hello()
        assert board.transport.pushed_agent is False  # same build: nothing sent


def test_a_damaged_agent_archive_is_pushed_again_over_the_link(board_agent, ptys, tmp_path):
    """QA: an archive truncated on the board's disk started a daemon that died at once
    (SyntaxError: null bytes) on every try, and the serial board was unreachable for good."""
    archive = build_agent_archive()
    with Board(serial_device(tmp_path, ptys)) as board:
        board.hello()
    pushed = board_agent / "agents" / archive.name
    os.truncate(pushed, 20000)
    stop_agent(board_agent)  # the next session starts a daemon from agent.current
    with Board(serial_device(tmp_path, ptys)) as board:
        hello = board.hello()
        assert board.transport.pushed_agent is True  # sent again over the link
        assert hello["build"] == archive.sha256
    assert pushed.read_bytes() == archive.path.read_bytes()
    log = (tmp_path / "agent.log").read_text()
    assert f"agent archive {pushed} is damaged" in log


def test_files_travel_in_chunks_and_arrive_intact(board_agent, ptys, tmp_path):
    data = os.urandom(300_000)
    local = tmp_path / "plan.bin"
    local.write_bytes(data)
    with Board(serial_device(tmp_path, ptys)) as board:
        board.hello()
        sent_before = board.transport.link.stats.packets_sent
        record = board.run_job("echo", {}, inputs={"file": local}, out_dir=tmp_path / "out")
        assert record["result"]["file_sha256"] == hashlib.sha256(data).hexdigest()
        assert board.transport.link.stats.packets_sent - sent_before > 300_000 // 1024
        assert (tmp_path / "out" / "echo.json").exists()


def test_pulled_cable_mid_job_reconnects_and_resumes_the_same_job(board_agent, ptys, tmp_path):
    progressed = threading.Event()
    events = []

    def on_update(record):
        if ((record.get("progress") or {}).get("data") or {}).get("step", 0) >= 3:
            progressed.set()

    with Board(serial_device(tmp_path, ptys), on_event=events.append) as board:
        board.hello()
        outcome = {}
        runner = threading.Thread(target=lambda: outcome.update(board.run_job(
            "sleep", {"seconds": 2.0, "steps": 20}, on_update=on_update)))
        runner.start()
        assert progressed.wait(20), "the job never made progress"
        ptys.restart()  # socat dies: both ends of the line vanish, then come back
        runner.join(60)
        assert outcome.get("state") == "finished", events
        assert outcome["result"]["starts"] == 1 and outcome["result"]["resumed_from"] == 0
        assert board.reconnects >= 1


def test_a_front_end_killed_and_started_again_is_noticed_in_seconds(ptys, tmp_path):
    """The board's `serve --serial` killed mid-job and started again 2 s later, the line (socat)
    up throughout: the host's wait, which nothing would answer, ends within seconds (a PING
    answered by FIN "no such session" from the new front end, or silence after PONGs), and
    it reconnects to the same job. QA: 40 s, `did not answer a 'wait' request within 40 s`."""
    workdir = tmp_path / "board"
    log = open(tmp_path / "agent.log", "ab")

    def front_end():
        return subprocess.Popen(agent_command() + ["serve", "--serial", ptys.board_end,
                                                   "--workdir", str(workdir)],
                                stdout=subprocess.DEVNULL, stderr=log)

    running = threading.Event()
    events: list = []

    def on_update(record):
        if record.get("state") == "running":
            running.set()

    proc = front_end()
    try:
        with Board(serial_device(tmp_path, ptys), on_event=events.append) as board:
            board.hello()
            outcome: dict = {}
            # one step: no progress to answer the host's 'wait' early, so the host sits
            # waiting for its answer (up to 10 s + 30 s) when the front end is killed
            runner = threading.Thread(target=lambda: outcome.update(board.run_job(
                "sleep", {"seconds": 15.0, "steps": 1}, on_update=on_update)), daemon=True)
            runner.start()
            assert running.wait(30), "the job never started"
            time.sleep(1.0)  # the host's 'wait' request is on the board, its answer due
            proc.kill()
            proc.wait()
            killed = time.monotonic()
            time.sleep(2.0)
            proc = front_end()  # started again within 5 s
            while board.reconnects == 0 and time.monotonic() - killed < 30:
                time.sleep(0.05)
            noticed = time.monotonic() - killed
            assert board.reconnects >= 1, f"not noticed in {noticed:.0f} s: {events}"
            assert noticed < 8, events
            runner.join(60)
            assert outcome.get("state") == "finished", events
            assert outcome["result"]["starts"] == 1 and outcome["result"]["resumed_from"] == 0
            assert not any("did not answer" in event for event in events), events
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()
        stop_agent(workdir)


class CorruptingPort(PySerialPort):
    """The host's real pty end, flipping a byte in every 4th DATA packet it sends."""

    def __init__(self, serial_port):
        super().__init__(serial_port)
        self.count = 0

    def write(self, data: bytes) -> None:
        if decode_packet(data[:-1])[0] == DATA:
            self.count += 1
            if self.count % 4 == 0:
                data = data[:5] + bytes([data[5] ^ 0x40]) + data[6:]
        super().write(data)


def test_corrupted_frames_on_a_real_line_are_retried(ptys):
    host = SerialLink(CorruptingPort(open_serial_port(ptys.host_end, 921600)), role="host",
                      ack_timeout=0.1)
    board = SerialLink(TtyPort(ptys.board_end, 921600), role="board", ack_timeout=0.1)
    try:
        session = host.connect(timeout=5)
        board_session = board.accept(timeout=5)
        payload = os.urandom(40_000)
        sender = threading.Thread(target=session.sendall, args=(payload,))
        sender.start()
        board_session.settimeout(10)
        got = bytearray()
        while len(got) < len(payload):
            got += board_session.recv(len(payload) - len(got))
        sender.join(10)  # returns only once the last packet was acknowledged
        assert bytes(got) == payload
        assert board.stats.corrupt >= 5 and host.stats.resent >= 5
    finally:
        host.close()
        board.close()


def test_opening_the_port_does_not_assert_dtr_or_rts(ptys):
    import termios
    port = open_serial_port(ptys.host_end, 921600)
    try:
        assert port.dtr is False and port.rts is False
        assert port.dsrdtr is False and port.rtscts is False
        assert not termios.tcgetattr(port.fd)[2] & termios.HUPCL  # closing keeps DTR as is
    finally:
        port.close()


def test_no_agent_on_the_line_is_a_clear_error_whose_remedy_starts_one(ptys, tmp_path):
    """QA: the remedy said `edge-remat-agent serve --serial DEVICE ...`, a command a serial
    board does not have: docs/boards.md has it copy the archive by hand and run `python3
    agent.pyz serve --serial ...`. The line is run as given on a "board" whose PATH holds
    python3 and the system's tools only, the archive beside it, and the host then connects."""
    started = time.monotonic()
    with pytest.raises(BoardUnreachable) as err:
        Board(serial_device(tmp_path, ptys, connect_timeout_s=1)).hello()
    assert time.monotonic() - started < 5
    remedy = str(err.value).split("`")[1].replace("DEVICE", ptys.board_end)
    assert "python3 agent.pyz serve --serial" in remedy, remedy
    board, tools = tmp_path / "board-user", tmp_path / "board-bin"
    board.mkdir()
    tools.mkdir()
    (tools / "python3").symlink_to(sys.executable)
    shutil.copy(build_agent_archive().path, board / "agent.pyz")
    environ = {"PATH": f"{tools}:/usr/bin:/bin", "HOME": str(board)}
    proc = subprocess.Popen(["bash", "-c", f"exec {remedy}"], cwd=board, env=environ,
                            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "agent.log", "wb"))
    try:
        with Board(serial_device(tmp_path, ptys)) as connected:
            assert connected.hello()["protocol"] == 1
    finally:
        proc.terminate()
        proc.wait(10)
        stop_agent(board / "edge-remat")
    assert (board / "edge-remat" / "agents").is_dir()  # the workdir docs/boards.md names


def test_missing_port_is_a_clear_error(tmp_path, ptys):
    with pytest.raises(BoardUnreachable, match="does not exist: is the board plugged in"):
        Board(serial_device(tmp_path, ptys, port=str(tmp_path / "ttyUSB9"))).hello()


def test_a_port_that_is_no_serial_device_says_so(tmp_path, ptys):
    # QA: "Could not configure port: (25, 'Inappropriate ioctl for device')"
    (tmp_path / "a-file").write_text("")
    for port in (tmp_path / "a-file", Path("/dev/null")):
        with pytest.raises(BoardUnreachable, match="is not a serial device .* port in the "
                           "device config's \\[connection\\]"):
            Board(serial_device(tmp_path, ptys, port=str(port))).hello()


def test_the_serial_setup_docs_boards_md_gives_serves_the_line(ptys, tmp_path):
    """docs/boards.md "A board on a serial line", as a user follows it: the archive the host
    builds, copied to the board and run with `serve --serial`; the host's config names its end
    and the baud; `devices NAME --check` answers (QA: the docs named `serve --serial` and
    nothing else: not how the agent gets to a board with no SSH, nor a serial config)."""
    import shutil
    import sys
    from typer.testing import CliRunner
    from edge_remat.cli import app
    copied = tmp_path / "agent.pyz"  # what the user carries to the board
    shutil.copy(build_agent_archive().path, copied)
    workdir = tmp_path / "board"
    proc = subprocess.Popen([sys.executable, str(copied), "serve", "--serial", ptys.board_end,
                             "--baud", "921600", "--workdir", str(workdir)],
                            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "agent.log", "wb"))
    try:
        serial_device(tmp_path, ptys)  # writes serial.toml: kind, port, baud, timeouts
        result = CliRunner().invoke(app, ["devices", str(tmp_path / "serial.toml"), "--check"])
        assert result.exit_code == 0, result.output
        assert "@ 921600 baud" in result.stdout and "2.13.0" in result.stdout
    finally:
        proc.terminate()
        proc.wait(10)
        stop_agent(workdir)


def test_a_serial_profile_says_why_it_has_no_host_tier(board_agent, ptys, tmp_path):
    """A serial link forwards no port to the host's page service, so its profile has no host
    tier; QA found it missing with nothing said. The profile now says so as it starts."""
    import json

    from helpers.bad_inputs import cli
    serial_device(tmp_path, ptys)
    graph = tmp_path / "graph.json"
    assert cli("graph", "--model", "mlp", "--batch", 4, "-o", graph).returncode == 0
    fast = ["idle_s=0.1", "busy_s=0.1", "sizes=4KiB,8KiB", "no_footprint=true", "share_s=0"]
    proc = cli("profile", "--device", tmp_path / "serial.toml", "--graph", graph,
               *[a for p in fast for a in ("--param", p)], "--out", tmp_path / "profiles",
               timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "serial-loop: the host tier is not measured: a serial link cannot carry host " \
           "pages" in proc.stderr, proc.stderr
    profile = json.loads((tmp_path / "profiles" / "profile.json").read_text())
    assert "host" not in profile["tiers"] and "flash" in profile["tiers"]
