"""The SSH transport against a real OpenSSH server on loopback: agent push only when changed,
hello/sysinfo through it, host-key policies, the usual failures as clear one-line errors, and a
dropped connection mid-job that reconnects and resumes the same job."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from helpers.board_fixtures import (SshServer, agent_command, keygen, needs_sshd,
                                    python_without_torch, stop_agent)
from edge_remat.devices import load_device
from edge_remat.transport import (AuthRefused, Board, BoardMissingPython, BoardMissingTorch,
                                  BoardOutOfDisk, BoardUnreachable, HostKeyChanged,
                                  HostKeyUnknown, TransportError)
from edge_remat.transport.errors import LinkLost
from edge_remat.transport.zipapp import AgentArchive, archive_bytes

pytestmark = [needs_sshd, pytest.mark.loopback]


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    server = SshServer(tmp_path_factory.mktemp("sshd")).start()
    yield server
    server.stop()


@pytest.fixture
def device(sshd, tmp_path):
    """Write a device config for the loopback sshd; keyword arguments override fields."""
    workdirs = []

    def make(**fields):
        conn = {"kind": "ssh", "host": "127.0.0.1", "port": sshd.port, "user": sshd.user,
                "key": str(sshd.client_key), "python": sys.executable,
                "workdir": str(tmp_path / "board"), "host_key_policy": "accept-new",
                "known_hosts": str(tmp_path / "known_hosts"), "connect_timeout_s": 10,
                "reconnect_timeout_s": 60, "ssh_config": str(tmp_path / "no_ssh_config")}
        family = fields.pop("family", "generic")
        conn.update(fields)
        lines = ['name = "loopback"', "[connection]"]
        lines += [f"{k} = {v!r}".replace("'", '"') if isinstance(v, str) else f"{k} = {v}"
                  for k, v in conn.items() if v is not None]
        lines += ["[hardware]", f'family = "{family}"']
        path = tmp_path / f"loopback{len(workdirs)}.toml"
        path.write_text("\n".join(lines) + "\n")
        workdirs.append(Path(conn["workdir"]))
        return load_device(path)

    yield make
    for workdir in set(workdirs):
        if workdir.exists():
            stop_agent(workdir)


def one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text, text
    return text


def test_agent_is_pushed_only_when_it_changed(device, tmp_path):
    dev = device()
    with Board(dev) as board:
        hello = board.hello()
        assert board.transport.pushed_agent is True
        assert hello["build"] == board.transport.archive.sha256
    with Board(dev) as board:
        board.hello()
        assert board.transport.pushed_agent is False  # same hash on the board: nothing sent

    # A changed agent is pushed, and the idle daemon is replaced by the new build.
    package = tmp_path / "pkg" / "edge_remat_agent"
    shutil.copytree(Path(__import__("edge_remat_agent").__file__).parent, package,
                    ignore=shutil.ignore_patterns("__pycache__"))
    with open(package / "__init__.py", "a") as handle:
        handle.write("\n# a new build\n")
    data = archive_bytes(package)
    archive_path = tmp_path / "new.pyz"
    archive_path.write_bytes(data)
    new = AgentArchive(archive_path, __import__("hashlib").sha256(data).hexdigest())
    with Board(dev, archive=new) as board:
        assert board.hello()["build"] == new.sha256
        assert board.transport.pushed_agent is True


def test_agent_reaches_a_board_without_sftp(device, monkeypatch):
    import paramiko

    def no_sftp(self):
        raise paramiko.SSHException("subsystem request failed")  # what a bare Dropbear says

    monkeypatch.setattr(paramiko.SSHClient, "open_sftp", no_sftp)
    with Board(device()) as board:
        assert board.hello()["build"] == board.transport.archive.sha256
        assert board.transport.pushed_agent is True


def test_hello_and_sysinfo_over_ssh(device):
    with Board(device()) as board:
        assert board.hello()["protocol"] == 1
        info = board.sysinfo()
        assert info["python"] == ".".join(map(str, sys.version_info[:3]))
        assert info["ram_free_bytes"] > 0 and info["disk_free_bytes"] > 0
        assert "torch" in info


def test_requests_are_not_held_back_by_nagle(device):
    """Request/reply over TCP: without TCP_NODELAY a small request waits for the board's
    delayed ACK (40 ms a request; see benchmarks/transport.py)."""
    import socket
    with Board(device()) as board:
        board.hello()
        sock = board.transport._clients[-1].get_transport().sock
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


def test_unknown_host_key_with_strict_policy_says_how_to_trust_it(device, sshd):
    dev = device(host_key_policy="strict")
    with pytest.raises(HostKeyUnknown) as err:
        Board(dev).hello()
    message = one_line(err.value)
    assert f"ssh-keyscan -p {sshd.port} 127.0.0.1 >>" in message
    assert 'host_key_policy = "accept-new"' in message and "SHA256:" in message


@pytest.mark.skipif(shutil.which("ssh-keyscan") is None, reason="needs ssh-keyscan")
def test_the_unknown_host_key_remedy_works_on_an_account_with_no_ssh_folder(device, tmp_path):
    """QA: the remedy `ssh-keyscan -p PORT HOST >> ~/.ssh/known_hosts` failed 'No such file or
    directory' where ~/.ssh did not exist (a fresh account). The line it gives is run as a
    user would paste it, and the board is then trusted under the strict policy."""
    known_hosts = tmp_path / "fresh-home" / ".ssh" / "known_hosts"
    dev = device(host_key_policy="strict", known_hosts=str(known_hosts))
    with pytest.raises(HostKeyUnknown) as err:
        Board(dev).hello()
    remedy = one_line(err.value).split("`")[1]
    assert remedy.endswith(f">> {known_hosts}"), remedy  # the path as it printed before
    pasted = subprocess.run(["bash", "-c", remedy], capture_output=True, text=True, timeout=60)
    assert pasted.returncode == 0 and known_hosts.is_file(), (remedy, pasted.stderr)
    with Board(dev) as board:
        assert board.hello()["protocol"] == 1


def test_accept_new_records_the_key_and_strict_then_trusts_it(device, sshd, tmp_path):
    with Board(device(host_key_policy="accept-new")) as board:
        board.hello()
    recorded = (tmp_path / "known_hosts").read_text()
    assert recorded == sshd.host_key_line()
    with Board(device(host_key_policy="strict")) as board:
        assert board.hello()["protocol"] == 1


def test_changed_host_key_is_refused_even_with_accept_new(device, sshd, tmp_path):
    other = keygen(tmp_path / "other_host_key")
    kind, blob = Path(str(other) + ".pub").read_text().split()[:2]
    (tmp_path / "known_hosts").write_text(f"[127.0.0.1]:{sshd.port} {kind} {blob}\n")
    with pytest.raises(HostKeyChanged) as err:
        Board(device(host_key_policy="accept-new")).hello()
    message = one_line(err.value)
    assert "CHANGED" in message and "ssh-keygen -R" in message


def test_refused_authentication_is_a_clear_error(device, tmp_path):
    stranger = keygen(tmp_path / "stranger_key")
    with pytest.raises(AuthRefused) as err:
        Board(device(key=str(stranger))).hello()
    message = one_line(err.value)
    assert "refused authentication" in message and "ssh-copy-id" in message


def test_missing_key_file_is_a_clear_error(device, tmp_path):
    with pytest.raises(AuthRefused, match="does not exist"):
        Board(device(key=str(tmp_path / "nope"))).hello()


@pytest.mark.parametrize("case", ["garbage", "public key"])
def test_a_key_file_that_is_no_private_key_is_named_not_the_board(device, sshd, tmp_path,
                                                                  monkeypatch, case):
    """QA: "cannot reach ...: not a valid OPENSSH private key file (is the board on, ...)"
    while the board was fine and the local key file was the problem."""
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)  # no agent key to fall back on
    key = tmp_path / "garbage"
    key.write_text("not a key\n")
    if case == "public key":
        key = Path(f"{sshd.client_key}.pub")
    with pytest.raises(AuthRefused) as err:
        Board(device(key=str(key))).hello()
    message = one_line(err.value)
    assert f"SSH key {key}" in message and "is the board on" not in message
    assert ("public key" if case == "public key" else "not a private key") in message


def test_no_python_on_the_board_says_what_to_install(device):
    with pytest.raises(BoardMissingPython) as err:
        Board(device(python="/opt/no-such/python3", family="rpi")).hello()
    assert "sudo apt install python3" in one_line(err.value)


def test_a_workdir_the_board_cannot_make_names_the_field_to_change(device, tmp_path):
    """A workdir under a file stands in for an unwritable one (root writes anywhere else).
    QA: "failed (exit status 1): mkdir: cannot create directory ...", no remedy."""
    (tmp_path / "a-file").write_text("not a folder")
    with pytest.raises(TransportError) as err:
        Board(device(workdir=str(tmp_path / "a-file" / "work"))).hello()
    message = one_line(err.value)
    assert "cannot use its workdir" in message and "mkdir" in message
    assert "set workdir in the device config's [connection]" in message


def test_an_agent_that_cannot_be_written_into_the_workdir_says_where_and_what_to_change(
        device, tmp_path):
    """The workdir is made, but its agents/ folder is a file: the copy fails as on a read-only
    workdir (which root cannot stand for here). QA: that said only "[Errno 2] No such file"
    or "Failure"."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "agents").write_text("not a folder")
    with pytest.raises(TransportError) as err:
        Board(device(workdir=str(workdir))).hello()
    message = one_line(err.value)
    assert "copying" in message and f"the agent is written into {workdir}/agents" in message
    assert "set workdir in the device config's [connection]" in message


