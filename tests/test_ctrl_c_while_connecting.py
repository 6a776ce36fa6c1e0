"""Ctrl-C while a command connects to a board ends it at once (exit 130, one line). Where the
command was started with SIGINT ignored, as a shell without job control starts a script's
`cmd &` (so that Ctrl-C at the terminal leaves it running), SIGINT is left ignored, there as in
the board job's wait, and SIGTERM ends it at once (QA, starting commands so: `deploy` and `devices
--check`, SIGINT at 2 s and 3 s, waited out connect_timeout_s = 30, while the job's wait alone
took SIGINT). Through the real
`edge-remat` entry point (`python -m edge_remat`), against a real port that never speaks."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import pytest

from helpers.bad_inputs import INTERRUPTED, env, refused
from helpers.board_fixtures import PtyPair, needs_socat

ENTRY = [sys.executable, "-m", "edge_remat"]  # the installed command's own entry point
IGNORED = pytest.mark.parametrize("sigint_ignored", [False, True],
                                  ids=["sigint", "sigint-inherited-ignored"])


def _ignoring_sigint():
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # what sh does for `cmd &`


def _interrupted_while_connecting(config, sigint_ignored: bool) -> float:
    """`job sleep --device CONFIG`, SIGINT 2 s in (connecting by then), and where SIGINT is
    ignored, SIGTERM a second later: seconds from the signal that ends it to its end."""
    proc = subprocess.Popen([*ENTRY, "job", "sleep", "--device", str(config), "--param",
                             "seconds=1"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env(),
                            preexec_fn=_ignoring_sigint if sigint_ignored else None)
    time.sleep(2.0)
    proc.send_signal(signal.SIGINT)
    if sigint_ignored:
        time.sleep(1.0)
        assert proc.poll() is None, "an ignored SIGINT stopped it"
        proc.send_signal(signal.SIGTERM)
    started = time.monotonic()
    try:
        out, err = proc.communicate(timeout=8)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"the signal did not stop it within 8 s: {out}{err}") from None
    refused(subprocess.CompletedProcess(proc.args, proc.returncode, out, err), INTERRUPTED,
            "interrupted (SIGTERM)" if sigint_ignored else "interrupted (Ctrl-C)")
    return time.monotonic() - started


@IGNORED
def test_ctrl_c_while_an_ssh_port_stays_silent(tmp_path, sigint_ignored):
    silent = socket.create_server(("127.0.0.1", 0))  # accepts, never says a word
    config = tmp_path / "silent.toml"
    config.write_text(f'name = "silent"\n[connection]\nkind = "ssh"\nhost = "127.0.0.1"\n'
                      f"port = {silent.getsockname()[1]}\nconnect_timeout_s = 30\n"
                      f'ssh_config = "none"\nknown_hosts = "{tmp_path / "known_hosts"}"\n')
    try:
        assert _interrupted_while_connecting(config, sigint_ignored) < 3
    finally:
        silent.close()


@pytest.mark.loopback
@needs_socat
@IGNORED
def test_ctrl_c_while_a_serial_line_has_no_agent(tmp_path, sigint_ignored):
    with PtyPair(tmp_path) as ptys:  # nothing on the board's end
        config = tmp_path / "noagent.toml"
        config.write_text(f'name = "noagent"\n[connection]\nkind = "serial"\n'
                          f'port = "{ptys.host_end}"\nbaud = 115200\nconnect_timeout_s = 30\n')
        assert _interrupted_while_connecting(config, sigint_ignored) < 3


def test_sigterm_while_devices_check_connects(tmp_path):
    """`devices --check` waits on its boards as the job commands do: SIGTERM ends it as Ctrl-C
    does, exit 130 and one line (it ended by the signal's default action, no line)."""
    silent = socket.create_server(("127.0.0.1", 0))
    config = tmp_path / "silent.toml"
    config.write_text(f'name = "silent"\n[connection]\nkind = "ssh"\nhost = "127.0.0.1"\n'
                      f"port = {silent.getsockname()[1]}\nconnect_timeout_s = 30\n"
                      f'ssh_config = "none"\nknown_hosts = "{tmp_path / "known_hosts"}"\n')
    try:
        proc = subprocess.Popen([*ENTRY, "devices", str(config), "--check"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env())
        time.sleep(2.0)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=8)
    finally:
        silent.close()
    refused(subprocess.CompletedProcess(proc.args, proc.returncode, out, err), INTERRUPTED,
            "interrupted (SIGTERM)")
