"""The job process: runs one job's function, apart from the daemon.

A job runs in its own process so that what kills it (the out-of-memory killer, a segfault in a
native library) does not kill the daemon, which then records why the job died; and so that a
daemon restarted mid-job finds its job still running and adopts it instead of starting over.
The process holds an exclusive flock on running.lock for its whole life: that is how a daemon
tells a live job process from a dead one without being its parent.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import signal
import traceback
from pathlib import Path

from .layout import Layout
from .registry import InputRefused, JobCancelled, JobContext, get_kind
from .store import read_json, write_json_atomic

ALREADY_RUNNING = 3


def lock_is_held(lock_path: Path) -> bool:
    """True while some job process holds this job's running.lock."""
    try:
        fd = os.open(lock_path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        return exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
    finally:
        os.close(fd)  # also releases the lock if we just took it
    return False


def run_job_process(layout: Layout, job_id: str) -> int:
    job_dir = layout.job_dir(job_id)
    lock_fd = os.open(job_dir / "running.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return ALREADY_RUNNING
    os.ftruncate(lock_fd, 0)
    os.write(lock_fd, str(os.getpid()).encode())

    record = read_json(job_dir / "job.json") or {}
    from ..capture.kept import FOLDER_VARIABLE
    os.environ.setdefault(FOLDER_VARIABLE, str(layout.captures_dir))  # for its capture's child
    ctx = JobContext(job_id, job_dir, layout.root,
                     progress_sink=lambda p: write_json_atomic(job_dir / "progress.json", p))

    in_job = [False]

    def on_term(signum, frame):
        # The daemon asks nicely first (SIGKILL after STOP_GRACE_S): stop here, wherever the
        # job is. Jobs check ctx.cancelled only between steps or nodes, so a capture, the
        # profile's flash, power and footprint passes or a long step outlasted the grace
        # and were killed (their page probes left behind). Raised once: not again into the
        # clean-up the first one runs, nor into the outcome written after the job.
        first, ctx.cancelled = not ctx.cancelled, True
        if first and in_job[0]:
            raise JobCancelled()

    signal.signal(signal.SIGTERM, on_term)
    try:
        kind = get_kind(str(record.get("kind")))
        if kind is None:
            raise LookupError(f"this agent has no job kind {record.get('kind')!r}")
        params = dict(record.get("params") or {})
        from .pushed_copies import PARAM, use_pushed_copies_param
        use_pushed_copies_param(ctx, params.pop(PARAM, None))
        in_job[0] = True
        try:
            result = kind.function()(ctx, params)
        finally:
            in_job[0] = False
        json.dumps(result)  # a result that cannot be sent is the job's bug: say so here
        outcome = {"ok": True, "result": result}
    except BaseException as exc:  # noqa: BLE001 - every failure is reported, none crashes us
        if isinstance(exc, JobCancelled) or ctx.cancelled:
            # after a cancel, whatever the job made of the JobCancelled raised into it
            outcome = {"ok": False, "cancelled": True, "error": "cancelled"}
        elif isinstance(exc, InputRefused):  # bad input (the host's exit 2), in its own words
            outcome = {"ok": False, "error": str(exc), "bad_input": True,
                       "traceback": traceback.format_exc(limit=20)}
        else:
            outcome = {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                       "traceback": traceback.format_exc(limit=20)}
    ctx.flush()
    write_json_atomic(job_dir / "outcome.json", outcome)
    return 0
