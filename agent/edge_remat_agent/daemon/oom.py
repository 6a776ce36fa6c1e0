"""Whether the kernel's out-of-memory killer ran: a job process killed by SIGKILL is usually
its victim, but not always (someone's `kill -9`, a supervisor), and the report should say
which rather than guess."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

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
