"""The agent daemon: one per workdir, serving the protocol on a Unix socket (always; the stdio
and serial front ends connect there) and optionally on a loopback TCP port, running jobs one
after another through the Worker.

It never listens on a public interface: a host reaches the TCP port through an SSH forward.
"""

from __future__ import annotations

import fcntl
import ipaddress
import logging
import os
import signal
import socket
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from .. import __version__
from ..wire.framing import ConnectionClosed, FrameStream, ProtocolError
from ..wire.protocol import (BAD_REQUEST, BUSY, CONFLICT, INTERNAL, MISSING_TORCH,
                             PROTOCOL_MISMATCH, PROTOCOL_VERSION, TERMINAL_STATES, UNKNOWN_JOB,
                             UNKNOWN_KIND, error_reply, reply)
from . import files
from .files import RequestError
from .archives import prune_archives
from .identity import agent_command, own_build, running_archive
from .layout import Layout, unix_socket_address
from .misplaced_pages import remove_misplaced_pages
from .registry import broken_plugins, job_kinds
from .store import JobStore, write_json_atomic
from .sysinfo import collect, torch_version
from .worker import Worker

_log = logging.getLogger(__name__)
MAX_WAIT_S = 60.0


class AlreadyRunning(RuntimeError):
    def __init__(self, layout: Layout, pid: str):
        self.pid = pid
        super().__init__(f"an agent daemon already runs for {layout.root} (pid {pid or '?'}); "
                         f"stop it with `edge-remat-agent stop --workdir {layout.root}`")


def parse_loopback(address: str) -> Tuple[str, int]:
    """'127.0.0.1:PORT' -> (host, port); anything but a loopback address is refused."""
    host, sep, port_text = address.rpartition(":")
    host = host.strip("[]")
    if not sep or not port_text.isdigit() or not host:
        raise ValueError(f"--tcp wants HOST:PORT such as 127.0.0.1:7070, got {address!r}")
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ValueError(f"refusing to listen on {host}: the agent listens on loopback only "
                         "(127.0.0.1 or ::1); reach it from the host through an SSH forward, "
                         f"e.g. ssh -L {port_text}:127.0.0.1:{port_text} BOARD")
    return host, int(port_text)


