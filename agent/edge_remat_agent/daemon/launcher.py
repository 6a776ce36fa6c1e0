"""Front ends: how `serve --stdio` and `serve --serial` reach the workdir's daemon.

Jobs must outlive the link that started them: an SSH session that drops kills every process it
started in its session, and a serial cable can be pulled. So the front ends are thin relays.
`ensure_daemon` connects to the daemon's Unix socket, starting the daemon first (detached in a
session of its own, so a dying SSH session does not take it along) when none answers. Then the
relay copies bytes both ways until either side goes. A host that reconnects gets a new relay to
the same daemon and asks about the same job.

Which code the daemon runs: the archive named by WORKDIR/agent.current (the host writes it
after pushing a new agent), else the code running this front end. A daemon of another build is
replaced only while it is idle, never in the middle of someone's job.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

from .. import __version__
from ..wire.framing import FrameStream, PipeChannel
from ..wire.protocol import Client, RemoteError
from .identity import agent_command, build_of, running_archive
from .layout import Layout, unix_socket_address

_log = logging.getLogger(__name__)
DAEMON_IDLE_EXIT_S = 3600.0


class DaemonUnavailable(RuntimeError):
    pass


def connect_daemon(layout: Layout, timeout: float = 2.0) -> Optional[socket.socket]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(unix_socket_address(layout.socket_path))
    except OSError:
        sock.close()
        return None
    sock.settimeout(None)
    return sock


def start_daemon(layout: Layout, archive: Optional[Path]) -> subprocess.Popen:
    log = open(layout.log_path, "ab")
    if log.tell() > 4 << 20:  # keep the log small on small boards
        log.truncate(0)
    try:
        return subprocess.Popen(
            agent_command(archive) + ["serve", "--daemon", "--workdir", str(layout.root),
                                      "--idle-exit", str(DAEMON_IDLE_EXIT_S)],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=str(layout.root),
            start_new_session=True, close_fds=True)
    finally:
        log.close()


def ensure_daemon(layout: Layout, timeout: float = 30.0) -> socket.socket:
    """A connection to this workdir's daemon of the wanted build, starting one if needed."""
    layout.ensure()
    archive = layout.current_archive() or running_archive()
    wanted = build_of(archive)
    deadline = time.monotonic() + timeout
    started: Optional[subprocess.Popen] = None
    while time.monotonic() < deadline:
        sock = connect_daemon(layout)
        if sock is None:
            if started is None or started.poll() is not None:
                if started is not None and started.returncode not in (0, None):
                    _log.info("daemon exited with %s; retrying", started.returncode)
                    if _holder_lost_its_socket(layout):
                        _stop_unreachable(layout, if_idle=False)
                    time.sleep(0.5)  # not a start a tick: its log would fill with the refusals
                started = start_daemon(layout, archive)
            time.sleep(0.05)
            continue
        client = Client(FrameStream(sock))
        try:
            hello = client.hello(f"edge-remat-agent-relay/{__version__}")
        except (RemoteError, OSError, ValueError):
            sock.close()
            time.sleep(0.1)
            continue
        if (hello.get("build") == wanted and _runs_this_python(hello)) \
                or not _replace_if_idle(client):
            return sock  # the relay's own hello is answered; the rest of the stream is the host's
        sock.close()
        wait_for_exit(layout, deadline)
    raise DaemonUnavailable(f"no agent daemon answered on {layout.socket_path} within "
                            f"{timeout:g} s; see {layout.log_path}")


def _runs_this_python(hello: dict) -> bool:
    """Whether the daemon runs the Python this front end runs (the board's configured one),
    and that Python is still on disk. An idle daemon that does not is replaced like one of
    another build: one started from a virtual environment since deleted answers, but every job
    it starts fails; and one started before the device config named another Python (another
    venv, a torch build) kept running the old one for its idle hour, `devices --check`
    reporting the old interpreter (QA)."""
    executable = hello.get("executable")
    return not executable or (executable == sys.executable and os.path.exists(executable))


def _replace_if_idle(client: Client) -> bool:
    try:
        client.call("stop", if_idle=True)
        return True
    except RemoteError:
        return False  # busy: keep using the running daemon


STARTING_S = 5.0  # a daemon that took the lock this recently may still be opening its socket


