"""Real servers for transport tests: an OpenSSH sshd on a loopback port (its own host key,
authorized_keys and config in a temp dir) and socat pseudo-terminal pairs for serial links.
The servers themselves live in helpers/testbed.py (benchmarks/transport.py uses them
too); here they skip the test, saying what to install, when they cannot start."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import pytest

from edge_remat.devices import write_local_device
from helpers import testbed
from helpers.testbed import (SOCAT, SOCAT_MISSING, SSH_KEYGEN, SSHD, SSHD_MISSING,
                             LinkUnavailable, agent_command, free_port, keygen, stop_agent)

needs_sshd = pytest.mark.skipif(SSHD is None or SSH_KEYGEN is None, reason=SSHD_MISSING)
needs_socat = pytest.mark.skipif(SOCAT is None, reason=SOCAT_MISSING)


class SshServer(testbed.SshServer):
    """sshd -D on 127.0.0.1:PORT, logging in the user running the tests with key auth only."""

    def start(self, timeout_s: float = 10.0, prefix=None) -> "SshServer":
        try:
            return super().start(timeout_s, prefix)
        except LinkUnavailable as exc:
            pytest.skip(str(exc))


class PtyPair(testbed.PtyPair):
    """Two linked pseudo-terminals from socat; restart() is a pulled cable."""

    def start(self, timeout_s: float = 5.0) -> "PtyPair":
        try:
            return super().start(timeout_s)
        except LinkUnavailable as exc:
            pytest.skip(str(exc))


__all__ = ["SshServer", "PtyPair", "needs_sshd", "needs_socat", "free_port", "keygen",
           "agent_command", "stop_agent", "local_board", "local_bench_device", "ssh_device_config",
           "loopback_ssh_board", "python_without_torch"]


@contextlib.contextmanager
def local_board(root: Path, name: str, **hardware):
    """A local device config `name` in root/configs, its board working in root/board, found
    through EDGE_REMAT_DEVICE_CONFIGS with a cache of its own (root/cache) while the context
    lasts; the board's agent is stopped at its end. `hardware`: memory_limit_bytes, page_dir."""
    write_local_device(root / "configs", name, root / "board", **hardware)
    patch = pytest.MonkeyPatch()
    patch.setenv("EDGE_REMAT_DEVICE_CONFIGS", str(root / "configs"))
    patch.setenv("XDG_CACHE_HOME", str(root / "cache"))
    try:
        yield root
    finally:
        patch.undo()
        stop_agent(root / "board")


def local_bench_device(tmp_path, monkeypatch):
    """A device config "bench" for the local machine, its workdir under tmp_path, found through
    EDGE_REMAT_DEVICE_CONFIGS. Returns (config folder, workdir); stop_agent(workdir) after."""
    folder, workdir = tmp_path / "configs", tmp_path / "board"
    write_local_device(folder, "bench", workdir)
    monkeypatch.setenv("EDGE_REMAT_DEVICE_CONFIGS", str(folder))
    return folder, workdir


def ssh_device_config(path: Path, sshd: SshServer, workdir: Path, extra: str = "") -> Path:
    """A device config "loopback" of kind ssh at `path` for a running `sshd`: this Python on the
    board, trust on first use into a known_hosts beside it, no ~/.ssh/config. `extra`: more
    TOML lines, e.g. timeouts in [connection] (appended there) or a [hardware] table."""
    folder = path.parent
    path.write_text(f"""\
name = "loopback"
[connection]
kind = "ssh"
host = "127.0.0.1"
port = {sshd.port}
user = "{sshd.user}"
key = "{sshd.client_key}"
python = "{sys.executable}"
workdir = "{workdir}"
host_key_policy = "accept-new"
known_hosts = "{folder / 'known_hosts'}"
ssh_config = "{folder / 'no_ssh_config'}"
{extra}""")
    return path


@contextlib.contextmanager
def loopback_ssh_board(tmp_path: Path):
    """A fresh sshd on loopback and a device config of kind ssh for it (no power sensor);
    yields (config path, sshd, board workdir), then stops the agent and sshd."""
    (tmp_path / "sshd").mkdir()
    sshd = SshServer(tmp_path / "sshd").start()
    workdir = tmp_path / "board"
    config = ssh_device_config(tmp_path / "loopback.toml", sshd, workdir,
                               "connect_timeout_s = 10\nreconnect_timeout_s = 30\n"
                               "[hardware]\nsensor = \"none\"\n")
    try:
        yield config, sshd, workdir
    finally:
        stop_agent(workdir)
        sshd.stop()


def python_without_torch() -> "str | None":
    """A Python on this machine without torch (Debian's /usr/bin/python3, say), to stand in for
    a board that lacks it; None when every Python here has torch."""
    import shutil
    import subprocess
    for candidate in ("/usr/bin/python3", shutil.which("python3")):
        if candidate and Path(candidate).is_file() and subprocess.run(
                [candidate, "-c", "import importlib.util, sys; "
                 "sys.exit(importlib.util.find_spec('torch') is not None)"]).returncode == 0:
            return candidate
    return None
