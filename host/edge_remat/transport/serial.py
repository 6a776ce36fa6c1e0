"""Serial transport (pyserial): the reliable link of edge_remat_agent.wire.serial_link over a
USB-serial adapter or a USB gadget port, with the agent pushed in chunks over the same link.

The board runs `python3 agent.pyz serve --serial /dev/ttyGS0` (docs/boards.md; from a systemd
unit, say). On connect the host opens a link session (RESET, with the link version), says
hello, and when the board's agent is another build than the host's, sends its archive in
chunks, points agent.current at it and asks the idle daemon to stop; the board's relay then
starts the new build for the next session.
"""

from __future__ import annotations

import errno
import tempfile
import time
from pathlib import Path
from typing import Optional

from edge_remat_agent.wire.framing import FrameStream
from edge_remat_agent.wire.protocol import BUSY
from edge_remat_agent.wire.serial_link import SerialLink, ack_timeout_for

from ..devices import DeviceConfig
from .errors import AgentError, BoardUnreachable, LinkLost, TransportError
from .session import GET_CHUNK, PUT_CHUNK, AgentSession
from .zipapp import AgentArchive, build_agent_archive


class PySerialPort:
    """pyserial's Serial as the link's port: read returns what is there, soon."""

    def __init__(self, serial_port):
        self.serial = serial_port

    def read(self, max_bytes: int) -> bytes:
        data = self.serial.read(1)  # waits up to the port's timeout for the first byte
        waiting = self.serial.in_waiting if data else 0
        if waiting:
            data += self.serial.read(min(waiting, max_bytes - 1))
        return data

    def write(self, data: bytes) -> None:
        self.serial.write(data)

    def close(self) -> None:
        self.serial.close()


def open_serial_port(device: str, baud: int):
    """Open without resetting the board: DTR and RTS are set low in the settings before
    open() (pyserial applies them as it opens, and hardware flow control, which would drive
    them, is off), and HUPCL is cleared so closing does not drop DTR either."""
    import serial

    port = serial.Serial()  # no port given: nothing is opened yet
    port.port = device
    port.baudrate = baud
    port.bytesize, port.parity, port.stopbits = serial.EIGHTBITS, serial.PARITY_NONE, \
        serial.STOPBITS_ONE
    port.timeout = 0.05
    port.write_timeout = 10
    port.xonxoff = port.rtscts = port.dsrdtr = False
    port.dtr = False
    port.rts = False
    port.exclusive = True  # two hosts on one port would corrupt each other's sessions
    for attempt in range(5):
        try:
            port.open()
            break
        except (serial.SerialException, OSError, ValueError) as exc:
            message = _open_error(device, exc)
            if "in use" not in message or attempt == 4:
                if "in use" in message:
                    message = held_by(device) or message
                raise BoardUnreachable(message) from None
            time.sleep(0.1)  # our own previous connection may still be letting go
    _keep_lines_on_close(port)
    return port


def _keep_lines_on_close(port) -> None:
    try:
        import termios
        attrs = termios.tcgetattr(port.fd)
        attrs[2] &= ~termios.HUPCL
        termios.tcsetattr(port.fd, termios.TCSANOW, attrs)
    except (ImportError, AttributeError, OSError, ValueError):
        pass  # not a POSIX tty (Windows, a test double): nothing to clear


def _open_error(device: str, exc: Exception) -> str:
    code = getattr(exc, "errno", None)
    text = str(exc)
    if code == errno.ENOENT or "No such file" in text:
        return (f"serial port {device} does not exist: is the board plugged in and powered? "
                "(look at `ls /dev/ttyUSB* /dev/ttyACM*`)")
    if code == errno.EACCES or "Permission denied" in text:
        return (f"no permission to open {device}: add yourself to the dialout group "
                "(`sudo usermod -aG dialout $USER`, then log in again)")
    if code in (errno.EBUSY, errno.EAGAIN) or "lock" in text.lower() or "busy" in text.lower():
        return f"serial port {device} is in use by another program (close it and retry)"
    if code == errno.ENOTTY or "Inappropriate ioctl" in text:  # QA: /dev/null, a file
        return (f"{device} is not a serial device (it takes no terminal settings): give "
                "the board's serial line as port in the device config's [connection], e.g. "
                "/dev/ttyUSB0")
    return f"cannot open serial port {device}: {text}"


def held_by(device: str) -> Optional[str]:
    """Who holds the serial port `device`, from /proc (no lsof): the process with the lock
    pyserial's exclusive open takes (/proc/locks), else those with it open (/proc/PID/fd);
    the line for a port in use that names it, and for another edge-remat command (a deploy
    waiting on its job holds the board's only link) what frees it. None where no other
    process is seen holding it (another user's, whose fds are not ours to read; no /proc)."""
    import os
    try:
        target = os.path.realpath(device)
        stat = os.stat(target)
    except OSError:
        return None
    holders = _lockers(stat) or _openers(target)
    found = []
    for pid in holders:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                argv = [a.decode(errors="replace") for a in handle.read().split(b"\0") if a]
        except OSError:
            continue  # gone meanwhile, or not ours to read
        command = _edge_remat_command(argv)
        if command is not None:
            return (f"serial port {device} is held by a running `edge-remat {command}` (pid "
                    f"{pid}), which keeps the board's link while it waits on its job: press "
                    "Ctrl-C there (it cancels the job; with --keep-running it leaves it "
                    "running and names the commands that reach it), then retry")
        found.append(f"{os.path.basename(argv[0]) if argv else '?'}, pid {pid}")
    if not found:
        return None
    return (f"serial port {device} is in use by another program ({'; '.join(found[:3])}): "
            "close it and retry")


