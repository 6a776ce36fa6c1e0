"""An emulated board: this machine, with the agent inside a memory cgroup as small as a board.

The relay that LocalTransport starts joins the cgroup before it runs, so the daemon it starts and
every job process that daemon runs are inside it: the kernel enforces the limit on all of them,
kills the largest when they go over, and keeps its own peak reading. The cgroup is named after the
device and its workdir, so two emulated boards (or two test runs) never share one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
from pathlib import Path

from edge_remat_agent.cgroup_memory import PEAK_FILE, RESTARTED_PEAK_SCOPE

from ..cgroup import CgroupInUse, CgroupUnavailable, MemoryCgroup
from ..devices import DeviceConfig, device_argument, find_device
from ..errors import UserError
from ..units import fmt_bytes
from .errors import TransportError
from .local import LocalTransport

# The smallest limit `--memory-limit` gives a board: what its agent (the relay and the daemon,
# no torch) needs to start, with margin: they peaked at 38 MiB here, and at 16 MiB the agent
# died before it answered, a cryptic lost link. Above it, a job too big for the limit is
# killed and said so (exit 4): a run's job takes about 280 MiB before the model's own memory
# (Python and torch: this machine's profile's runtime_baseline_bytes, 231 MiB; a run of the
# 18 MiB mlp peaked at 280 MiB).
MIN_MEMORY_LIMIT_BYTES = 64 * 2**20


def emulated_device(device: DeviceConfig, memory_limit_bytes: int) -> DeviceConfig:
    """`device` (kind local) as an emulated board with this limit. A device that had no limit
    moves to a workdir of its own beside its own (WORKDIR-limited): a daemon already running
    there outside any limit must not be reused, and one shared by every device config (it was
    one fixed folder) let two emulated boards' runs take each other's daemon."""
    if device.connection.kind != "local":
        raise UserError(f"--memory-limit emulates a board on this machine; {device.name} "
                        f"is reached over {device.connection.kind} (its own RAM is its "
                        "limit): use --device local or emulated-board")
    if memory_limit_bytes < MIN_MEMORY_LIMIT_BYTES:
        least = MIN_MEMORY_LIMIT_BYTES // 2**20
        raise UserError(f"--memory-limit {fmt_bytes(memory_limit_bytes)} is below the {least} "
                        "MiB an emulated board's agent needs to start (a run's job needs about "
                        "280 MiB more for Python, torch and the capture, before the model's own "
                        f"memory): give at least {least}MiB (a number without a unit is bytes)")
    if not device.hardware.memory_limit_bytes:
        device = _beside_its_workdir(device, "-limited")
    hardware = dataclasses.replace(device.hardware, memory_limit_bytes=int(memory_limit_bytes))
    return dataclasses.replace(device, hardware=hardware)


def _beside_its_workdir(device: DeviceConfig, suffix: str) -> DeviceConfig:
    """`device` with a workdir of its own, WORKDIR + suffix, and a page folder that lay inside
    the old workdir moved along: a page folder stays a folder of its own board (the shipped
    local board's `pages` in its workdir, whose parent the moved board never creates)."""
    old = device.connection.workdir.rstrip("/")
    new = old + suffix
    connection = dataclasses.replace(device.connection, workdir=new)
    hardware = device.hardware
    page_dir = hardware.page_dir
    if page_dir and (page_dir.rstrip("/") == old or page_dir.startswith(old + "/")):
        hardware = dataclasses.replace(hardware, page_dir=new + page_dir[len(old):])
    return dataclasses.replace(device, connection=connection, hardware=hardware)


def find_board(name: str, memory_limit_bytes: int | None = None) -> DeviceConfig:
    """The device config NAME, or, with a limit, the board `--memory-limit` emulates on it:
    what `run` trains on and what `job-status` / `job-cancel` come back to."""
    device = find_device(name)
    return device if memory_limit_bytes is None else emulated_device(device, memory_limit_bytes)


def unlimited_twin(device: DeviceConfig) -> DeviceConfig:
    """The same machine without the limit (its own workdir): where an emulated board's hardware
    is measured, since measuring may need more memory than the board is given."""
    device = _beside_its_workdir(device, "-unlimited")
    hardware = dataclasses.replace(device.hardware, memory_limit_bytes=None)
    return dataclasses.replace(device, name=f"{device.name}-unlimited", hardware=hardware)


def emulated_twin_hint(device: DeviceConfig, job_id: str) -> str | None:
    """Where job `job_id` is unknown to `device` (local, without a limit of its own) but lies
    in the folder of the board `--memory-limit` emulates on it: how to reach it there (QA:
    job-status without --memory-limit said the job may have been pruned). None elsewhere."""
    if device.connection.kind != "local" or device.hardware.memory_limit_bytes:
        return None
    twin = _beside_its_workdir(device, "-limited")
    if not (Path(os.path.expanduser(twin.connection.workdir)) / "jobs" / job_id).is_dir():
        return None
    try:  # its agent's cgroup, while it runs, holds the limit to give
        group = MemoryCgroup.existing(cgroup_name(twin))
        limit = group.limit_bytes() if group is not None else None
    except (CgroupUnavailable, OSError, ValueError):
        limit = None
    given = f"--memory-limit {limit_argument(limit)}" if limit and limit < 1 << 60 else \
        "the --memory-limit its run was given"  # (1 << 60 and more: "max", no limit now)
    return (f"job {job_id} ran on the board that `--memory-limit` emulates on {device.name} "
            f"(a folder of its own): give {given} to reach it")


def limit_argument(limit_bytes: int) -> str:
    """--memory-limit's value that gives `limit_bytes` exactly: in MiB where it is a whole
    number of them, else in bytes."""
    return f"{limit_bytes // 2**20}MiB" if limit_bytes % 2**20 == 0 else str(limit_bytes)


def cgroup_name(device: DeviceConfig) -> str:
    workdir = os.path.realpath(os.path.expanduser(device.connection.workdir))
    return f"{device.name}-{hashlib.sha256(workdir.encode()).hexdigest()[:8]}"


def board_cgroup(device: DeviceConfig) -> MemoryCgroup:
    """The emulated board's cgroup, made (or its limit set) now."""
    try:
        return MemoryCgroup.ensure(cgroup_name(device), device.hardware.memory_limit_bytes)
    except CgroupInUse as exc:
        given, held = device.hardware.memory_limit_bytes, exc.limit_bytes
        size = limit_argument(held)
        raise UserError(f"{device.name}'s agent already runs under a memory limit of "
                        f"{fmt_bytes(held)}, not {fmt_bytes(given)}: give --memory-limit "
                        f"{size} to reach it (another limit would resize it under its jobs), "
                        f"or stop it first (edge-remat agent-stop --device "
                        f"{device_argument(device)} "
                        f"--memory-limit {size})") from None
    except CgroupUnavailable as exc:
        raise TransportError(f"cannot emulate {device.name}: {exc}") from None


class EmulatedTransport(LocalTransport):
    """LocalTransport whose relay starts inside the board's memory cgroup."""

    def __init__(self, device: DeviceConfig, archive=None):
        super().__init__(device, archive)
        self.cgroup: MemoryCgroup | None = None

    @property
    def board(self) -> str:
        limit = self.device.hardware.memory_limit_bytes
        return f"{self.device.name} (this machine, {limit / 2**20:.0f} MiB memory cgroup)"

    def open(self):
        self.cgroup = board_cgroup(self.device)
        self.wrap = self.cgroup.exec_prefix()
        try:
            session = super().open()
        except TransportError as exc:
            self._remove_cgroup_if_empty()
            raise self._below_the_agents_least(exc) from None
        except BaseException:
            self._remove_cgroup_if_empty()
            raise
        daemon = session.info.get("pid")
        if isinstance(daemon, int) and not self.cgroup.holds(daemon):
            self.close()
            self._remove_cgroup_if_empty()
            raise TransportError(
                f"an agent daemon (pid {daemon}) already runs for {self.workdir} outside the "
                f"memory limit; stop it (`edge-remat-agent stop --workdir {self.workdir}`) and "
                "try again")
        return session

    def _below_the_agents_least(self, exc: TransportError) -> TransportError:
        """A start that failed under a device config's limit below what the agent needs
        (--memory-limit refuses one; a config's memory_limit_bytes may name it) says so:
        alone it read as a lost link (QA: "the other end closed the connection")."""
        limit = self.device.hardware.memory_limit_bytes
        if limit >= MIN_MEMORY_LIMIT_BYTES:
            return exc
        return TransportError(f"{exc}; its memory_limit_bytes, {fmt_bytes(limit)}, is below "
                              f"the {MIN_MEMORY_LIMIT_BYTES // 2**20} MiB an emulated board's "
                              f"agent needs to start: raise it in {self.device.path}")

    def _remove_cgroup_if_empty(self) -> None:
        """An agent that did not start leaves the cgroup made for it, unless something still
        runs there (another run's agent: removing the group would kill it)."""
        if self.cgroup is not None:
            self.cgroup.remove_if_empty(wait_s=2.5)  # the relay's exit may still be reaped


def emulated_transport(device: DeviceConfig, archive=None) -> EmulatedTransport:
    return EmulatedTransport(device, archive)


def remove_board_cgroup(device: DeviceConfig) -> None:
    try:
        group = MemoryCgroup.existing(cgroup_name(device))
    except CgroupUnavailable:
        return
    if group is not None:
        group.remove()


# How long `agent-stop` waits for a stopped agent's processes (relay, daemon, an interrupted
# job) to leave its board's cgroup before it leaves the group where it is.
STOPPED_AGENT_EXIT_S = 10.0


def is_emulated_board(device: DeviceConfig) -> bool:
    """Whether `device` is a board this machine emulates in a memory cgroup (device configs
    refuse a memory limit on any other kind)."""
    return bool(device.hardware.memory_limit_bytes) and device.connection.kind == "local"


def remove_stopped_board_cgroup(device: DeviceConfig) -> "str | None":
    """After its agent stopped cleanly, the emulated board's own cgroup (named for this device
    and workdir) is removed once empty; nothing is killed. None when it is gone (or the device
    has none); else the group's path, which something still runs in."""
    if not is_emulated_board(device):
        return None
    try:
        group = MemoryCgroup.existing(cgroup_name(device))
    except CgroupUnavailable:
        return None
    if group is None or group.remove_if_empty(STOPPED_AGENT_EXIT_S):
        return None
    return str(group.path)


def retire_emulated(board, say=lambda line: None) -> None:
    """Stop an emulated board's agent and remove its cgroup, so that the next run (or check)
    starts afresh, but only when its daemon says no job runs or waits there: removing the
    cgroup kills every process in it, another host's job or one left running (--keep-running)
    included. Any other board, one never reached, or one that cannot be asked, is left as it
    is. `board`: an open Board; `say(line)` tells why a busy board stays up."""
    from edge_remat_agent.wire.protocol import BUSY

    from .errors import AgentError
    device = board.device
    if not is_emulated_board(device) or not board.connected:
        return  # connecting now would start an agent only to stop it
    try:
        board.stop_agent(if_idle=True)
    except AgentError as exc:
        if exc.code == BUSY:
            running = exc.details.get("running")
            say(f"{board.name}: its agent and memory cgroup stay up: "
                f"{'job ' + running if running else 'a queued job'} is there (another "
                "run's, or one left running)")
        return
    except (TransportError, OSError):
        return
    remove_board_cgroup(device)


@contextlib.contextmanager
def retired_at_exit(board):
    """Within it `board` (open) is used; at its end, however it ends, an emulated board's agent
    and cgroup go once no job is there (retire_emulated), as at a run's end (QA: profile,
    deploy and job left the daemon and its cgroup up for the daemon's idle hour). Enter it
    after the Board: a Ctrl-C's cancelling is done by then, and the link still open."""
    try:
        yield board
    finally:
        retire_emulated(board)


class KernelWatch:
    """The kernel's view of one job on an emulated board: its out-of-memory kills and the
    cgroup's peak. Made just before the job (v1 restarts the peak there); elsewhere it reads
    what the job says of its own group."""

    def __init__(self, group: MemoryCgroup | None):
        self.group = group
        self.kills_before = group.oom_kills() if group else 0
        self.peak_reset = group.reset_peak() if group else False

    @classmethod
    def for_device(cls, device: DeviceConfig) -> "KernelWatch":
        if not device.hardware.memory_limit_bytes:
            return cls(None)
        try:
            return cls(MemoryCgroup.existing(cgroup_name(device)))
        except CgroupUnavailable:
            return cls(None)

    def killed(self) -> bool:
        return self.group is not None and self.group.oom_kills() > self.kills_before

    def readings(self, result: dict | None = None) -> dict:
        """The kernel's peak and what it spans; `result` is the job's, whose runtime baseline
        restarts the peak where the kernel lets it (the board's capture and set-up left out).
        A board this host holds no group of (one over SSH) gives what its agent read of its own
        memory-limited group, if it runs in one."""
        if self.group is None:
            own = (result or {}).get("kernel_peak") or {}
            return {"kernel_peak_bytes": own["bytes"], "kernel_peak_source": own["source"]} \
                if isinstance(own.get("bytes"), int) else {}
        name = PEAK_FILE[self.group.version]
        scope = "since the job started" if self.peak_reset else "since the board started"
        if ((result or {}).get("runtime_baseline") or {}).get("peak_restarted"):
            scope = RESTARTED_PEAK_SCOPE
        return {"kernel_peak_bytes": self.group.peak_bytes(),
                "kernel_peak_source": f"cgroup v{self.group.version} {name}, {scope}; the "
                                      "whole board: agent, job and page cache"}
