"""Local transport: this machine is the board. The agent archive is copied into the workdir and
run as a child process speaking the protocol over its stdin/stdout, exactly as over SSH.
`wrap` is an argv prefix the relay starts under (an emulated board's memory cgroup): the daemon
it starts, and every job that daemon runs, inherit it."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from pathlib import Path
from typing import List, Optional

from edge_remat_agent.wire.framing import FrameStream, PipeChannel

from ..devices import DeviceConfig, local_python
from .errors import BoardMissingPython, BoardOutOfDisk, LinkLost, TransportError
from .hints import python_hint
from .session import AgentSession, file_sha256
from .zipapp import AgentArchive, build_agent_archive


class LocalTransport:
    def __init__(self, device: DeviceConfig, archive: Optional[AgentArchive] = None,
                 wrap: Optional[List[str]] = None):
        self.device = device
        self.archive = archive
        self.wrap = list(wrap or [])
        self.pushed_agent = False
        self._proc: Optional[subprocess.Popen] = None

    @property
    def board(self) -> str:
        return f"{self.device.name} (this machine)"

    @property
    def workdir(self) -> Path:
        return Path(os.path.expanduser(self.device.connection.workdir)).resolve()

    def open(self) -> AgentSession:
        self.close()
        archive = self.archive = self.archive or build_agent_archive()
        python = local_python(self.device.connection)
        if not (shutil.which(python) or Path(python).is_file()):
            raise BoardMissingPython(f"{self.board} has no `{python}`: "
                                     f"{python_hint(self.device.hardware.family)}")
        workdir = self.workdir
        stderr_path = workdir / "relay.log"
        try:
            target = self._install(workdir, archive)
            stderr = open(stderr_path, "wb")
        except OSError as exc:
            raise self._workdir_unusable(exc) from None
        with stderr:
            self._proc = subprocess.Popen(
                self.wrap + [python, str(target), "serve", "--stdio", "--workdir", str(workdir)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, cwd=str(workdir),
                start_new_session=True)
        proc = self._proc
        channel = PipeChannel(proc.stdout.fileno(), proc.stdin.fileno(), close_fds=False)
        session = AgentSession(FrameStream(channel, skip_noise=True), board=self.board,
                               family=self.device.hardware.family, on_close=self.close)
        try:
            session.hello(timeout=self.device.connection.connect_timeout_s + 30)
        except LinkLost as exc:
            lines = stderr_path.read_text(errors="replace").strip().splitlines()
            self.close()
            raise TransportError(f"the agent did not start on {self.board}: "
                                 f"{lines[-1] if lines else exc}") from None
        return session

    def _workdir_unusable(self, exc: OSError) -> TransportError:
        """A workdir the agent cannot be put in (one under /proc, a read-only or full disk),
        said as an SSH board's is, exit 3: the board cannot be used as configured. QA: `devices
        --check` said "[Errno 2] No such file or directory: '/proc/xwd'" (exit 3), deploy
        "/proc/xwd: No such file ... (check the path and its permissions)" (exit 2)."""
        workdir = self.device.connection.workdir
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return BoardOutOfDisk(f"{self.board} is out of disk in its workdir {workdir}: free "
                                  "some space, or set workdir in [connection] of "
                                  f"{self.device.path} to a larger partition")
        made = self.workdir / "agents"  # the folder made first, and those it is made in
        named = exc.filename and Path(os.path.abspath(exc.filename)) not in (made, *made.parents)
        where = f"{exc.filename}: " if named else ""
        return TransportError(f"{self.board} cannot use its workdir {workdir} ({where}"
                              f"{exc.strerror or exc}): set workdir in [connection] of "
                              f"{self.device.path} to a folder you can create and write")

    def _install(self, workdir: Path, archive: AgentArchive) -> Path:
        agents = workdir / "agents"
        agents.mkdir(parents=True, exist_ok=True)
        target = agents / archive.name
        if not (target.is_file() and file_sha256(target) == archive.sha256):
            if shutil.disk_usage(agents).free < archive.size + (1 << 20):
                raise BoardOutOfDisk(f"{self.board} is out of disk in {workdir}: the agent "
                                     f"needs {archive.size} bytes plus 1 MiB: free some space, "
                                     f"or set workdir in [connection] of {self.device.path} "
                                     "to a larger partition")
            tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
            shutil.copyfile(archive.path, tmp)
            os.replace(tmp, target)
            self.pushed_agent = True
        current = workdir / "agent.current"
        if not current.is_file() or current.read_text().strip() != archive.name:
            tmp = current.with_name(f"agent.current.{os.getpid()}.tmp")
            tmp.write_text(archive.name + "\n")
            os.replace(tmp, current)
        return target

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        for pipe in (proc.stdin, proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