def _lockers(stat) -> "list[int]":
    """The pids /proc/locks names as holding a lock on the file of `stat` (MAJ:MIN:INODE,
    the device numbers in hex)."""
    import os
    key = f"{os.major(stat.st_dev):02x}:{os.minor(stat.st_dev):02x}:{stat.st_ino}"
    pids = []
    try:
        with open("/proc/locks") as handle:
            for line in handle:
                fields = line.split()
                if "->" not in fields and len(fields) >= 6 and fields[5] == key:
                    pids.append(int(fields[4]))
    except (OSError, ValueError):
        return []
    return [pid for pid in pids if pid != os.getpid()]


def _openers(target: str) -> "list[int]":
    """The pids with `target` open, where their /proc/PID/fd can be read."""
    import os
    pids = []
    try:
        names = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []
    for name in names:
        if int(name) == os.getpid():
            continue
        try:
            if any(os.readlink(f"/proc/{name}/fd/{fd}") == target
                   for fd in os.listdir(f"/proc/{name}/fd")):
                pids.append(int(name))
        except OSError:
            continue
    return pids


def _edge_remat_command(argv: "list[str]") -> Optional[str]:
    """The edge-remat subcommand (with its first argument) of a process's argv, or None when
    the process is no edge-remat command (the console script, `-m edge_remat[.cli]`)."""
    for index, arg in enumerate(argv):
        name = arg.rsplit("/", 1)[-1]
        if name == "edge-remat" or (arg in ("edge_remat", "edge_remat.cli", "edge_remat.entry")
                                    and index and argv[index - 1] == "-m"):
            rest = argv[index + 1:]
            if not rest:
                return "command"
            return " ".join(rest[:2]) if rest[0] == "job" else rest[0]  # `job sleep`
    return None


class SerialTransport:
    def __init__(self, device: DeviceConfig, archive: Optional[AgentArchive] = None,
                 push_agent: bool = True):
        self.device = device
        self.archive = archive
        self.push_agent = push_agent
        self.pushed_agent = False
        self.link: Optional[SerialLink] = None

    @property
    def board(self) -> str:
        return f"{self.device.name} ({self.device.address()})"

    def open(self) -> AgentSession:
        session = self._open_session()
        if not self.push_agent:
            return session
        archive = self.archive = self.archive or build_agent_archive()
        if session.info.get("build") == archive.sha256:
            return session
        try:
            self._upgrade(session, archive)
        except AgentError as exc:
            if exc.code != BUSY:
                session.close()
                raise
            return session  # busy with a job: keep the running agent, upgrade next time
        session.close()
        return self._open_session()

    def _open_session(self) -> AgentSession:
        self.close()
        conn = self.device.connection
        port = open_serial_port(conn.device, conn.baud)
        self.link = SerialLink(PySerialPort(port), role="host",
                               ack_timeout=ack_timeout_for(conn.baud))
        try:
            link_session = self.link.connect(timeout=conn.connect_timeout_s)
        except (TimeoutError, ConnectionError) as exc:
            self.close()
            # as docs/boards.md has the board run it: a serial board has the archive copied
            # by hand, no installed `edge-remat-agent` command
            raise BoardUnreachable(
                f"no agent answers on {conn.device} at {conn.baud} baud ({exc}): start "
                f"`python3 agent.pyz serve --serial DEVICE --baud {conn.baud} --workdir "
                "~/edge-remat` on the board (DEVICE is its end of the line, e.g. /dev/ttyGS0 "
                "or /dev/ttyAMA0; agent.pyz is the agent archive, copied there once by hand: "
                "docs/boards.md, 'A board on a serial line')") from None
        session = AgentSession(FrameStream(link_session), board=self.board,
                               family=self.device.hardware.family, on_close=self.close)
        session.get_chunk = chunk_for(conn.baud, GET_CHUNK)
        session.put_chunk = chunk_for(conn.baud, PUT_CHUNK)
        try:
            session.hello(timeout=conn.connect_timeout_s + 30)
        except LinkLost as exc:
            session.close()
            raise TransportError(f"the agent on {self.board} did not say hello: {exc}") from None
        return session

    def _upgrade(self, session: AgentSession, archive: AgentArchive) -> None:
        self.pushed_agent = session.put_file(archive.path, f"agents/{archive.name}")
        with tempfile.TemporaryDirectory() as tmp:
            current = Path(tmp) / "agent.current"
            current.write_text(archive.name + "\n")
            session.put_file(current, "agent.current")
        session.stop(if_idle=True)

    def close(self) -> None:
        link, self.link = self.link, None
        if link is not None:
            if link.session is not None:
                link.session.close()
            link.close()


def chunk_for(baud: int, largest: int, seconds: float = 4.0) -> int:
    """Bytes a transfer request moves at once: what the line carries in about `seconds` (10
    bits a byte), so that each request answers well within the session's request timeout even
    at a slow baud rate (a 1 MiB fetch takes 91 s at 115200 baud, past the 30 s timeout, and a
    fetch of trained weights then failed again and again; a 256 KiB upload took 23 s); 4 KiB
    to `largest`."""
    size = int(baud / 10 * seconds) // 4096 * 4096
    return max(4096, min(largest, size))


def stats(transport: SerialTransport) -> dict:
    return transport.link.stats.as_dict() if transport.link else {}


__all__ = ["SerialTransport", "open_serial_port", "PySerialPort", "stats"]