def _holder_lost_its_socket(layout: Layout) -> bool:
    """Whether the daemon holding the workdir's lock has had time to open its socket and has
    none (it was removed under it): it answers nobody, and no other daemon can start."""
    from .runner import lock_is_held
    try:
        locked_for = time.time() - layout.lock_path.stat().st_mtime
    except OSError:
        return False
    return (locked_for > STARTING_S and not layout.socket_path.exists()
            and lock_is_held(layout.lock_path))


def _stop_unreachable(layout: Layout, if_idle: bool) -> str:
    """A daemon that holds the workdir's lock but answers on no socket (its socket file was
    removed under it): it cannot be asked, and no new one can start, so it is told by signal
    (SIGTERM: it stops as on a stop request). Without a lock holder, none runs."""
    import signal

    from .runner import lock_is_held
    if not lock_is_held(layout.lock_path):
        return f"no agent daemon runs for {layout.root}"
    try:
        pid = int(layout.lock_path.read_text().strip())
    except (OSError, ValueError):
        raise RemoteError("unreachable", f"a process holds {layout.lock_path} but it names no "
                          "pid; stop the agent daemon by hand") from None
    if if_idle:
        raise RemoteError("busy", f"the agent daemon for {layout.root} (pid {pid}) answers on "
                          "no socket, so whether it is idle cannot be asked; stop it without "
                          "--if-idle")
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass  # gone meanwhile
    wait_for_exit(layout, time.monotonic() + 15)
    if lock_is_held(layout.lock_path):
        raise RemoteError("unreachable", f"the agent daemon for {layout.root} (pid {pid}) "
                          "answers on no socket and did not stop on SIGTERM within 15 s")
    return (f"agent daemon for {layout.root} (pid {pid}) stopped: it answered on no socket "
            "(its socket file was removed)")


def wait_for_exit(layout: Layout, deadline: float) -> None:
    """Until the daemon has let go of the workdir's lock: it has finished stopping."""
    from .runner import lock_is_held
    while time.monotonic() < deadline and lock_is_held(layout.lock_path):
        time.sleep(0.05)


def relay(a: Any, b: Any) -> None:
    """Copy bytes both ways between two channels until either side ends, then close both."""
    done = threading.Event()

    def pump(src: Any, dst: Any) -> None:
        try:
            while not done.is_set():
                data = src.recv(1 << 16)
                if not data:
                    break
                dst.sendall(data)
        except (OSError, ValueError):
            pass
        finally:
            done.set()

    threads = [threading.Thread(target=pump, args=(a, b), daemon=True),
               threading.Thread(target=pump, args=(b, a), daemon=True)]
    for thread in threads:
        thread.start()
    done.wait()
    for channel in (a, b):
        try:
            if isinstance(channel, socket.socket):
                channel.shutdown(socket.SHUT_RDWR)
            channel.close()
        except OSError:
            pass
    for thread in threads:
        thread.join(1.0)


def serve_stdio(layout: Layout) -> int:
    sock = ensure_daemon(layout)
    # stdout is the protocol stream now: nothing else may print there.
    stdio = PipeChannel(sys.stdin.fileno(), sys.stdout.fileno(), close_fds=False)
    sys.stdout = sys.stderr
    relay(stdio, sock)
    return 0


def serve_serial(layout: Layout, device: str, baud: int) -> int:
    from ..wire.serial_link import SerialLink, ack_timeout_for
    from ..wire.tty import TtyPort

    link = SerialLink(TtyPort(device, baud), role="board", ack_timeout=ack_timeout_for(baud))
    _log.info("serving on %s at %d baud", device, baud)
    try:
        while True:
            session = link.accept()
            if session is None:
                return 0
            _log.info("host opened serial session %08x", session.id)
            try:
                sock = ensure_daemon(layout)
            except DaemonUnavailable as exc:
                _log.error("%s", exc)
                session.close()
                continue
            threading.Thread(target=relay, args=(session, sock), daemon=True,
                             name="serial-relay").start()
    finally:
        link.close()


def stop_daemon(layout: Layout, if_idle: bool = False) -> str:
    sock = connect_daemon(layout)
    if sock is None:
        return _stop_unreachable(layout, if_idle)
    client = Client(FrameStream(sock))
    try:
        client.call("stop", if_idle=if_idle)
    finally:
        client.close()
    wait_for_exit(layout, time.monotonic() + 15)
    return f"agent daemon for {layout.root} stopped"


