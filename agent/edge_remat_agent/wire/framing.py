"""Length-prefixed frames over any byte channel: a JSON header plus an optional raw body.

    frame = MAGIC (4 bytes) | header length (u32, big-endian) | body length (u32, big-endian)
            | header: UTF-8 JSON object | body: raw bytes

The magic lets a reader notice a stream that went out of step, and lets the host skip whatever a
board's login shell prints before the agent starts (some shell rc files talk even when nobody
asked). Bodies carry file chunks as-is, so transfers are not inflated by base64.

A channel is anything with `recv(n)` (b"" at end of stream), `sendall(data)` and `close()`;
sockets and paramiko channels already are, `PipeChannel` adapts file descriptors.
"""

from __future__ import annotations

import json
import os
import select
import struct
import threading
from typing import Any, Optional, Tuple

MAGIC = b"ERw1"
_PREFIX = struct.Struct(">4sII")
MAX_HEADER_BYTES = 1 << 20
MAX_BODY_BYTES = 64 << 20
MAX_NOISE_BYTES = 64 << 10


class ProtocolError(ValueError):
    """Bytes that are not a frame: the stream cannot be trusted any more."""


class ConnectionClosed(ConnectionError):
    """The other end went away (cleanly or not)."""


Frame = Tuple[dict, bytes]


def encode_frame(header: dict, body: bytes = b"") -> bytes:
    head = json.dumps(header, separators=(",", ":")).encode("utf-8")
    if len(head) > MAX_HEADER_BYTES:
        raise ProtocolError(f"frame header of {len(head)} bytes is over {MAX_HEADER_BYTES}")
    if len(body) > MAX_BODY_BYTES:
        raise ProtocolError(f"frame body of {len(body)} bytes is over {MAX_BODY_BYTES}")
    return _PREFIX.pack(MAGIC, len(head), len(body)) + head + bytes(body)


class FrameStream:
    """Sends and receives whole frames on one channel; sending is thread-safe."""

    def __init__(self, channel: Any, *, skip_noise: bool = False):
        self.channel = channel
        self._buffer = bytearray()
        self._send_lock = threading.Lock()
        self._skip_noise = skip_noise
        self.noise = b""  # what came before the first frame, kept for error messages

    def settimeout(self, seconds: Optional[float]) -> None:
        setter = getattr(self.channel, "settimeout", None)
        if setter is not None:
            setter(seconds)

    def send(self, header: dict, body: bytes = b"") -> None:
        data = encode_frame(header, body)
        with self._send_lock:
            self.channel.sendall(data)

    def recv(self) -> Frame:
        if self._skip_noise:
            self._sync()
        magic, head_len, body_len = _PREFIX.unpack(self._take(_PREFIX.size))
        if magic != MAGIC:
            raise ProtocolError(f"bad frame magic {magic!r} (expected {MAGIC!r}): the other end "
                                "is not an edge-remat agent, or the stream lost bytes")
        if head_len > MAX_HEADER_BYTES or body_len > MAX_BODY_BYTES:
            raise ProtocolError(f"frame sizes {head_len}/{body_len} bytes are over the limits")
        try:
            header = json.loads(self._take(head_len).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ProtocolError(f"frame header is not JSON: {exc}") from None
        if not isinstance(header, dict):
            raise ProtocolError("frame header is not a JSON object")
        return header, self._take(body_len)

    def close(self) -> None:
        try:
            self.channel.close()
        except OSError:
            pass

    def _fill(self) -> None:
        chunk = self.channel.recv(1 << 16)
        if not chunk:
            raise ConnectionClosed("the other end closed the connection"
                                   + (" in the middle of a frame" if self._buffer else ""))
        self._buffer += chunk

    def _take(self, count: int) -> bytes:
        while len(self._buffer) < count:
            self._fill()
        data = bytes(self._buffer[:count])
        del self._buffer[:count]
        return data

    def _sync(self) -> None:
        """Drop bytes up to the first MAGIC (once, at the start of the stream)."""
        while True:
            at = self._buffer.find(MAGIC)
            if at >= 0:
                self.noise += bytes(self._buffer[:at])
                del self._buffer[:at]
                self._skip_noise = False
                return
            keep = len(MAGIC) - 1  # a magic may straddle two reads
            if len(self._buffer) > keep:
                self.noise += bytes(self._buffer[:-keep])
                del self._buffer[:-keep]
            if len(self.noise) > MAX_NOISE_BYTES:
                raise ProtocolError("no edge-remat frame in the first "
                                    f"{MAX_NOISE_BYTES} bytes; the board printed: "
                                    + _printable(self.noise[-200:]))
            self._fill()


def _printable(data: bytes) -> str:
    return repr(data.decode("utf-8", "replace").strip())


class PipeChannel:
    """A byte channel over two file descriptors (stdin/stdout of a process, or of a child)."""

    def __init__(self, read_fd: int, write_fd: int, *, close_fds: bool = True):
        self.read_fd = read_fd
        self.write_fd = write_fd
        self._close_fds = close_fds
        self._timeout: Optional[float] = None
        self._closed = False

    def settimeout(self, seconds: Optional[float]) -> None:
        self._timeout = seconds

    def recv(self, count: int) -> bytes:
        # select in short slices so that close() from another thread ends a blocked read.
        waited = 0.0
        while not self._closed:
            slice_s = 0.2 if self._timeout is None else min(0.2, self._timeout - waited)
            ready, _, _ = select.select([self.read_fd], [], [], max(slice_s, 0.0))
            if ready:
                try:
                    return os.read(self.read_fd, count)
                except OSError:
                    return b""
            waited += slice_s
            if self._timeout is not None and waited >= self._timeout:
                raise TimeoutError(f"no data for {self._timeout:g} s")
        return b""

    def sendall(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            if self._closed:
                raise ConnectionClosed("channel closed")
            try:
                written = os.write(self.write_fd, view)
            except BrokenPipeError:
                raise ConnectionClosed("the other end closed the pipe") from None
            view = view[written:]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._close_fds:
            for fd in {self.read_fd, self.write_fd}:
                try:
                    os.close(fd)
                except OSError:
                    pass
