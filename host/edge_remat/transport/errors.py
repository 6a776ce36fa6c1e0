"""Transport errors: each one line, saying what went wrong and what to do about it."""

from __future__ import annotations


class TransportError(RuntimeError):
    """Cannot talk to the board (the message is the whole story, one line)."""


class LinkLost(TransportError):
    """The link dropped or stopped answering; reconnecting may help (and is tried)."""


class HostKeyUnknown(TransportError):
    pass


class HostKeyChanged(TransportError):
    pass


class AuthRefused(TransportError):
    pass


class BoardUnreachable(TransportError):
    pass


class SshConfigError(TransportError):
    """~/.ssh/config (or the device's ssh_config) cannot be read: bad input, exit 2."""


class BoardMissingPython(TransportError):
    pass


class BoardMissingTorch(TransportError):
    pass


class BoardOutOfDisk(TransportError):
    pass


class AgentError(TransportError):
    """The agent refused a request (its own message, with the board's name)."""

    def __init__(self, message: str, code: str = "", details: "dict | None" = None):
        self.code = code
        self.details = details or {}
        super().__init__(message)


class JobOutOfReach(LinkLost):
    """The link to the board died while our job ran there, and reconnecting gave up: the job
    may go on; `job` is its id, for `job-status` and `job-cancel` to come back."""

    def __init__(self, message: str, job: str):
        self.job = job
        super().__init__(message)


class JobFailed(TransportError):
    def __init__(self, message: str, record: dict):
        self.record = record
        super().__init__(message)


def cancelled_by_host(record: dict) -> bool:
    """Whether a failed job is one the host cancelled (job-cancel, a Ctrl-C): the agent records
    it as failed, its error beginning "cancelled by the host"."""
    from edge_remat_agent.daemon.worker import CANCELLED  # light, but not needed at start-up
    return record.get("state") == "failed" and str(record.get("error") or "").startswith(
        CANCELLED)


def refused_as_bad_input(record: dict) -> bool:
    """Whether a failed job is one whose input the board refused (a param, or what it names:
    InputRefused), which the agent records as failed with `bad_input`; nothing ran."""
    return record.get("state") == "failed" and bool(record.get("bad_input"))


def killed_out_of_memory(record: dict) -> bool:
    """Whether a failed job ran out of memory: killed by the board's out-of-memory killer (a
    SIGKILL the agent did not find came from elsewhere) or the executor's OutOfMemory, as
    its error says (errors.killed_by_memory: the exit status 4 reads it too)."""
    from ..errors import killed_by_memory
    return record.get("state") == "failed" and killed_by_memory(str(record.get("error")))


def as_reported(record: dict) -> dict:
    """A job's record as the host's commands print it, the one mapping of the agent's states
    to the host's: a job the host cancelled is in state "cancelled", one whose input the
    board refused "bad_input", one that ran out of memory (the memory limit, the board's
    out-of-memory killer) "killed", as its status and every line say (the agent keeps all
    three as "failed": its error "cancelled by the host", its `bad_input` flag, its error
    "killed by SIGKILL (the kernel's out-of-memory killer ran meanwhile)"); `board_state`
    keeps the board's word. QA: a cancelled `deploy --json` said "status": "cancelled" beside
    a job record whose state was "failed"; a refused param's said "status": "failed", exit 2,
    beside a record saying `bad_input`; an out-of-memory kill's `job-status ID --json` said
    "status": "killed", exit 4, beside a record and a list saying "failed"."""
    state = ("cancelled" if cancelled_by_host(record)
             else "bad_input" if refused_as_bad_input(record)
             else "killed" if killed_out_of_memory(record) else record.get("state"))
    if state == record.get("state"):
        return record
    return {**record, "state": state, "board_state": record.get("state")}


# What a cancelled job's error says to do; where its run left a checkpoint, --resume instead
# (run/resume.py with_resume_hint)
RUN_AGAIN = "run it again to have its results"


def job_failed(record: dict, job: str, board: str, cause: str = "") -> JobFailed:
    """The error for a job that ended failed (`job`: "job ID" or "job ID (kind)"); one the host
    cancelled says so (classify gives it exit status 130, interrupted, not 1). `cause`: what
    the host knows first (the board's agent is another build), said before the board's error,
    whose own remedy may point elsewhere."""
    if cancelled_by_host(record):
        return JobFailed(f"{job} on {board} was {record['error']}: it did not finish; "
                         f"{RUN_AGAIN}", record)
    if killed_out_of_memory(record) and not cause:
        return JobFailed(f"{job} was killed on {board}: it ran out of memory: "
                         f"{record.get('error')}", record)
    if cause:
        return JobFailed(f"{job} failed on {board}: {cause}; the board said: "
                         f"{record.get('error')}", record)
    return JobFailed(f"{job} failed on {board}: {record.get('error')}", record)


# Retrying cannot fix these: a reconnect loop gives up on them at once.
FATAL = (HostKeyUnknown, HostKeyChanged, AuthRefused, BoardMissingPython, BoardMissingTorch,
         BoardOutOfDisk, SshConfigError)