def test_a_python_that_is_no_python_names_the_field_to_change(device):
    """QA: python = "/bin/true" said "failed (exit status 0): no output"."""
    with pytest.raises(TransportError) as err:
        Board(device(python="/bin/true")).hello()
    message = one_line(err.value)
    assert "`/bin/true` exited with status 0 and did not answer the probe" in message
    assert "set python in the device config's [connection]" in message


def test_a_link_dropped_during_the_probe_is_a_lost_link_not_a_bad_python(device, tmp_path):
    """QA: a connection dropped in the probe's first second said `python` "exited with status
    -1 and did not answer the probe: set python ...". A `python` that kills its sshd session
    stands for the drop: the probe's channel closes without an exit status; reconnecting is
    tried, then given up in one line that says what happened."""
    drops = tmp_path / "python-that-drops"
    drops.write_text("#!/bin/sh\nkill -9 $PPID\nsleep 5\n")
    drops.chmod(0o755)
    with pytest.raises(LinkLost) as err:
        Board(device(python=str(drops), reconnect_timeout_s=2)).hello()
    message = one_line(err.value)
    assert message.startswith("the connection closed while the probe of loopback (")
    assert message.endswith("ran (gave up reconnecting after 2 s)") and "python" not in message


def test_no_torch_on_the_board_says_what_to_install(device):
    python = python_without_torch()
    if python is None:
        pytest.skip("every Python here has torch; cannot show a board without it")
    with Board(device(python=python, family="android")) as board:
        assert board.hello()["torch"] is None
        with pytest.raises(BoardMissingTorch) as err:
            board.submit("torch-check", {})
        assert "pkg install python-torch" in one_line(err.value)
        with pytest.raises(BoardMissingTorch, match="pkg install python-torch"):
            board.require_torch()
        assert board.run_job("sleep", {"seconds": 0.1, "steps": 1})["state"] == "finished"


