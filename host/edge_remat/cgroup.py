"""An emulated board: a memory cgroup with a hard limit that the kernel enforces.

Whatever the machine has is used: cgroup v2 (`memory.max`, `memory.peak`, `memory.events`) when
its unified hierarchy has the memory controller, else cgroup v1 (`memory.limit_in_bytes`,
`memory.max_usage_in_bytes`, `memory.oom_control`). Swap is switched off inside the group where
the kernel offers the knob, so the limit is RAM, as on a board without swap.

    group = MemoryCgroup.ensure("emulated-board", 600 * 2**20)
    subprocess.Popen(group.exec_prefix() + ["python", "train.py"])   # joins before it execs
    ...
    group.peak_bytes(), group.oom_kills()     # the kernel's own figures
    group.remove()                            # kills what is left, then deletes the group

Creating groups needs root (or a delegated subtree); `unavailable_reason()` says why not, in
one line, so that callers and tests can skip with that reason.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from edge_remat_agent.cgroup_memory import PEAK_FILE

PARENT = "edge-remat"  # every group we make lives under this one
MOUNTINFO = "/proc/self/mountinfo"


class CgroupUnavailable(RuntimeError):
    """No memory cgroup can be made here; the message says why and what would fix it."""


class CgroupInUse(CgroupUnavailable):
    """The group exists, with processes in it, under another limit than the one asked for."""

    def __init__(self, limit_bytes: int):
        super().__init__(f"its processes run under a limit of {limit_bytes} bytes")
        self.limit_bytes = limit_bytes


def find_memory_hierarchy(mountinfo: str = MOUNTINFO) -> tuple[int, Path]:
    """(version, mount point) of the hierarchy that holds the memory controller."""
    v1, v2 = None, None
    try:
        lines = Path(mountinfo).read_text().splitlines()
    except OSError as exc:
        raise CgroupUnavailable(f"cannot read {mountinfo}: {exc.strerror} (not Linux?)") from None
    for line in lines:
        # id parent major:minor root mountpoint options [optional...] - fstype source superopts
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        mount, fstype, options = Path(fields[4]), tail[0], tail[2].split(",")
        if fstype == "cgroup2" and v2 is None:
            controllers = _read(mount / "cgroup.controllers") or ""
            if "memory" in controllers.split():
                v2 = mount
        elif fstype == "cgroup" and "memory" in options and v1 is None:
            v1 = mount
    if v2 is not None:
        return 2, v2
    if v1 is not None:
        return 1, v1
    raise CgroupUnavailable("this kernel has no memory cgroup mounted (neither a cgroup2 "
                            "hierarchy with the memory controller nor a v1 'memory' hierarchy)")


def unavailable_reason() -> str | None:
    """None where a memory cgroup can be created here, else why not (one line)."""
    try:
        version, mount = find_memory_hierarchy()
    except CgroupUnavailable as exc:
        return str(exc)
    parent = mount / PARENT
    target = parent if parent.is_dir() else mount
    if not os.access(target, os.W_OK):
        return (f"cannot create memory cgroups under {target} (cgroup v{version}): run as root "
                "or delegate that subtree to this user")
    return None


@dataclass
class MemoryCgroup:
    path: Path
    version: int

    # -- making and finding ------------------------------------------------------------------
    @classmethod
    def ensure(cls, name: str, limit_bytes: int) -> "MemoryCgroup":
        """The group `name` with this hard limit, created if missing. An empty group gets a
        fresh peak reading, so each run reports its own."""
        if not name or "/" in name or name.startswith("."):
            raise ValueError(f"bad cgroup name {name!r}")
        version, mount = find_memory_hierarchy()
        parent = mount / PARENT
        try:
            if version == 2:
                _enable_memory(mount)
                parent.mkdir(exist_ok=True)
                _enable_memory(parent)
            else:
                parent.mkdir(exist_ok=True)
            group = cls(parent / name, version)
            if group.path.is_dir() and not group.pids():
                group.path.rmdir()  # an empty leftover: start afresh (a new peak)
            elif group.path.is_dir() and abs((held := group.limit_bytes()) - int(limit_bytes)) \
                    >= os.sysconf("SC_PAGE_SIZE"):
                # its processes (an agent, maybe a job) live under the limit they started
                # with: `job-status --memory-limit` with another one lowered it under a
                # running job, which the kernel then killed (QA)
                raise CgroupInUse(held)
            group.path.mkdir(exist_ok=True)
            group.set_limit(limit_bytes)
        except PermissionError as exc:
            raise CgroupUnavailable(f"cannot create a memory cgroup under {parent}: "
                                    f"{exc.strerror} (run as root)") from None
        except OSError as exc:
            raise CgroupUnavailable(f"cannot set up memory cgroup {parent / name}: "
                                    f"{exc.strerror}") from None
        return group

    @classmethod
    def existing(cls, name: str) -> "MemoryCgroup | None":
        version, mount = find_memory_hierarchy()
        path = mount / PARENT / name
        return cls(path, version) if path.is_dir() else None

    # -- limit and membership ----------------------------------------------------------------
    def set_limit(self, limit_bytes: int) -> None:
        limit_bytes = int(limit_bytes)
        if self.version == 2:
            self._write("memory.max", limit_bytes)
            if (self.path / "memory.swap.max").exists():
                self._write("memory.swap.max", 0)
            return
        # v1: memory+swap may never be below memory, so the order depends on the direction.
        memsw = self.path / "memory.memsw.limit_in_bytes"
        if memsw.exists() and limit_bytes > self.limit_bytes():
            self._write("memory.memsw.limit_in_bytes", limit_bytes)
        self._write("memory.limit_in_bytes", limit_bytes)
        if memsw.exists():
            self._write("memory.memsw.limit_in_bytes", limit_bytes)

    def limit_bytes(self) -> int:
        text = _read(self.path / ("memory.max" if self.version == 2 else
                                  "memory.limit_in_bytes")) or "max"
        return 1 << 62 if text == "max" else int(text)

    def add(self, pid: int) -> None:
        self._write("cgroup.procs", pid)

    def exec_prefix(self) -> list[str]:
        """argv that puts a command in this group before it starts (so is every child)."""
        return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(self.path / "cgroup.procs")]

    def pids(self) -> list[int]:
        text = _read(self.path / "cgroup.procs") or ""
        return [int(p) for p in text.split()]

    def holds(self, pid: int) -> bool:
        return pid in self.pids()

    # -- the kernel's figures ----------------------------------------------------------------
    def usage_bytes(self) -> int | None:
        return _int(_read(self.path / ("memory.current" if self.version == 2 else
                                       "memory.usage_in_bytes")))

    def peak_bytes(self) -> int | None:
        """The group's high-water mark since it was made (v2 kernels before 5.19: None)."""
        return _int(_read(self.path / PEAK_FILE[self.version]))

    def reset_peak(self) -> bool:
        """Restart the high-water mark from the current usage, where the kernel can (v1)."""
        if self.version == 1:
            try:
                self._write("memory.max_usage_in_bytes", 0)
                return True
            except OSError:
                return False
        return False

    def oom_kills(self) -> int:
        """Processes the kernel killed for exceeding this group's limit, so far."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        for line in (_read(self.path / name) or "").splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    # -- cleaning up -------------------------------------------------------------------------
    def kill_all(self, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)

    def remove(self) -> None:
        """Kill what still runs inside, then delete the group (charges move to the parent)."""
        if not self.path.is_dir():
            return
        self.kill_all()
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.05)  # the last exits are still being reaped

    def remove_if_empty(self, wait_s: float = 0.0) -> bool:
        """Delete the group once nothing runs inside, waiting up to `wait_s` for processes on
        their way out; never kills (the kernel refuses to delete a group that holds one).
        Whether the group is gone."""
        deadline = time.monotonic() + wait_s
        while self.path.is_dir():
            if not self.pids():
                try:
                    self.path.rmdir()
                    return True
                except OSError:
                    pass  # one joined, or the last exit is still being reaped
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def _write(self, name: str, value) -> None:
        with open(self.path / name, "w") as handle:
            handle.write(str(value))


def _enable_memory(directory: Path) -> None:
    """v2: let `directory`'s children have their own memory limits."""
    control = directory / "cgroup.subtree_control"
    if "memory" not in (_read(control) or "").split():
        try:
            with open(control, "w") as handle:
                handle.write("+memory")
        except OSError as exc:
            raise CgroupUnavailable(f"cannot enable the memory controller in {control}: "
                                    f"{exc.strerror} (a cgroup v2 group that holds processes "
                                    "cannot delegate controllers to children)") from None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _int(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() else None
