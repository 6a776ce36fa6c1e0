"""A reliable byte stream over a serial line that loses, corrupts and repeats bytes.

Packets on the wire:

    COBS( kind u8 | session u32 | seq u32 | payload | CRC32 of everything before it ) 0x00

- The 0x00 delimiter (which COBS keeps out of the packet) lets a receiver find the next packet
  after garbage; the CRC32 rejects corrupted packets, which are dropped and so retried.
- DATA packets are sent stop-and-wait: each waits for the ACK of its sequence number and is
  resent after `ack_timeout`. A receiver delivers only the next expected sequence number and
  acknowledges repeats again (their ACK was the thing lost), so nothing is delivered twice.
- RESET starts a session (a fresh random number chosen by the host, with the link version as
  payload) and RESET_ACK confirms it. Sequence numbers restart with every session, and packets
  of an older session are ignored, so a host that reconnects after a dropped link never mixes
  with leftovers of the last one. FIN closes a session early (best effort).

The "port" is anything with read(max) -> bytes (b"" when nothing arrived for a short while),
write(data) and close(): pyserial's Serial on the host, `TtyPort` on the board, or a test double.
"""

from __future__ import annotations

import collections
import logging
import random
import struct
import threading
import time
import zlib
from typing import Any, Deque, Optional

from . import cobs
from .framing import ConnectionClosed

DATA, ACK, RESET, RESET_ACK, FIN = 1, 2, 3, 4, 5
LINK_VERSION = b"ERs1"
_HEAD = struct.Struct(">BII")
_CRC = struct.Struct(">I")
DEFAULT_PAYLOAD = 1024

_log = logging.getLogger(__name__)


class PacketError(ValueError):
    """A packet that failed COBS decoding, its length check or its CRC."""


def encode_packet(kind: int, session: int, seq: int, payload: bytes = b"") -> bytes:
    body = _HEAD.pack(kind, session, seq) + payload
    return cobs.encode(body + _CRC.pack(zlib.crc32(body))) + b"\x00"


def decode_packet(encoded: bytes) -> "tuple[int, int, int, bytes]":
    """(kind, session, seq, payload) of one packet, without its 0x00 delimiter."""
    try:
        raw = cobs.decode(encoded)
    except cobs.CobsError as exc:
        raise PacketError(f"bad COBS: {exc}") from None
    if len(raw) < _HEAD.size + _CRC.size:
        raise PacketError(f"packet of {len(raw)} bytes is too short")
    body, (crc,) = raw[:-_CRC.size], _CRC.unpack(raw[-_CRC.size:])
    if zlib.crc32(body) != crc:
        raise PacketError("CRC32 mismatch")
    kind, session, seq = _HEAD.unpack(body[:_HEAD.size])
    return kind, session, seq, body[_HEAD.size:]


def ack_timeout_for(baud: int, payload: int = DEFAULT_PAYLOAD) -> float:
    """Long enough for a full packet out and its ACK back at this baud rate (10 bits a byte,
    COBS overhead), with room for a USB-serial adapter's latency."""
    wire_bytes = payload + payload // 254 + 16
    return max(0.2, 3.0 * wire_bytes * 10 / max(baud, 1) + 0.05)


class LinkStats:
    def __init__(self) -> None:
        self.packets_sent = 0
        self.resent = 0
        self.packets_received = 0
        self.corrupt = 0
        self.duplicates = 0

    def as_dict(self) -> dict:
        return dict(vars(self))