def test_board_out_of_disk_is_a_clear_error(device, tmp_path):
    small = tmp_path / "small"
    small.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(small)],
                             capture_output=True)
    if mounted.returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root): "
                    + mounted.stderr.decode().strip())
    try:
        with pytest.raises(BoardOutOfDisk) as err:
            Board(device(workdir=str(small / "w"))).hello()
        message = one_line(err.value)
        assert "out of disk" in message and "larger partition" in message
    finally:
        subprocess.run(["umount", "-l", str(small)], capture_output=True)


def test_unreachable_board_fails_fast(device):
    from helpers.board_fixtures import free_port
    started = time.monotonic()
    with pytest.raises(BoardUnreachable, match="cannot reach .*Connection refused"):
        Board(device(port=free_port())).hello()
    assert time.monotonic() - started < 5


def test_ssh_config_alias_and_proxy_jump_are_honoured(device, sshd, tmp_path):
    config = tmp_path / "ssh_config"
    config.write_text(f"""\
Host board-alias
    HostName 127.0.0.1
    Port {sshd.port}
    User {sshd.user}
    IdentityFile {sshd.client_key}

Host jumped-board
    HostName 127.0.0.1
    Port {sshd.port}
    User {sshd.user}
    IdentityFile {sshd.client_key}
    ProxyJump {sshd.user}@127.0.0.1:{sshd.port}
""")
    with Board(device(host="board-alias", port=None, user=None, key=None,
                      ssh_config=str(config))) as board:
        assert board.hello()["protocol"] == 1
    with Board(device(host="jumped-board", port=None, user=None, key=None,
                      ssh_config=str(config))) as board:
        assert board.hello()["protocol"] == 1
        assert len(board.transport._clients) == 2  # through the jump host


