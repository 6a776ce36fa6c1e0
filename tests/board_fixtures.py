"""Real servers for transport tests: an OpenSSH sshd on a loopback port (its own host key,
authorized_keys and config in a temp dir) and socat pseudo-terminal pairs for serial links.
Tests that need a missing binary skip, saying what to install."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional

import pytest

SSHD = shutil.which("sshd") or ("/usr/sbin/sshd" if os.path.exists("/usr/sbin/sshd") else None)
SSH_KEYGEN = shutil.which("ssh-keygen")
SOCAT = shutil.which("socat")

needs_sshd = pytest.mark.skipif(
    SSHD is None or SSH_KEYGEN is None,
    reason="needs OpenSSH's sshd and ssh-keygen (Debian: apt-get install openssh-server)")
needs_socat = pytest.mark.skipif(SOCAT is None,
                                 reason="needs socat (Debian: apt-get install socat)")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def keygen(path: Path) -> Path:
    subprocess.run([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path


class SshServer:
    """sshd -D on 127.0.0.1:PORT, logging in the user running the tests with key auth only."""

    def __init__(self, root: Path):
        self.root = root
        self.port = free_port()
        self.user = os.environ.get("USER") or __import__("getpass").getuser()
        self.host_key = keygen(root / "ssh_host_ed25519_key")
        self.client_key = keygen(root / "id_ed25519")
        self.authorized_keys = root / "authorized_keys"
        self.authorized_keys.write_text(Path(str(self.client_key) + ".pub").read_text())
        os.chmod(self.authorized_keys, 0o600)
        self.config = root / "sshd_config"
        self.log = root / "sshd.log"
        self.proc: Optional[subprocess.Popen] = None

    def start(self) -> "SshServer":
        self.config.write_text(f"""\
Port {self.port}
ListenAddress 127.0.0.1
HostKey {self.host_key}
PidFile {self.root}/sshd.pid
AuthorizedKeysFile {self.authorized_keys}
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
AllowTcpForwarding yes
Subsystem sftp internal-sftp
ClientAliveInterval 5
LogLevel VERBOSE
""")
        if os.geteuid() == 0:
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # privilege separation dir
        self.proc = subprocess.Popen([SSHD, "-f", str(self.config), "-D", "-e"],
                                     stdout=subprocess.DEVNULL, stderr=open(self.log, "wb"))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.skip(f"sshd did not start: {self.log.read_text()[-300:]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                time.sleep(0.05)
        pytest.skip("sshd did not start listening within 10 s")

    def host_key_line(self) -> str:
        public = Path(str(self.host_key) + ".pub").read_text().split()
        return f"[127.0.0.1]:{self.port} {public[0]} {public[1]}\n"

    def session_pids(self) -> List[int]:
        """Processes serving connections (children of the listening sshd)."""
        import psutil
        return [child.pid for child in psutil.Process(self.proc.pid).children()]

    def drop_connections(self) -> int:
        """Kill every connection's sshd: what a dropped network does to the host's link."""
        pids = self.session_pids()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        return len(pids)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.drop_connections()
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()


class PtyPair:
    """Two linked pseudo-terminals from socat: one end for the host, one for the board.
    restart() kills socat and starts a new one on the same link names: a pulled cable."""

    def __init__(self, root: Path):
        self.host_end = str(root / "host-tty")
        self.board_end = str(root / "board-tty")
        self.proc: Optional[subprocess.Popen] = None

    def start(self) -> "PtyPair":
        self.proc = subprocess.Popen(
            [SOCAT, f"pty,raw,echo=0,link={self.host_end}",
             f"pty,raw,echo=0,link={self.board_end}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 5
        while not (os.path.exists(self.host_end) and os.path.exists(self.board_end)):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                pytest.skip("socat did not create its pseudo-terminals")
            time.sleep(0.02)
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def restart(self) -> None:
        self.kill()
        for link in (self.host_end, self.board_end):
            try:
                os.unlink(link)
            except OSError:
                pass
        self.start()


def agent_command() -> List[str]:
    return [sys.executable, "-m", "edge_remat_agent"]


def stop_agent(workdir: Path) -> None:
    """Stop a workdir's daemon if one runs (test cleanup)."""
    from edge_remat_agent.daemon.launcher import stop_daemon
    from edge_remat_agent.daemon.layout import Layout
    try:
        stop_daemon(Layout(workdir))
    except Exception:  # noqa: BLE001 - already gone, or stopped mid-request
        pass