class LinkSession:
    """One session's byte stream: recv/sendall/settimeout/close, like a socket."""

    def __init__(self, link: "SerialLink", session_id: int):
        self.link = link
        self.id = session_id
        self.closed_reason: Optional[str] = None
        self._rx = bytearray()
        self._rx_expected = 0
        self._tx_next = 0
        self._acked = -1
        self._timeout: Optional[float] = None
        self._send_lock = threading.Lock()

    # -- the socket-like face --------------------------------------------------------------
    def settimeout(self, seconds: Optional[float]) -> None:
        self._timeout = seconds

    def recv(self, count: int) -> bytes:
        cond = self.link.cond
        deadline = None if self._timeout is None else time.monotonic() + self._timeout
        with cond:
            while not self._rx and self.closed_reason is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"no data on the serial link for {self._timeout:g} s")
                cond.wait(left)
            data = bytes(self._rx[:count])
            del self._rx[:count]
            return data

    def sendall(self, data: bytes) -> None:
        link = self.link
        with self._send_lock:
            for start in range(0, len(data), link.payload_bytes):
                self._send_packet(data[start:start + link.payload_bytes])

    def close(self) -> None:
        if self.closed_reason is None:
            self.link._write_packet(FIN, self.id, 0)
        self._mark_closed("closed here")

    # -- internals -------------------------------------------------------------------------
    def _send_packet(self, payload: bytes) -> None:
        link = self.link
        with link.cond:
            seq = self._tx_next
        for attempt in range(link.retries + 1):
            if self.closed_reason is not None:
                raise ConnectionClosed(f"serial session closed ({self.closed_reason})")
            if attempt:
                link.stats.resent += 1
            link._write_packet(DATA, self.id, seq, payload)
            deadline = time.monotonic() + link.ack_timeout
            with link.cond:
                while self._acked < seq and self.closed_reason is None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    link.cond.wait(left)
                if self._acked >= seq:
                    self._tx_next = seq + 1
                    return
        self._mark_closed(f"no acknowledgement after {link.retries + 1} tries")
        raise ConnectionClosed(f"serial link lost: packet {seq} was not acknowledged after "
                               f"{link.retries + 1} tries")

    def _mark_closed(self, reason: str) -> None:
        with self.link.cond:
            if self.closed_reason is None:
                self.closed_reason = reason
            self.link.cond.notify_all()

    def _on_data(self, seq: int, payload: bytes) -> None:
        # Called with link.cond held.
        if seq == self._rx_expected:
            self._rx += payload
            self._rx_expected += 1
            self.link.cond.notify_all()
        elif seq < self._rx_expected:
            self.link.stats.duplicates += 1
        else:
            return  # from the future: cannot happen with stop-and-wait; never acknowledge it
        self.link._write_packet(ACK, self.id, seq)

    def _on_ack(self, seq: int) -> None:
        if seq > self._acked:
            self._acked = seq
            self.link.cond.notify_all()


