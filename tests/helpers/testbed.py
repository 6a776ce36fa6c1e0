"""Throwaway links on this machine, for the transport tests and benchmarks/transport.py: an
OpenSSH sshd on a free loopback port (its own host key, authorized_keys and config in a folder
it is given) and socat pseudo-terminal pairs standing in for a serial cable.

Nothing here depends on pytest: a server that cannot start raises `LinkUnavailable` with the
reason (tests/board_fixtures.py turns that into a skip, the benchmark into a message). Needs the
Debian packages `openssh-server` and `socat`.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional

SSHD = shutil.which("sshd") or ("/usr/sbin/sshd" if os.path.exists("/usr/sbin/sshd") else None)
SSH_KEYGEN = shutil.which("ssh-keygen")
SOCAT = shutil.which("socat")

SSHD_MISSING = "needs OpenSSH's sshd and ssh-keygen (Debian: apt-get install openssh-server)"
SOCAT_MISSING = "needs socat (Debian: apt-get install socat)"


class LinkUnavailable(RuntimeError):
    """A loopback sshd or a socat pty pair could not be started (the message says why)."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def keygen(path: Path) -> Path:
    if SSH_KEYGEN is None:
        raise LinkUnavailable(SSHD_MISSING)
    subprocess.run([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path


def _thread_settings() -> str:
    """An sshd_config line giving every session the thread counts set here (tests/conftest.py
    sets one thread per xdist worker): a board over SSH then trains with the same reductions
    as the plain step a test computes here to compare its weights bit for bit (with two
    threads there and one here, a LoRA run's adapters differed in their last bits)."""
    names = [f"{name}={os.environ[name]}" for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
             if os.environ.get(name)]
    return f"SetEnv {' '.join(names)}\n" if names else ""


class SshServer:
    """sshd -D on 127.0.0.1:PORT, logging in the user running it with key auth only."""

    def __init__(self, root: "str | os.PathLike[str]"):
        if SSHD is None or SSH_KEYGEN is None:
            raise LinkUnavailable(SSHD_MISSING)
        self.root = root = Path(root)
        self.port = free_port()
        self.user = os.environ.get("USER") or getpass.getuser()
        self.host_key = keygen(root / "ssh_host_ed25519_key")
        self.client_key = keygen(root / "id_ed25519")
        self.authorized_keys = root / "authorized_keys"
        self.authorized_keys.write_text(Path(str(self.client_key) + ".pub").read_text())
        os.chmod(self.authorized_keys, 0o600)
        self.config = root / "sshd_config"
        self.log = root / "sshd.log"
        self.proc: Optional[subprocess.Popen] = None

    def start(self, timeout_s: float = 10.0, prefix: "List[str] | None" = None) -> "SshServer":
        """`prefix`: argv before sshd's own (a memory cgroup's exec_prefix: a board whose every
        session and process has that much RAM)."""
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
{_thread_settings()}""")
        if os.geteuid() == 0:
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # privilege separation dir
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([*(prefix or []), SSHD, "-f", str(self.config), "-D",
                                          "-e"],
                                         stdout=subprocess.DEVNULL, stderr=log)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise LinkUnavailable(f"sshd did not start: {self.log.read_text()[-300:]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise LinkUnavailable(f"sshd did not start listening within {timeout_s:g} s")

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
                self.proc.wait()

    def __enter__(self) -> "SshServer":
        return self.start() if self.proc is None else self

    def __exit__(self, *exc) -> None:
        self.stop()


class PtyPair:
    """Two linked pseudo-terminals from socat (raw, no echo): one end for the host, one for the
    board. `baud` sets both ends' termios speed (socat's bNNN option); the kernel ignores it
    on a pty, so a pty pair moves bytes as fast as the processes on it can.
    restart() kills socat and starts a new one on the same link names: a pulled cable."""

    def __init__(self, root: "str | os.PathLike[str]", baud: Optional[int] = None):
        if SOCAT is None:
            raise LinkUnavailable(SOCAT_MISSING)
        self.host_end = str(Path(root) / "host-tty")
        self.board_end = str(Path(root) / "board-tty")
        self.baud = baud
        self.proc: Optional[subprocess.Popen] = None

    def _address(self, link: str) -> str:
        speed = f",b{self.baud}" if self.baud else ""
        return f"pty,raw,echo=0{speed},link={link}"

    def start(self, timeout_s: float = 5.0) -> "PtyPair":
        self.proc = subprocess.Popen(
            [SOCAT, self._address(self.host_end), self._address(self.board_end)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while not (os.path.exists(self.host_end) and os.path.exists(self.board_end)):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.kill()
                raise LinkUnavailable("socat did not create its pseudo-terminals")
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

    def __enter__(self) -> "PtyPair":
        return self.start() if self.proc is None else self

    def __exit__(self, *exc) -> None:
        self.kill()


def agent_command() -> List[str]:
    """The agent from this checkout, run by this Python."""
    return [sys.executable, "-m", "edge_remat_agent"]


def stop_agent(workdir: "str | os.PathLike[str]") -> None:
    """Stop a workdir's daemon if one runs (cleanup after a test or a benchmark)."""
    from edge_remat_agent.daemon.launcher import stop_daemon
    from edge_remat_agent.daemon.layout import Layout
    try:
        stop_daemon(Layout(Path(workdir)))
    except Exception:  # noqa: BLE001 - already gone, or stopped mid-request
        pass


__all__ = ["LinkUnavailable", "SshServer", "PtyPair", "free_port", "keygen", "agent_command",
           "stop_agent", "SSHD", "SSH_KEYGEN", "SOCAT"]
