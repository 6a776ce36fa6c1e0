"""Whether the kernel's out-of-memory killer ran: a job process killed by SIGKILL is usually
its victim, but not always (someone's `kill -9`, a supervisor), and the report should say
which rather than guess."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from ..cgroup_memory import cgroup_memory_limit_bytes, cgroup_memory_peak

VMSTAT = Path("/proc/vmstat")


def oom_kills(vmstat: Path = VMSTAT) -> Optional[int]:
    """The kernel's count of out-of-memory kills since boot, cgroup limits included (Linux
    4.13 on); None where it cannot be read (another OS, a sandbox that hides /proc)."""
    try:
        for line in vmstat.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def oom_killer_ran(before: Optional[int], after: Optional[int]) -> Optional[bool]:
    """Whether an out-of-memory kill happened between two readings (None: unknown)."""
    if before is None or after is None:
        return None
    return after > before


def group_memory_limit(root: str = "/") -> dict:
    """The limit of the board's own memory cgroup (`memory_limit_bytes`), which the job shares,
    for the record of a job that ended, finished or killed: the limit it ran under, which a
    host that holds no group of the board (one over SSH) cannot read. {} where the daemon runs
    in no memory-limited group. QA: a finished run on such a board reported none."""
    limit = cgroup_memory_limit_bytes(root)
    return {} if limit is None else {"memory_limit_bytes": limit}


def group_memory_at_kill(root: str = "/") -> dict:
    """What the board's own memory cgroup says as the daemon finds a job process killed by
    SIGKILL (the job and the daemon share the group: a board's sessions, an emulated board):
    its limit (`memory_limit_bytes`) and its high-water mark (`kernel_peak`: {"bytes",
    "source"}, as a finished run job reports its own: executor/baseline.group_peak); {} where
    the daemon runs in no memory-limited group (an unlimited group is only a unit of
    accounting). The job's own process cannot say them: it was killed. QA: a plain run the
    out-of-memory killer killed on an SSH board in a 600 MiB cgroup reported neither."""
    figures = group_memory_limit(root)
    if not figures:
        return {}
    peak = cgroup_memory_peak(root)
    if peak is not None:
        figures["kernel_peak"] = {
            "bytes": peak[0],
            "source": f"{peak[1]}, its high-water mark when the job was killed, since the "
                      "group began or since a run job's runtime baseline restarted it; read by "
                      "the board's agent: everything in its group"}
    return figures