def test_a_proxy_jump_given_as_an_ssh_uri_goes_through_the_jump_host(device, sshd, tmp_path):
    """`ProxyJump ssh://user@host:port` (OpenSSH's URI form) reaches the board through the
    jump host as that user; before, the user was read as "ssh://USER" and refused."""
    config = tmp_path / "ssh_config"
    config.write_text(f"""\
Host uri-jumped-board
    HostName 127.0.0.1
    Port {sshd.port}
    User {sshd.user}
    IdentityFile {sshd.client_key}
    ProxyJump ssh://{sshd.user}@127.0.0.1:{sshd.port}
""")
    with Board(device(host="uri-jumped-board", port=None, user=None, key=None,
                      ssh_config=str(config), reconnect_timeout_s=0)) as board:
        assert board.hello()["protocol"] == 1
        jump, target = board.transport._clients
        assert jump.get_transport().get_username() == sshd.user  # not "ssh://" + user
        assert target.get_transport().get_username() == sshd.user


def test_dropped_connection_mid_job_reconnects_and_resumes_the_same_job(device, sshd):
    events, updates = [], []
    progressed = threading.Event()

    def on_update(record):
        updates.append(record)
        if ((record.get("progress") or {}).get("data") or {}).get("step", 0) >= 3:
            progressed.set()

    with Board(device(), on_event=events.append) as board:
        outcome = {}
        runner = threading.Thread(target=lambda: outcome.update(board.run_job(
            "sleep", {"seconds": 2.0, "steps": 20}, on_update=on_update)))
        runner.start()
        assert progressed.wait(20), "the job never made progress"
        assert sshd.drop_connections() >= 1  # the network drops under the host
        runner.join(60)
        assert outcome.get("state") == "finished", (outcome, events)
        assert outcome["result"]["starts"] == 1  # resumed, not started over
        assert outcome["result"]["resumed_from"] == 0
        assert board.reconnects >= 1 and any("reconnecting" in e for e in events)
        assert {u["id"] for u in updates} == {outcome["id"]}


def test_agent_port_reaches_a_tcp_daemon_through_a_forward(device, tmp_path):
    workdir = tmp_path / "tcp-board"
    daemon = subprocess.Popen(agent_command() + ["serve", "--tcp", "127.0.0.1:0", "--workdir",
                                                 str(workdir)], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)
    try:
        port = int(daemon.stdout.readline().strip().rsplit(":", 1)[1])
        with Board(device(agent_port=port)) as board:
            assert board.hello()["workdir"] == str(workdir)
            assert board.run_job("echo", {"via": "forward"})["result"]["params"] == \
                {"via": "forward"}
    finally:
        daemon.terminate()
        daemon.wait(15)
