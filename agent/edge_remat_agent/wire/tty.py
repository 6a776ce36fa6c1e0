"""The board's end of a serial line, with the standard library only (no pyserial on boards).

Opens the device raw (no echo, no line editing, 8N1), ignoring modem-control lines (CLOCAL) so
opening never waits for a carrier, and leaves HUPCL off so closing does not drop DTR. When the
device goes away (USB gadget re-enumerated, the other end of a pseudo-terminal closed) reads
and writes do not fail: the port reopens the same path in the background and the link's
retries carry the session over the gap.
"""

from __future__ import annotations

import errno
import logging
import os
import select
import time
from typing import Optional

_log = logging.getLogger(__name__)


class TtyPort:
    def __init__(self, path: str, baud: int = 921600, *, reopen_delay: float = 0.2):
        self.path = path
        self.baud = baud
        self.reopen_delay = reopen_delay
        self._fd: Optional[int] = None
        self._closed = False
        self._open()  # the first open fails loudly: a wrong path is a mistake, not a glitch

    def read(self, max_bytes: int) -> bytes:
        fd = self._ensure_open()
        if fd is None:
            return b""
        try:
            ready, _, _ = select.select([fd], [], [], 0.1)
            if not ready:
                return b""
            data = os.read(fd, max_bytes)
        except OSError as exc:
            self._lost(exc)
            return b""
        if not data:  # the other side hung up
            self._lost(OSError(errno.EIO, "end of file"))
        return data

    def write(self, data: bytes) -> None:
        fd = self._ensure_open()
        if fd is None:
            return  # dropped: the link layer resends
        view = memoryview(data)
        deadline = time.monotonic() + 2.0
        try:
            while view and time.monotonic() < deadline:
                _, ready, _ = select.select([], [fd], [], 0.1)
                if ready:
                    view = view[os.write(fd, view):]
        except OSError as exc:
            self._lost(exc)

    def close(self) -> None:
        self._closed = True
        self._close_fd()

    # -- internals -------------------------------------------------------------------------
    def _open(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK)
        try:
            _configure_raw(fd, self.baud)
        except Exception:
            os.close(fd)
            raise
        self._fd = fd

    def _ensure_open(self) -> Optional[int]:
        if self._fd is None and not self._closed:
            try:
                self._open()
                _log.info("serial port %s reopened", self.path)
            except OSError:
                time.sleep(self.reopen_delay)
        return self._fd

    def _lost(self, exc: OSError) -> None:
        _log.info("serial port %s lost (%s); reopening", self.path, exc)
        self._close_fd()
        time.sleep(self.reopen_delay)

    def _close_fd(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:  # already gone with the device
                pass
            self._fd = None


def _configure_raw(fd: int, baud: int) -> None:
    import termios
    import tty

    if not os.isatty(fd):
        return  # a FIFO or socket in tests: nothing to configure
    tty.setraw(fd)
    attrs = termios.tcgetattr(fd)
    speed = getattr(termios, f"B{baud}", None)
    if speed is None:
        raise ValueError(f"baud rate {baud} is not supported by this system's termios")
    attrs[2] |= termios.CLOCAL | termios.CREAD
    attrs[2] &= ~termios.HUPCL
    attrs[4] = attrs[5] = speed
    termios.tcsetattr(fd, termios.TCSANOW, attrs)