class SerialLink:
    """Owns the port and a reader thread. The host calls connect(); the board calls accept()."""

    def __init__(self, port: Any, *, role: str, payload_bytes: int = DEFAULT_PAYLOAD,
                 ack_timeout: float = 0.25, retries: int = 20, version: bytes = LINK_VERSION):
        if role not in ("host", "board"):
            raise ValueError("role must be 'host' or 'board'")
        self.port = port
        self.role = role
        self.payload_bytes = payload_bytes
        self.ack_timeout = ack_timeout
        self.retries = retries
        self.version = version
        self.stats = LinkStats()
        self.cond = threading.Condition()
        self.session: Optional[LinkSession] = None
        self.failure: Optional[str] = None
        self._pending_session = 0
        self._accepted: Deque[LinkSession] = collections.deque()
        self._write_lock = threading.Lock()
        self._closed = False
        self._max_packet = 2 * (payload_bytes + 64)
        self._reader = threading.Thread(target=self._read_loop, name="serial-link-reader",
                                        daemon=True)
        self._reader.start()

    # -- host side -------------------------------------------------------------------------
    def connect(self, timeout: float = 5.0) -> LinkSession:
        """Start a new session; raises TimeoutError when nothing on the line answers."""
        session_id = random.randint(1, 0xFFFFFFFF)
        with self.cond:
            if self.session is not None:
                self.session._mark_closed("replaced by a new session")
            self.session = None
            self._pending_session = session_id
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._write_packet(RESET, session_id, 0, self.version)
            with self.cond:
                self.cond.wait_for(lambda: self.session is not None or self.failure is not None,
                                   min(self.ack_timeout, max(deadline - time.monotonic(), 0)))
                if self.failure is not None:
                    raise ConnectionClosed(self.failure)
                if self.session is not None:
                    return self.session
        raise TimeoutError(f"no agent answered on the serial line within {timeout:g} s")

    # -- board side ------------------------------------------------------------------------
    def accept(self, timeout: Optional[float] = None) -> Optional[LinkSession]:
        """The next session a host opens (None on timeout or once the link is closed)."""
        with self.cond:
            self.cond.wait_for(lambda: self._accepted or self._closed, timeout)
            return self._accepted.popleft() if self._accepted else None

    def close(self) -> None:
        with self.cond:
            self._closed = True
            if self.session is not None:
                self.session._mark_closed("link closed")
            self.cond.notify_all()
        # Let the reader leave its read first: a file descriptor closed under a thread that is
        # in select() on it stays open (and keeps its lock) until that select returns.
        if threading.current_thread() is not self._reader:
            self._reader.join(2.0)
        try:
            self.port.close()
        except Exception:  # noqa: BLE001 - closing a dead port may fail in many ways
            pass

    # -- the wire ---------------------------------------------------------------------------
    def _write_packet(self, kind: int, session: int, seq: int, payload: bytes = b"") -> None:
        packet = encode_packet(kind, session, seq, payload)
        with self._write_lock:
            try:
                self.port.write(packet)
                self.stats.packets_sent += 1
            except Exception as exc:  # noqa: BLE001 - pyserial and os errors alike
                _log.debug("serial write failed: %s", exc)  # the retry logic covers it

    def _read_loop(self) -> None:
        buffer = bytearray()
        while not self._closed:
            try:
                chunk = self.port.read(4096)
            except Exception as exc:  # noqa: BLE001 - the port is gone (unplugged, killed)
                self._fail(f"serial port failed: {exc}")
                return
            if not chunk:
                continue
            buffer += chunk
            while True:
                end = buffer.find(b"\x00")
                if end < 0:
                    if len(buffer) > self._max_packet:  # line noise with no delimiter
                        self.stats.corrupt += 1
                        buffer.clear()
                    break
                packet = bytes(buffer[:end])
                del buffer[:end + 1]
                if packet:
                    self._on_packet(packet)

    def _fail(self, reason: str) -> None:
        with self.cond:
            self.failure = reason
            if self.session is not None:
                self.session._mark_closed(reason)
            self.cond.notify_all()

    def _on_packet(self, encoded: bytes) -> None:
        try:
            kind, session_id, seq, payload = decode_packet(encoded)
        except PacketError as exc:
            self.stats.corrupt += 1
            _log.debug("dropped a packet: %s", exc)
            return
        self.stats.packets_received += 1
        with self.cond:
            current = self.session
            if kind == RESET and self.role == "board":
                self._on_reset(session_id, payload)
            elif kind == RESET_ACK and self.role == "host":
                if session_id != self._pending_session:
                    return
                if payload != self.version:
                    self.failure = (f"the board speaks serial link version {payload!r}, this "
                                    f"host {self.version!r}: install the same edge-remat "
                                    "version on both")
                else:
                    self.session = LinkSession(self, session_id)
                self._pending_session = 0
                self.cond.notify_all()
            elif current is None or session_id != current.id or current.closed_reason:
                return  # a leftover of an older session
            elif kind == DATA:
                current._on_data(seq, payload)
            elif kind == ACK:
                current._on_ack(seq)
            elif kind == FIN:
                current._mark_closed("closed by the other end")

    def _on_reset(self, session_id: int, version: bytes) -> None:
        # Called with cond held.
        if version != self.version:
            _log.warning("host speaks serial link version %r, this agent %r", version,
                         self.version)
            self._write_packet(RESET_ACK, session_id, 0, self.version)  # the host says why
            return
        if self.session is None or self.session.id != session_id:
            if self.session is not None:
                self.session._mark_closed("the host started a new session")
            self.session = LinkSession(self, session_id)
            self._accepted.append(self.session)
            self.cond.notify_all()
        # Also answers a repeated RESET whose RESET_ACK was lost.
        self._write_packet(RESET_ACK, session_id, 0, self.version)
