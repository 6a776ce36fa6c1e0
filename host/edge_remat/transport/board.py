"""A board, reached through its device config, that survives a flaky link.

Every request goes through `_retrying`: when the link drops (LinkLost, or the board is briefly
unreachable) the board is reconnected, with growing pauses, until `reconnect_timeout_s` has
passed, and the request is made again. Requests are safe to repeat: a job is submitted under an
id chosen here, so a submit whose answer was lost returns the same job instead of a second one,
and waiting is a long poll on that id. The job itself never notices: it runs in the board's
daemon, apart from any connection.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import signal
import threading
import time
import uuid
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from edge_remat_agent.wire.protocol import TERMINAL_STATES

from ..devices import DeviceConfig, with_torch_device
from ..errors import Interrupted
from ..planner.interrupt import stopped_by
from .errors import (AgentError, BoardMissingTorch, BoardUnreachable, JobOutOfReach, LinkLost,
                     TransportError, as_reported, job_failed)
from .hints import torch_hint
from .session import AgentSession, file_sha256
from .zipapp import AgentArchive, build_agent_archive

WAIT_POLL_S = 10.0
# A job that says nothing new for QUIET_S is shown again (on_update with the same record): a
# phase of minutes with no line (profile on the emulated arm64 board: 9 min) reads as a hang.
from ..heartbeat import QUIET_S  # noqa: E402
CANCEL_RECONNECT_S = 10.0  # after Ctrl-C, how long to try to reach the board to cancel
CANCEL_WAIT_S = 10.0  # and how long to wait for the cancelled job to end
# A Ctrl-C this soon after the first is the same one: `timeout -s INT` signals the process
# and then its process group, so the tool gets two; over a slow serial link the second came
# while the cancel was on its way and abandoned it (about one run in two).
ECHO_S = 0.5


STILL_TRYING_S = 30.0  # while reconnecting, a line at most this often after the first


def still_trying_every_s(reconnect_timeout_s: float) -> float:
    """How often a reconnect loop says it is still trying: every 30 s (a quarter of the
    default 120 s it tries for), more often for a shorter timeout, never under 5 s."""
    return min(STILL_TRYING_S, max(5.0, reconnect_timeout_s / 4))


def make_transport(device: DeviceConfig, archive: Optional[AgentArchive] = None,
                   on_event: Callable[[str], None] = lambda message: None):
    kind = device.connection.kind
    if device.emulator is not None:  # a board this machine emulates: start it (build first)
        from ..arm_board import attach
        device = attach(device, on_event)
    if kind == "ssh":
        from .ssh import SshTransport
        return SshTransport(device, archive)
    if kind == "serial":
        from .serial import SerialTransport
        return SerialTransport(device, archive)
    if device.hardware.memory_limit_bytes:
        from .emulated import emulated_transport
        return emulated_transport(device, archive)
    from .local import LocalTransport
    return LocalTransport(device, archive)


class Board:
    def __init__(self, device: DeviceConfig, *, transport=None,
                 archive: Optional[AgentArchive] = None,
                 reconnect_timeout_s: Optional[float] = None,
                 on_event: Optional[Callable[[str], None]] = None,
                 keep_running: bool = False):
        self.device = device
        # Ctrl-C while waiting on a job this Board submitted: cancel it (the default, so that
        # the next run does not queue behind it) or leave it running and say how to come back.
        self.keep_running = keep_running
        self.not_kept: Optional[str] = None  # why Ctrl-C cancels despite --keep-running
        self.archive = archive
        self.on_event = on_event or (lambda message: None)
        self.transport = transport or make_transport(device, archive, self.on_event)
        self.reconnect_timeout_s = (device.connection.reconnect_timeout_s
                                    if reconnect_timeout_s is None else reconnect_timeout_s)
        self.reconnects = 0
        self.last_job: Optional[str] = None  # the job run_job last submitted (or tried to)
        self.hello_info: dict = {}
        self._session: Optional[AgentSession] = None
        self._connected_once = False
        # Called after each reconnect, to restore what lived on the old connection (the host
        # page tier's SSH reverse forward); a hook may raise TransportError.
        self.reconnect_hooks: List[Callable[[], None]] = []

    @property
    def name(self) -> str:
        return self.device.name

    @property
    def connected(self) -> bool:
        """Whether this Board has reached the board's agent at least once."""
        return self._connected_once

    # -- connection ----------------------------------------------------------------------
    def session(self) -> AgentSession:
        if self._session is None:
            self._session = self.transport.open()
            self.hello_info = self._session.info
            reconnected, self._connected_once = self._connected_once, True
            self._note_build()
            if reconnected:
                for hook in list(self.reconnect_hooks):
                    hook()
        return self._session

    def _note_build(self) -> None:
        """An idle daemon of another build is replaced on connect; a busy one is kept."""
        running = self.hello_info.get("running")
        build = self._other_build()
        if build and running:
            self.on_event(f"{self.name}: the board's agent is another build ({build[:12]}), "
                          f"kept while it runs job {running}; the new one starts when idle")

    def _other_build(self) -> str:
        """The build of the board's agent where it is not this host's (else ''): a daemon
        that was busy when this host connected, which runs this host's jobs too."""
        archive = getattr(self.transport, "archive", None)
        build = self.hello_info.get("build", "")
        return build if archive is not None and build and build != archive.sha256 else ""

    def stale_agent_cause(self) -> str:
        """Why a failed job may be the board's agent's doing rather than the job's: it ran on
        another build than this host's (e.g. another checkout's agent, busy on a shared
        board), whose code may differ. '' where the builds agree."""
        build = self._other_build()
        if not build:
            return ""
        return (f"the board's agent is another build ({build[:12]}) than this host's "
                f"({self.transport.archive.sha256[:12]}): it was busy when this host "
                "connected, so it ran this job with its own code; run again once it is idle "
                "(this host's agent then replaces it)")

    def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            try:
                session.close()
            except Exception:  # noqa: BLE001 - closing a dead link
                pass
        close = getattr(self.transport, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> "Board":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _reconnected(self) -> AgentSession:
        """The session, connecting again where the link was lost. An error retrying cannot
        fix (the host key CHANGED, authentication refused, a reconnect hook's) is marked
        `reconnecting`: the board was reached before, so a job sent then may still run there
        (run_job names it and the way back)."""
        if self._session is not None or not self._connected_once:
            return self.session()
        try:
            return self.session()
        except (LinkLost, BoardUnreachable, AgentError):
            raise
        except TransportError as exc:
            exc.reconnecting = True
            raise

    def _retrying(self, what: str, action: Callable[[AgentSession], object]):
        deadline: Optional[float] = None
        began, said, causes = 0.0, 0.0, set()
        pause = 0.2
        while True:
            try:
                return action(self._reconnected())
            except (LinkLost, BoardUnreachable) as exc:
                if isinstance(exc, BoardUnreachable) and not self._connected_once:
                    raise  # never reached it at all: no point in retrying for minutes
                self.close()
                now = time.monotonic()
                if deadline is None:
                    began, deadline = now, now + self.reconnect_timeout_s
                if now >= deadline:
                    raise LinkLost(f"{exc} (gave up reconnecting after "
                                   f"{self.reconnect_timeout_s:g} s)") from None
                self.reconnects += 1
                # Each cause once (the link lost, then sshd refusing); then a short line now
                # and then, not the same line at each try (QA: 27 identical lines in the
                # 120 s before it gave up).
                if str(exc) not in causes:
                    causes.add(str(exc))
                    self.on_event(f"{self.name}: {exc}; reconnecting to {what}")
                    said = now
                elif now - said >= still_trying_every_s(self.reconnect_timeout_s):
                    self.on_event(f"{self.name}: still reconnecting to {what} "
                                  f"({now - began:.0f} s so far; gives up in "
                                  f"{deadline - now:.0f} s)")
                    said = now
                time.sleep(pause)
                pause = min(pause * 2, 5.0)

    # -- requests ------------------------------------------------------------------------
    def hello(self) -> dict:
        self._retrying("say hello", lambda s: s.info)
        return self.hello_info

    def sysinfo(self, page_dir: Optional[str] = None) -> dict:
        return self._retrying("read its system info", lambda s: s.sysinfo(page_dir))

    def require_torch(self) -> None:
        if not self.hello().get("torch"):
            raise BoardMissingTorch(f"{self.name} has no torch for its Python "
                                    f"({self.hello_info.get('python')}): "
                                    f"{torch_hint(self.device.hardware.family)}")

    def push_input(self, local: "str | Path") -> str:
        """Send a file (plan, graph) unless the board has it; returns its path on the board,
        named by content so two different plans never collide."""
        local = Path(local)
        remote = f"inputs/{file_sha256(local)[:16]}-{local.name}"
        self._retrying(f"send {local.name}", lambda s: s.put_file(local, remote))
        return remote

    def push_inputs(self, params: dict, inputs: Dict[str, "str | Path"]) -> dict:
        """`params` with each input pushed (params[name] = its path on the board) and, to a
        board that does not share this machine's files, the user's files the job's specs name
        (pushed_files.py): a model file need not be copied to the board by hand."""
        pushed = dict(params)
        for name, local in inputs.items():
            pushed[name] = self.push_input(local)
        if self.device.connection.kind != "local":
            from edge_remat_agent.daemon.pushed_copies import PARAM
            from .pushed_files import user_files
            files = user_files(params, inputs)
            if files:
                pushed[PARAM] = {path: self.push_input(path) for path in files}
        return pushed

    def submit(self, kind: str, params: dict, job_id: Optional[str] = None) -> dict:
        job_id = job_id or new_job_id(kind)
        params = with_torch_device(kind, params, self.device.hardware)
        return self._retrying(f"submit job {job_id}", lambda s: s.submit(kind, params, job_id))

    def job(self, job_id: str) -> dict:
        return self._retrying(f"read job {job_id}", lambda s: s.job(job_id))

    def jobs(self) -> List[dict]:
        return self._retrying("list jobs", lambda s: s.jobs())

    def cancel(self, job_id: str) -> dict:
        return self._retrying(f"cancel job {job_id}", lambda s: s.cancel(job_id))

    def wait(self, job_id: str, on_update: Optional[Callable[[dict], None]] = None,
             timeout_s: Optional[float] = None) -> dict:
        """Until the job is finished or failed, through any number of dropped links.
        on_update(record) each time the record changes, and again with the same record after
        every QUIET_S without a change."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        rev: Optional[int] = None
        restarts: Optional[int] = None
        restarted = False  # started again: said once its new start reports progress
        shown = time.monotonic()
        while True:
            poll = WAIT_POLL_S if deadline is None else max(0.0, min(WAIT_POLL_S,
                                                                   deadline - time.monotonic()))
            record = self._retrying(f"wait for job {job_id}",
                                    lambda s: s.wait(job_id, rev, timeout=poll))
            restarts, restarted = self._note_restart(record, restarts, restarted)
            quiet = time.monotonic() - shown >= QUIET_S
            if on_update is not None and (record.get("rev") != rev or quiet):
                on_update(record)
                shown = time.monotonic()
            rev = record.get("rev")
            if record["state"] in TERMINAL_STATES:
                return record
            if deadline is not None and time.monotonic() >= deadline:
                return record

    def _note_restart(self, record: dict, seen: Optional[int],
                      restarted: bool) -> Tuple[int, bool]:
        """Say so when the job was started again while we waited (the board's daemon was
        stopped mid-job and started again): once its new start has reported progress (the
        daemon drops the old start's), whether it picked up from its newest checkpoint (a run
        job with checkpoints; the progress says resumed_from_step), had trained every step
        before (completed_before_restart: it saves its outputs) or began again. Returns
        the restarts seen and whether that is still to be said."""
        restarts = int(record.get("restarts") or 0)
        restarted = restarted or (seen is not None and restarts > seen)
        progress = record.get("progress")
        if restarted and (progress or record["state"] in TERMINAL_STATES):
            data = (progress or {}).get("data") or {}
            step = data.get("resumed_from_step")
            how = (f"had trained all its steps before (its checkpoint is after step {step}, "
                   "its last): it saves its outputs from that checkpoint without training "
                   "again" if step and data.get("completed_before_restart") else
                   f"resumed from step {step} (its newest checkpoint)" if step else
                   "started again from the beginning (it keeps no checkpoint to pick up from)")
            self.on_event(f"{self.name}: the board's agent daemon restarted mid-job; job "
                          f"{record['id']} {how}")
            restarted = False
        return restarts, restarted

    def fetch_outputs(self, record: dict, dest: "str | Path") -> List[Path]:
        """The files a finished job lists in result["files"], into dest."""
        names = (record.get("result") or {}).get("files") or []
        dest = Path(dest)
        fetched = []
        for name in names:
            if not isinstance(name, str) or "/" in name or name.startswith("."):
                raise TransportError(f"job {record['id']} lists a bad output name {name!r}")
            try:
                fetched.append(self.fetch(f"jobs/{record['id']}/files/{name}", dest / name))
            except OSError as exc:  # this machine's disk (full, say): the board keeps them
                raise _not_fetched(exc, record["id"], dest / name, self.device) from None
        return fetched

    def stat(self, remote: str, with_hash: bool = True) -> dict:
        """Whether a file of the board's workdir exists: exists, size, sha256 (with_hash)."""
        return self._retrying(f"look for {Path(remote).name}",
                              lambda s: s.stat_file(remote, with_hash=with_hash))

    def fetch(self, remote: str, local: "str | Path") -> Path:
        """A file of the board's workdir into `local`, through dropped links: each reconnect
        resumes from what arrived (AgentSession.get_file)."""
        return self._retrying(f"fetch {Path(remote).name}",
                              lambda s: s.get_file(remote, local))

    def run_job(self, kind: str, params: Optional[dict] = None,
                inputs: Optional[Dict[str, "str | Path"]] = None,
                out_dir: "str | Path | None" = None, job_id: Optional[str] = None,
                on_update: Optional[Callable[[dict], None]] = None) -> dict:
        """Push inputs (each becomes params[name] = its path on the board), submit, wait
        through dropped links, fetch the outputs. Raises JobFailed if the job failed."""
        params = self.push_inputs(params or {}, inputs or {})
        job_id = self.last_job = job_id or new_job_id(kind)
        # armed before the first Ctrl-C: its echo, however soon, finds the guard in place
        with echoes_ignored(ECHO_S):
            try:
                record = self.submit(kind, params, job_id)
                record = self.wait(record["id"], on_update)
            except KeyboardInterrupt:
                raise self.interrupted(job_id, out_dir) from None
            except LinkLost as exc:  # reconnecting gave up; the job goes on without us
                raise self.out_of_reach(job_id, exc, out_dir) from None
            except TransportError as exc:
                raise self._lost_on_reconnect(job_id, exc, out_dir) from None
        if record["state"] == "failed":
            raise job_failed(record, f"job {record['id']} ({kind})", self.name,
                             self.stale_agent_cause())
        if out_dir is not None:
            try:
                record["fetched"] = [str(p) for p in self.fetch_outputs(record, out_dir)]
            except LinkLost as exc:
                raise self.out_of_reach(job_id, exc, out_dir) from None
            except TransportError as exc:
                raise self._lost_on_reconnect(job_id, exc, out_dir) from None
        return record

    def _lost_on_reconnect(self, job_id: str, exc: TransportError,
                           out_dir: "str | Path | None" = None) -> TransportError:
        """A transport error while job `job_id` was sent, waited on or fetched: where
        reconnecting failed on what retrying cannot fix (`reconnecting`: the host key CHANGED,
        authentication refused, a reconnect hook's error), the job goes on on the board as when
        reconnecting times out: the error's own reason, then the job and the way back
        (JobOutOfReach, so that `run` writes its link_lost report). QA: exit 3 with neither,
        and no report. Any other (the agent's refusal, a bad output name) stays as it is."""
        if not getattr(exc, "reconnecting", False):
            return exc
        return self.out_of_reach(job_id, exc, out_dir, reconnecting=True)

    def come_back(self, job_id: str, out_dir: "str | Path | None" = None) -> str:
        """The commands that come back for a job this command no longer waits on."""
        device = device_options(self.device)
        fetch = f" --out {shlex.quote(str(out_dir))}" if out_dir is not None else ""
        return (f"`edge-remat job-status {job_id} --device {device} --wait{fetch}` comes back "
                f"for it, `edge-remat job-cancel {job_id} --device {device}` stops it")

    def out_of_reach(self, job_id: str, lost: TransportError,
                     out_dir: "str | Path | None" = None,
                     reconnecting: bool = False) -> JobOutOfReach:
        """Giving up on the link while job `job_id` ran: the job may go on (the board keeps
        it), so the error names it and the way back, as Ctrl-C with --keep-running does.
        `reconnecting`: `lost` is why a reconnect failed (its remedy first), not a timeout."""
        when = (f" (reconnecting after the link to {self.name} dropped)" if reconnecting
                else "")
        fixed = "once that is fixed, " if reconnecting else ""
        return JobOutOfReach(f"{lost}{when}; job {job_id} may still run on {self.name}: "
                             + fixed + self.come_back(job_id, out_dir), job=job_id)

    @contextlib.contextmanager
    def cancelled_on_interrupt(self, why: str):
        """Within it Ctrl-C cancels the job even with --keep-running, and the line says `why`:
        the job needs something that ends with this command. Yields whether it was asked to
        keep running."""
        asked = self.keep_running
        self.keep_running, self.not_kept = False, why if asked else None
        try:
            yield asked
        finally:
            self.keep_running, self.not_kept = asked, None

    def interrupted(self, job_id: str, out_dir: "str | Path | None" = None) -> Interrupted:
        """What the Ctrl-C just caught while waiting on `job_id` did: the job cancelled (and
        waited out for a few seconds, so that nothing queues behind it), or left running with
        the way back. run_job's echo guard is still in place: the first Ctrl-C's echo does
        not cut the cancelling short, a second Ctrl-C does."""
        again = self.come_back(job_id, out_dir)
        stop = f"interrupted ({stopped_by()})"  # Ctrl-C, or SIGTERM as Ctrl-C
        if not self._connected_once:  # still connecting: no job was sent, nothing to cancel
            # (QA: `job` cancelled over the link it had not made yet, up to 10 s more)
            return Interrupted(f"{stop} while connecting to {self.name}, before job {job_id} "
                               "was sent; nothing runs there", job=job_id, cancelled=True)
        if self.keep_running:
            return Interrupted(f"{stop}; job {job_id} keeps running on {self.name}: "
                               + again, job=job_id, cancelled=False)
        self.reconnect_timeout_s = min(self.reconnect_timeout_s, CANCEL_RECONNECT_S)
        # Cancelling waits for the board (seconds over a slow link): say so at once, and what
        # a second Ctrl-C does.
        self.on_event(f"{self.name}: cancelling job {job_id} (up to {CANCEL_WAIT_S:g} s; "
                      "Ctrl-C again leaves it running)")
        try:
            record = self.cancel(job_id)
            if record["state"] not in TERMINAL_STATES:
                record = self.wait(job_id, timeout_s=CANCEL_WAIT_S)
        except AgentError as exc:
            if exc.code == "unknown_job":
                return Interrupted(f"{stop} before job {job_id} reached {self.name}; "
                                   "nothing runs there", job=job_id, cancelled=True)
            return Interrupted(f"{stop}; could not cancel job {job_id} on {self.name} "
                               f"({exc}): " + again, job=job_id, cancelled=False)
        except (TransportError, KeyboardInterrupt) as exc:
            why = "interrupted again" if isinstance(exc, KeyboardInterrupt) else str(exc)
            return Interrupted(f"{stop}; could not cancel job {job_id} on {self.name} "
                               f"({why}): " + again, job=job_id, cancelled=False)
        state = "cancelled" if record["state"] in TERMINAL_STATES else "asked to cancel"
        why = f" ({self.not_kept})" if self.not_kept else ""
        return Interrupted(f"{stop}; {state} job {job_id} on {self.name}{why}", job=job_id,
                           cancelled=True, **last_step(record))

    def stop_agent(self, if_idle: bool = False) -> None:
        self.session().stop(if_idle=if_idle)
        self.close()


@contextlib.contextmanager
def echoes_ignored(window_s: float):
    """The first SIGINT interrupts as usual; one within `window_s` of it is ignored (the
    first one's echo); a later one is a second Ctrl-C and interrupts as usual. So is SIGTERM
    where it interrupts as Ctrl-C does (sigterm_as_ctrl_c): `timeout -s TERM` echoes it the
    same way. Outside the main thread, signals are not ours."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    first: list = [None]

    def handler(signum, frame):
        now = time.monotonic()
        if first[0] is not None and now - first[0] <= window_s:
            return  # the echo
        if first[0] is None:
            first[0] = now
        interrupt = previous.get(signum)  # sigterm_as_ctrl_c's notes which signal it was
        if callable(interrupt):
            interrupt(signum, frame)
        raise KeyboardInterrupt
    # SIGINT only where it is not ignored: a shell without job control starts a script's
    # `cmd &` with it ignored, so that Ctrl-C at the terminal leaves the command running, as
    # it does while connecting (QA: the wait alone took it); SIGTERM stops it either way
    signums = ([signal.SIGINT] if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN
               else []) + ([signal.SIGTERM] if callable(signal.getsignal(signal.SIGTERM))
                           else [])
    previous = {signum: signal.signal(signum, handler) for signum in signums}
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, signal.default_int_handler if old is None else old)


def new_job_id(kind: str) -> str:
    return f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


def summary(record: dict) -> str:
    progress = record.get("progress") or {}
    fraction = progress.get("fraction")
    done = f" {fraction * 100:.0f}%" if isinstance(fraction, (int, float)) else ""
    message = f" {progress.get('message')}" if progress.get("message") else ""
    state = as_reported(record)["state"]  # the host's word: cancelled, bad_input
    return f"job {record['id']} {state}{done}{message}"


def dumps(record: dict) -> str:
    return json.dumps(record, indent=1, default=str)


__all__ = ["Board", "make_transport", "summary", "build_agent_archive"]


def device_options(device) -> str:
    """`--device` as a command a message names reaches this board again: as it finds the
    config, and an emulated board's limit beside it (its agent is its own)."""
    from ..devices import device_argument
    from .emulated import is_emulated_board
    options = device_argument(device)
    if is_emulated_board(device):
        options += f" --memory-limit {device.hardware.memory_limit_bytes}"
    return options


def _not_fetched(exc: OSError, job: str, local: Path, device) -> OSError:
    """The error of a job's output that could not be written here, naming the file and how
    to fetch the job's outputs again (QA: a full disk said only 'No space left on device',
    with its .part left behind)."""
    local.with_name(local.name + ".part").unlink(missing_ok=True)
    again = f"edge-remat job-status {job} --device {device_options(device)} --out {local.parent}"
    return OSError(exc.errno, f"{exc.strerror or exc}; job {job}'s outputs stay on the board: "
                   f"make room, then fetch them with `{again}`", str(local))


def last_step(record: dict) -> dict:
    """{"last_step": ...}: a training job's last step as its progress said it (step, loss,
    time, peaks), for the report of a run stopped before its end; {} where it said none."""
    data = (record.get("progress") or {}).get("data") or {}
    return {"last_step": data} if "step" in data else {}