class Daemon:
    def __init__(self, layout: Layout, *, tcp: Optional[str] = None, unix: bool = True,
                 idle_exit_s: Optional[float] = None, job_command: Optional[List[str]] = None):
        self.layout = layout.ensure()
        self.tcp = parse_loopback(tcp) if tcp else None
        self.unix = unix
        self.idle_exit_s = idle_exit_s
        self.build = own_build()
        self.cond = threading.Condition()
        self.store = JobStore(self.layout)
        self.worker = Worker(self.store, self.layout, job_command or agent_command(),
                             self.cond, self.cond.notify_all)
        self.tcp_address: Optional[Tuple[str, int]] = None
        self._stop = threading.Event()
        self._listeners: List[socket.socket] = []
        self._connections: Set[socket.socket] = set()
        self._last_activity = time.monotonic()
        self._lock_fd: Optional[int] = None
        self._handlers: Dict[str, Callable[[dict, bytes], Any]] = {
            "hello": self._hello, "ping": self._ping, "sysinfo": self._sysinfo,
            "submit": self._submit, "job": self._job, "wait": self._wait, "jobs": self._jobs,
            "cancel": self._cancel, "stat_file": self._stat_file, "put_file": self._put_file,
            "get_file": self._get_file, "stop": self._stop_request,
        }

    # -- life cycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Take the workdir's lock, recover jobs, open the listeners (returns at once)."""
        self._take_lock()
        self.store.load()
        prune_archives(self.layout, running_archive())  # the lock held: one daemon at a time
        if not self.store.in_state("running"):  # an adopted job may still page there
            remove_misplaced_pages(self.layout.root)
        if self.unix:
            self._listen_unix()
        if self.tcp:
            self._listen_tcp(*self.tcp)
        self.worker.start()  # only once the listeners are up: a bad --tcp starts no job
        write_json_atomic(self.layout.info_path, {
            "pid": os.getpid(), "build": self.build, "agent_version": __version__,
            "socket": str(self.layout.socket_path) if self.unix else None,
            "tcp": f"{self.tcp_address[0]}:{self.tcp_address[1]}" if self.tcp_address else None,
            "started_s": time.time()})
        _log.info("agent daemon %s (build %s) serving %s", os.getpid(), self.build[:16],
                  self.layout.root)

    def serve_forever(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                signal.signal(signum, lambda *_: self._stop.set())
        while not self._stop.wait(0.5):
            if self._idle_too_long():
                _log.info("idle for %.0f s: exiting", self.idle_exit_s)
                break
        self.shutdown()

    def request_stop(self) -> None:
        self._stop.set()

    def shutdown(self) -> None:
        self._stop.set()
        for listener in self._listeners:
            _close(listener)
        if self.unix:  # nobody new can reach this daemon from now on
            try:
                self.layout.socket_path.unlink()
            except OSError:
                pass
        self.worker.stop()
        with self.cond:
            self.cond.notify_all()  # wake long polls so they answer before we go
            connections = list(self._connections)
        time.sleep(0.05)
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            _close(conn)
        try:
            self.layout.info_path.unlink()
        except OSError:
            pass
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        _log.info("agent daemon stopped")

    def _take_lock(self) -> None:
        fd = os.open(self.layout.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            pid = os.read(fd, 32).decode(errors="replace").strip()
            os.close(fd)
            raise AlreadyRunning(self.layout, pid) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._lock_fd = fd

    def _idle_too_long(self) -> bool:
        if not self.idle_exit_s:
            return False
        with self.cond:
            if self._connections or self.worker.busy():
                self._last_activity = time.monotonic()
                return False
        return time.monotonic() - self._last_activity > self.idle_exit_s

    # -- listeners ---------------------------------------------------------------------------
    def _listen_unix(self) -> None:
        path = self.layout.socket_path
        try:
            path.unlink()  # a leftover of a daemon that died: we hold the lock now
        except OSError:
            pass
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)  # only this user may talk to the agent
        try:
            listener.bind(unix_socket_address(path))
        finally:
            os.umask(old_umask)
        self._serve_listener(listener, trusted=True)

    def _listen_tcp(self, host: str, port: int) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
        self.tcp_address = listener.getsockname()[:2]
        # Any local user can reach a loopback port, so TCP clients may not replace the
        # agent's code (agents/, agent.current); the 0600 Unix socket is this user's only.
        self._serve_listener(listener, trusted=False)

    def _serve_listener(self, listener: socket.socket, trusted: bool) -> None:
        listener.listen(8)
        listener.settimeout(0.5)
        self._listeners.append(listener)
        threading.Thread(target=self._accept_loop, args=(listener, trusted), daemon=True,
                         name="agent-accept").start()

    def _accept_loop(self, listener: socket.socket, trusted: bool) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            conn.settimeout(None)
            with self.cond:
                self._connections.add(conn)
                self._last_activity = time.monotonic()
            threading.Thread(target=self._serve_connection, args=(conn, trusted), daemon=True,
                             name="agent-conn").start()

    def _serve_connection(self, conn: socket.socket, trusted: bool) -> None:
        stream = FrameStream(conn)
        sending = threading.Lock()  # a long poll's thread answers beside this loop
        try:
            while not self._stop.is_set():
                try:
                    request, body = stream.recv()
                except (ConnectionClosed, OSError):
                    return
                except ProtocolError as exc:
                    _send_quietly(stream, error_reply({}, BAD_REQUEST, str(exc)))
                    return
                if not trusted and request.get("type") == "put_file":
                    request = dict(request, _untrusted=True)
                if request.get("type") == "wait":
                    # A long poll answers from a thread of its own: a host whose Ctrl-C
                    # abandoned it sends its cancel on this connection next, which otherwise
                    # waited behind it for up to its timeout (10 s). The host's client skips
                    # the late answer by its id.
                    threading.Thread(target=self._answer_wait,
                                     args=(stream, sending, request, body), daemon=True,
                                     name="agent-wait").start()
                    continue
                answer, data, after = self._dispatch(request, body)
                with sending:
                    if not _send_quietly(stream, answer, data):
                        return
                if after is not None:
                    after()
        finally:
            with self.cond:
                self._connections.discard(conn)
                self._last_activity = time.monotonic()
            _close(conn)

    def _answer_wait(self, stream: FrameStream, sending: threading.Lock, request: dict,
                     body: bytes) -> None:
        answer, data, _ = self._dispatch(request, body)
        with sending:
            _send_quietly(stream, answer, data)  # a closed link: its loop has ended too

    def _dispatch(self, request: dict, body: bytes):
        handler = self._handlers.get(str(request.get("type")))
        if handler is None:
            return error_reply(request, BAD_REQUEST, f"unknown request {request.get('type')!r} "
                               f"(this agent knows: {', '.join(sorted(self._handlers))})"), \
                b"", None
        try:
            result = handler(request, body)
        except RequestError as exc:
            return error_reply(request, exc.code, exc.message, **exc.details), b"", None
        except Exception as exc:  # noqa: BLE001 - a bug answers as an error, not a hang
            _log.exception("request %s failed", request.get("type"))
            return error_reply(request, INTERNAL, f"{type(exc).__name__}: {exc}"), b"", None
        fields, data, after = result if isinstance(result, tuple) else (result, b"", None)
        return reply(request, **fields), data, after

    # -- requests ---------------------------------------------------------------------------
    def _hello(self, request: dict, body: bytes) -> dict:
        theirs = request.get("protocol")
        if theirs != PROTOCOL_VERSION:
            raise RequestError(PROTOCOL_MISMATCH,
                               f"the agent on the board speaks protocol {PROTOCOL_VERSION}, the "
                               f"host speaks {theirs}: install the same edge-remat version on "
                               "both (the host pushes its agent over SSH and serial by itself)",
                               protocol=PROTOCOL_VERSION)
        import platform
        with self.cond:
            current = self.worker.current["id"] if self.worker.current else None
            queued = len(self.store.in_state("queued"))
        return {"protocol": PROTOCOL_VERSION, "agent_version": __version__, "build": self.build,
                "python": platform.python_version(), "executable": sys.executable,
                "machine": platform.machine(),
                "system": platform.system(), "pid": os.getpid(),
                "workdir": str(self.layout.root), "torch": torch_version(),
                "job_kinds": {k: {"needs_torch": v.needs_torch, "description": v.description}
                              for k, v in sorted(job_kinds().items())},
                "broken_plugins": broken_plugins(), "running": current, "queued": queued}

    def _ping(self, request: dict, body: bytes) -> dict:
        return {"time_s": time.time()}

    def _sysinfo(self, request: dict, body: bytes) -> dict:
        page_dir = request.get("page_dir")
        return collect(self.layout.root, self.build,
                       page_dir if isinstance(page_dir, str) and page_dir else None)

    def _record(self, request: dict) -> dict:
        job_id = request.get("job")
        record = self.store.records.get(job_id) if isinstance(job_id, str) else None
        if record is None:
            raise RequestError(UNKNOWN_JOB, f"no job {job_id!r} on this board (it may have been "
                                            "pruned: the agent keeps the last 200)")
        return record

    def _submit(self, request: dict, body: bytes) -> dict:
        kind, params, job_id = request.get("kind"), request.get("params", {}), request.get("job")
        if not isinstance(params, dict):
            raise RequestError(BAD_REQUEST, "submit: params must be a JSON object")
        if job_id is not None and not isinstance(job_id, str):
            raise RequestError(BAD_REQUEST, "submit: job must be a job id (a string) or left out")
        kinds = job_kinds()
        if not isinstance(kind, str) or kind not in kinds:
            raise RequestError(UNKNOWN_KIND, f"this agent has no job kind {kind!r} (it has: "
                                             f"{', '.join(sorted(kinds))})")
        if kinds[kind].needs_torch and torch_version() is None:
            raise RequestError(MISSING_TORCH, f"job kind {kind!r} needs torch, which is not "
                                              "installed for this Python on the board")
        with self.cond:
            existing = self.store.records.get(job_id) if job_id else None
            if existing is not None:
                if existing["kind"] != kind or existing["params"] != params:
                    raise RequestError(CONFLICT, f"job id {job_id!r} already names a different "
                                                 "job on this board")
                return {"job": self.store.public(existing), "created": False}
            try:
                record = self.store.create(kind, params, job_id)
            except ValueError as exc:
                raise RequestError(BAD_REQUEST, str(exc)) from None
            self.cond.notify_all()
            return {"job": self.store.public(record), "created": True}

    def _job(self, request: dict, body: bytes) -> dict:
        with self.cond:
            return {"job": self.store.public(self._record(request))}

    def _wait(self, request: dict, body: bytes) -> dict:
        timeout = request.get("timeout_s", 10.0)
        if not isinstance(timeout, (int, float)):
            raise RequestError(BAD_REQUEST, "wait: timeout_s must be a number of seconds")
        after = request.get("after_rev")
        with self.cond:
            record = self._record(request)
            self.cond.wait_for(lambda: record.get("rev") != after
                               or record["state"] in TERMINAL_STATES or self._stop.is_set(),
                               min(max(float(timeout), 0.0), MAX_WAIT_S))
            return {"job": self.store.public(record)}

    def _jobs(self, request: dict, body: bytes) -> dict:
        with self.cond:
            return {"jobs": [self.store.public(r) for r in
                             sorted(self.store.records.values(), key=lambda r: r["order"])]}

    def _cancel(self, request: dict, body: bytes) -> dict:
        with self.cond:
            record = self._record(request)
            self.worker.cancel(record)
            return {"job": self.store.public(record)}

    def _stat_file(self, request: dict, body: bytes) -> dict:
        return files.stat_file(self.layout, request)

    def _put_file(self, request: dict, body: bytes) -> dict:
        return files.put_file(self.layout, request, body,
                              allow_code=not request.get("_untrusted"))

    def _get_file(self, request: dict, body: bytes):
        fields, data = files.get_file(self.layout, request)
        return fields, data, None

    def _stop_request(self, request: dict, body: bytes):
        if request.get("if_idle") and self.worker.busy():
            with self.cond:
                current = self.worker.current["id"] if self.worker.current else None
            raise RequestError(BUSY, f"the agent is busy (job {current or 'queued'}); "
                                     "it was not stopped", running=current)
        return {"stopping": True}, b"", self._stop.set  # set after the reply went out


def _send_quietly(stream: FrameStream, header: dict, body: bytes = b"") -> bool:
    try:
        stream.send(header, body)
        return True
    except ProtocolError as exc:  # the answer is over the frame limits: say so instead
        return _send_quietly(stream, error_reply(header, INTERNAL, f"the answer is too large "
                                                 f"to send: {exc}"))
    except OSError:
        return False


def _close(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:
        pass
