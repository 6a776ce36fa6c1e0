"""The `host` page tier for a run: the host keeps the board's pages in a PageService thread for
the duration of the run job, and tells the job where to find it (param `host_pages`).

    with host_pages(board, plan_uses_host, say) as params:   # {} or {"host_pages": ..., ...}
        board.run_job("run", {**base, **params}, ...)

local / emulated  the board is this machine: the service's own 127.0.0.1 port
ssh               a reverse port forward over the board's SSH connection: the board connects to
                  127.0.0.1:PORT on its side, each channel is bridged to the service here
serial            refused: a serial link carries the agent's frames only, not a page stream

The service ends with the host command, so a run job that pages to it cannot outlive it:
within host_pages Ctrl-C cancels the job even with --keep-running, and says why.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Callable, Iterator

from edge_remat_agent.pages.service import PageService

from .errors import TransportError

FORWARD_AGAIN_S = 30.0  # _forward's pauses (7.5 s in all) and a margin for the SSH handshake


def plan_uses_host(plan) -> bool:
    """Whether a plan (a Plan, or the dict of a plan file) pages anything out to `host`."""
    return host_page_outs(plan) > 0


def host_page_outs(plan) -> int:
    """How many pages a plan (a Plan, or the dict of a plan file, whose instructions that are
    no dict count none) sends to `host`."""
    if isinstance(plan, dict):
        return sum(1 for stage in plan.get("stages") or [] for ins in stage
                   if isinstance(ins, dict) and ins.get("op") == "page_out"
                   and ins.get("tier") == "host")
    return plan.page_outs_to("host")


NOT_KEPT = "not kept running: it pages to this host's page service, which ends with this command"


@contextlib.contextmanager
def host_pages(board, uses_host: bool, say: Callable[[str], None] = lambda m: None,
               capacity_bytes: int | None = None, job_bound: bool = True) -> Iterator[dict]:
    """`job_bound`: the job needs the service to its end (a run job); Ctrl-C cancels it."""
    if not uses_host:
        yield {}
        return
    kind = board.device.connection.kind
    if kind == "serial":
        raise TransportError(f"{board.name} is reached over a serial link, which cannot carry "
                             "the host page tier: plan with --paging flash (or none), or reach "
                             "the board over SSH")
    with PageService(capacity_bytes) as service, _bound_to_this_host(board, job_bound, say):
        if kind == "ssh":
            with _reverse_forward(board, service) as board_port:
                say(f"host pages: page service at {service.address}, reached from "
                    f"{board.name} at 127.0.0.1:{board_port} (SSH reverse forward)")
                yield {"host_pages": f"127.0.0.1:{board_port}",
                       "host_pages_wait_s": board_wait_s(board)}
        else:
            say(f"host pages: page service at {service.address}")
            yield {"host_pages": service.address}


def board_wait_s(board) -> float:
    """How long the board's page requests wait for a dropped link: as long as this host keeps
    reconnecting to it, and the time to ask for the forward again (_forward's tries) on top."""
    return float(board.reconnect_timeout_s) + FORWARD_AGAIN_S


@contextlib.contextmanager
def link_pages(board, say: Callable[[str], None] = lambda m: None) -> Iterator[dict]:
    """For a profile job: the page service where the board's link can carry host pages (its
    `host_pages` param, so the profile measures the `host` tier), nothing over serial. The
    profile times the link first, in seconds, and needs the service no more: --keep-running
    holds for it."""
    serial = board.device.connection.kind == "serial"
    if serial:  # QA: the profile had no host tier, and nothing said why
        say(f"{board.name}: the host tier is not measured: a serial link cannot carry host "
            "pages (plans page to flash; reach the board over SSH for the host tier)")
    with host_pages(board, not serial, say, job_bound=False) as params:
        # Not a run's wait: the measurement waits a few seconds of its own for a dropped link
        # (profiler/measure.py LINK_WAIT_S), then the profile goes on without the host tier;
        # waiting out the reconnect window, then failing, lost the whole profile (QA).
        params.pop("host_pages_wait_s", None)
        yield params


@contextlib.contextmanager
def _bound_to_this_host(board, job_bound: bool, say: Callable[[str], None]) -> Iterator[None]:
    """A job that pages to this host dies with this command's page service: rather than leave
    it running to fail, Ctrl-C cancels it, and --keep-running is said up front not to hold."""
    if not job_bound:
        yield
        return
    with board.cancelled_on_interrupt(NOT_KEPT) as asked:
        if asked:
            say("warning: --keep-running does not hold for this job: it pages to this host's "
                "page service, which ends with this command, so Ctrl-C cancels it (plan with "
                "--paging flash or none for a job that can be left running)")
        yield


@contextlib.contextmanager
def _reverse_forward(board, service: PageService) -> Iterator[int]:
    """A reverse forward to the service on the board's SSH connection; after a reconnect
    (a dropped link) it is asked for again on the same port, which the job already knows."""
    def bridge(channel, origin, server) -> None:
        threading.Thread(target=_pump, args=(channel, service), daemon=True,
                         name="host-pages-forward").start()

    board.session()  # connected, so that the SSH client exists
    port = _forward(board, 0, bridge)

    def again() -> None:
        _forward(board, port, bridge)
        board.on_event(f"{board.name}: host pages forwarded again at 127.0.0.1:{port}")

    board.reconnect_hooks.append(again)
    try:
        yield port
    finally:
        board.reconnect_hooks.remove(again)
        try:
            _ssh_transport(board).cancel_port_forward("127.0.0.1", port)
        except Exception:  # noqa: BLE001 - the connection may be gone already
            pass


def _ssh_transport(board):
    clients = getattr(board.transport, "_clients", None)
    if not clients:
        raise TransportError(f"no SSH connection to {board.name} to forward the host page "
                             "service over")
    return clients[-1].get_transport()


def _forward(board, port: int, bridge, tries: int = 5) -> int:
    """request_port_forward on the board's current connection. A given port may still be
    held for a moment by the sshd session of the link that just dropped: tried a few times."""
    for attempt in range(tries):
        try:
            return _ssh_transport(board).request_port_forward("127.0.0.1", port,
                                                              handler=bridge)
        except TransportError:
            raise
        except Exception as exc:  # noqa: BLE001 - paramiko.SSHException: forwarding refused
            if port and attempt + 1 < tries:
                time.sleep(0.5 * (attempt + 1))
                continue
            what = f"port {port} again after a reconnect" if port else "a reverse port forward"
            raise TransportError(f"{board.name}'s SSH server refused {what} for the host page "
                                 f"tier ({exc}): allow it (AllowTcpForwarding) or plan with "
                                 "--paging flash") from exc
    raise AssertionError("unreachable")


def _pump(channel, service: PageService) -> None:
    """Bridge one forwarded channel to the service's socket, both ways, until either closes."""
    try:
        sock = socket.create_connection((service.host, service.port))
    except OSError:
        _quietly(channel.close)
        return
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def copy(read, write, done) -> None:
        try:
            while True:
                data = read(1 << 16)
                if not data:
                    break
                write(data)
        except (OSError, EOFError):
            pass
        finally:
            _quietly(done)

    back = threading.Thread(target=copy, daemon=True, args=(
        sock.recv, channel.sendall, channel.close))
    back.start()
    copy(channel.recv, sock.sendall, lambda: sock.shutdown(socket.SHUT_WR))
    back.join(timeout=5)
    sock.close()
    _quietly(channel.close)


def _quietly(close) -> None:
    """Close one end of a bridge whose link may already be gone (paramiko raises EOFError
    when its transport dropped under the channel; the reconnect takes it from there)."""
    try:
        close()
    except (OSError, EOFError):
        pass
