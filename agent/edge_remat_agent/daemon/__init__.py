"""The agent daemon: serves the wire protocol, runs jobs one after another in job processes,
and persists every job so a host that lost its link can come back for the result.

    layout.py        where things live in the agent's workdir
    registry.py      register_job(kind, "module:function") and the JobContext jobs get
    builtin_jobs.py  sysinfo, echo, sleep, torch-check
    store.py         job records on disk
    worker.py        the queue: job processes, adoption after a daemon restart, stop/cancel
    runner.py        the job process itself
    files.py         chunked, resumable, hash-checked file transfer
    server.py        the daemon: Unix socket + optional loopback TCP, request handlers
    launcher.py      the stdio and serial front ends that relay to the daemon
"""

from .registry import JobCancelled, JobContext, register_job

__all__ = ["JobCancelled", "JobContext", "register_job"]
