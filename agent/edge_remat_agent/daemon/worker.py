"""Runs queued jobs one after another, each in its own job process, and keeps records true.

- A finished job process leaves outcome.json; its absence means the process died, and the
  exit status says how (signal 9 is usually the out-of-memory killer).
- A job process that outlived a previous daemon (killed, crashed) is adopted: the worker waits
  for its running.lock to be released and then reads its outcome, so the job is not run twice.
- A job interrupted by stopping the daemon (or whose process died with a killed daemon) is
  queued again and started again when the daemon next starts: from the beginning, unless it
  keeps checkpoints in its folder and picks up from them (a run job submitted with
  checkpoint_every, the test job `sleep`), which its first progress then says
  (resumed_from_step): the old start's progress is dropped so the host reads the new one's.
  The job's report is the job's to merge (a run job's checkpoint keeps its earlier steps).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable, List, Optional

from .layout import Layout
from .oom import group_memory_at_kill, group_memory_limit, oom_killer_ran, oom_kills
from .runner import ALREADY_RUNNING, lock_is_held
from .store import JobStore, read_json

_log = logging.getLogger(__name__)
POLL_S = 0.1
STOP_GRACE_S = 5.0
MAX_RESTARTS = 3
# phrases of a SIGKILL's description that the host reads (errors.killed_by_memory)
NOT_OOM = "not by the out-of-memory killer"
OOM_RAN = "the kernel's out-of-memory killer ran meanwhile"
# how a job the host cancelled begins its error (state failed); the host reads it
# (transport.errors.cancelled_by_host) to say "cancelled", exit status 130
CANCELLED = "cancelled by the host"


def describe_exit(status: Optional[int], oom_killer_ran: Optional[bool] = None) -> str:
    """How a job process that left no outcome ended. `oom_killer_ran`: whether the kernel
    counted an out-of-memory kill while it ran (None: unknown); the host reads a SIGKILL as
    running out of memory unless this says it was not."""
    if status is None:
        return "it ended while no daemon was watching"
    if status < 0:
        try:
            name = signal.Signals(-status).name
        except ValueError:
            name = f"signal {-status}"
        if -status != signal.SIGKILL:
            return f"it was killed by {name}"
        if oom_killer_ran is None:
            return f"it was killed by {name} (the out-of-memory killer?)"
        if oom_killer_ran:
            return f"it was killed by {name} ({OOM_RAN})"
        return (f"it was killed by {name}, {NOT_OOM}: the kernel counted no out-of-memory "
                "kill while it ran, so a person or a program on the board killed it")
    return f"it exited with status {status} without a result"


class Worker:
    def __init__(self, store: JobStore, layout: Layout, job_command: List[str],
                 lock: threading.Condition, on_change: Callable[[], None]):
        self.store = store
        self.layout = layout
        self.job_command = job_command
        self.cond = lock  # the daemon's condition: guards the store
        self.on_change = on_change
        self.stopping = False
        self.current: Optional[dict] = None
        self._proc: Optional[subprocess.Popen] = None
        self._cancel_requested = False
        self._thread = threading.Thread(target=self._loop, name="job-worker", daemon=True)

    def start(self) -> None:
        with self.cond:
            self._recover()
        self._thread.start()

    def busy(self) -> bool:
        with self.cond:
            return self.current is not None or self.store.next_queued() is not None

    def cancel(self, record: dict) -> None:
        """Called with cond held."""
        if record["state"] == "queued":
            self.store.update(record, state="failed", error=CANCELLED,
                              finished_s=time.time())
            self.on_change()
        elif record["state"] == "running" and record is self.current:
            self._cancel_requested = True
            self._signal(signal.SIGTERM)

    def stop(self, timeout: float = STOP_GRACE_S + 5) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
            if self.current is not None:
                self._signal(signal.SIGTERM)
        self._thread.join(timeout)

    # -- internals -------------------------------------------------------------------------
    def _signal(self, signum: int) -> None:
        if self.current is None:
            return
        if self._proc is not None and self._proc.poll() is None:
            pid: Optional[int] = self._proc.pid
        else:
            # An adopted job process: it wrote its pid into the lock it still holds.
            lock = self.layout.job_dir(self.current["id"]) / "running.lock"
            pid = _read_pid(lock) if lock_is_held(lock) else None
        if pid:
            try:
                os.kill(int(pid), signum)
            except (OSError, ValueError):
                pass

    def _recover(self) -> None:
        """Records left 'running' by a daemon that did not stop cleanly."""
        for record in self.store.in_state("running"):
            job_dir = self.layout.job_dir(record["id"])
            if lock_is_held(job_dir / "running.lock"):
                record["_adopt"] = True  # still alive: the loop below waits for it
                continue
            if (job_dir / "outcome.json").exists():
                self._finish(record, None)
            else:
                self._requeue(record, "the agent stopped while it ran")

    def _loop(self) -> None:
        while True:
            with self.cond:
                while not self.stopping:
                    record = self._next()
                    if record is not None:
                        break
                    self.cond.wait()
                if self.stopping:
                    return
                self.current = record
                self._cancel_requested = False
            try:
                self._run(record)
            except Exception:  # noqa: BLE001 - never let one job take the worker down
                _log.exception("worker failed on job %s", record["id"])
                with self.cond:
                    self.store.update(record, state="failed", finished_s=time.time(),
                                      error="internal error in the agent (see daemon.log)")
            finally:
                with self.cond:
                    self.current = None
                    self._proc = None
                    self.on_change()

    def _next(self) -> Optional[dict]:
        for record in self.store.in_state("running"):
            if record.get("_adopt"):
                return record
        return self.store.next_queued()

    def _run(self, record: dict) -> None:
        job_dir = self.layout.job_dir(record["id"])
        if not record.pop("_adopt", False):
            if self.stopping:
                return  # stays queued for the next start
            outcome = job_dir / "outcome.json"
            if outcome.exists():
                outcome.unlink()
            with open(job_dir / "log.txt", "ab") as log:
                self._proc = subprocess.Popen(
                    self.job_command + ["_run-job", "--workdir", str(self.layout.root),
                                        "--job", record["id"]],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=str(self.layout.root),
                    start_new_session=True)  # a Ctrl-C meant for the daemon is not for the job
            with self.cond:
                self.store.update(record, state="running", pid=self._proc.pid,
                                  started_s=record.get("started_s") or time.time(),
                                  oom_kills_at_start=oom_kills())
                self.on_change()
        status = self._watch(record)
        if status == ALREADY_RUNNING:  # an older job process still holds the job: adopt it
            status = self._watch(dict(record, pid=None), adopt=True)
        with self.cond:
            self._finish(record, status)
            self.on_change()

    def _watch(self, record: dict, adopt: bool = False) -> Optional[int]:
        job_dir = self.layout.job_dir(record["id"])
        progress_path = job_dir / "progress.json"
        last_mtime = 0.0
        killed_at: Optional[float] = None
        proc = None if adopt else self._proc
        while True:
            if proc is not None:
                status = proc.poll()
                if status is not None:
                    break
            elif not lock_is_held(job_dir / "running.lock"):
                status = None
                break
            try:
                mtime = progress_path.stat().st_mtime
            except OSError:
                mtime = last_mtime
            if mtime != last_mtime:
                last_mtime = mtime
                progress = read_json(progress_path)
                if progress is not None:
                    with self.cond:
                        record["progress"] = progress
                        record["rev"] = int(record.get("rev", 0)) + 1
                        self.on_change()
            if (self.stopping or self._cancel_requested) and killed_at is None:
                killed_at = time.monotonic()
                self._signal(signal.SIGTERM)  # again: it may have started after stop() asked
            if killed_at is not None and time.monotonic() - killed_at > STOP_GRACE_S:
                self._signal(signal.SIGKILL)  # it ignored SIGTERM
            time.sleep(POLL_S)
        return status

    def _finish(self, record: dict, status: Optional[int]) -> None:
        """Called with cond held, once the job process is gone."""
        job_dir = self.layout.job_dir(record["id"])
        record.pop("_adopt", None)
        gone = _vanished(job_dir, self.layout.root)
        if gone is not None:  # its outcome went with it: say what happened, not "internal error"
            self.store.update(record, state="failed", finished_s=time.time(), pid=None,
                              error=f"the job's working directory {gone} vanished while it "
                                    "ran (removed on the board), and its files and outcome "
                                    "with it; submit the job again")
            return
        progress = read_json(job_dir / "progress.json")
        if progress is not None:
            record["progress"] = progress
        outcome = read_json(job_dir / "outcome.json")
        if self.stopping and (outcome is None or outcome.get("cancelled")):
            self._requeue(record, "interrupted when the agent stopped")
            return
        now = time.time()
        if outcome is None and self._cancel_requested:
            # the cancel's own signal ended it before it could write its outcome
            self.store.update(record, state="failed", finished_s=now, pid=None,
                              error=CANCELLED + (
                                  f" (killed after it ignored SIGTERM for {STOP_GRACE_S:g} s)"
                                  if status == -signal.SIGKILL else ""))
        elif outcome is None:
            # killed: the group's limit and high-water mark, which the job can no longer say
            group = group_memory_at_kill() if status == -signal.SIGKILL else {}
            self.store.update(record, state="failed", finished_s=now, pid=None,
                              error="the job process died: " + describe_exit(
                                  status, oom_killer_ran(record.get("oom_kills_at_start"),
                                                         oom_kills()))
                                    + _log_tail(job_dir / "log.txt"), **group)
        elif outcome.get("ok"):
            self.store.update(record, state="finished", finished_s=now, pid=None,
                              result=outcome.get("result"), error=None, **group_memory_limit())
        elif outcome.get("cancelled"):
            self.store.update(record, state="failed", finished_s=now, pid=None,
                              error=CANCELLED)
        else:
            self.store.update(record, state="failed", finished_s=now, pid=None,
                              error=str(outcome.get("error")),
                              traceback=outcome.get("traceback"),
                              **({"bad_input": True} if outcome.get("bad_input") else {}))

    def _requeue(self, record: dict, why: str) -> None:
        restarts = int(record.get("restarts", 0)) + 1
        if restarts > MAX_RESTARTS:
            self.store.update(record, state="failed", finished_s=time.time(), pid=None,
                              error=f"{why}, {restarts} times; giving up")
            return
        (self.layout.job_dir(record["id"]) / "progress.json").unlink(missing_ok=True)
        self.store.update(record, state="queued", pid=None, restarts=restarts, progress=None,
                          note=f"{why}; it starts again, from its newest checkpoint where it "
                               "keeps them, else from the beginning")


def _vanished(job_dir: Path, root: Path) -> Optional[Path]:
    """The folder of the job's that is gone, the agent's whole workdir where that is, or None
    where the job's folder is still there."""
    if job_dir.is_dir():
        return None
    return root if not root.is_dir() else job_dir


def _log_tail(path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    tail = " | ".join(line.strip() for line in text[-lines:] if line.strip())
    return f"; its log ends: {tail}" if tail else ""


def _read_pid(path) -> Optional[int]:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None
