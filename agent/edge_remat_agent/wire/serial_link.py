"""A reliable byte stream over a serial line that loses, corrupts and repeats bytes.

Packets on the wire:

    COBS( kind u8 | session u32 | seq u32 | payload | CRC32 of everything before it ) 0x00

- The 0x00 delimiter (which COBS keeps out of the packet) lets a receiver find the next packet
  after garbage; the CRC32 rejects corrupted packets, which are dropped and so retried.
- DATA packets are sent with a sliding window: up to `window` packets in flight, each kept
  until acknowledged. An ACK is cumulative: ACK n says every packet up to n has been delivered
  (the receiver sends one after each batch of packets it reads, and again for a repeat, whose
  ACK was the thing lost). A receiver delivers bytes strictly in sequence order, keeping packets
  that arrive ahead of a gap (a corrupted or lost one) until the gap is filled, so nothing is
  delivered twice or out of order. The sender resends the oldest unacknowledged packet when
  two ACKs in a row repeat the same number (the receiver is holding packets past a gap), and
  every unacknowledged packet when no ACK has advanced for `ack_timeout`; after `retries` such
  timeouts without progress the session is lost. A window of 1 is stop-and-wait, which is what
  a peer of link version ERs1 before windows did; both kinds interoperate, since their ACKs
  mean the same.
- RESET starts a session (a fresh random number chosen by the host, with the link version as
  payload) and RESET_ACK confirms it. Sequence numbers restart with every session, and packets
  of an older session are ignored, so a host that reconnects after a dropped link never mixes
  with leftovers of the last one. FIN closes a session early (best effort).
- Keepalive: a host waiting for an answer it has heard nothing of for `keepalive_s` sends PING;
  the board answers PONG for the session it holds, and for one it does not hold (its agent
  was killed and started again, and holds none) FIN with NO_SESSION as payload, so the host
  knows at once. A board that has answered a PING and then stays silent for `dead_after_s`
  is gone (its agent killed, not yet back). Peers of link version ERs1 from before keepalive
  ignore both kinds: a host that never hears a PONG waits as before, for its request's
  timeout (QA: a board's front end killed and started again within 5 s was noticed after
  40 s, when a 'wait' request timed out; now within a second of its start).

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
from typing import Any, Callable, Deque, Dict, Optional

from . import cobs
from .framing import ConnectionClosed

DATA, ACK, RESET, RESET_ACK, FIN = 1, 2, 3, 4, 5
PING, PONG = 6, 7  # keepalive: a peer before them ignores both, as any kind it does not know
NO_SESSION = b"no such session"  # a FIN's payload: the board holds no session of that number
LINK_VERSION = b"ERs1"
_HEAD = struct.Struct(">BII")
_CRC = struct.Struct(">I")
DEFAULT_PAYLOAD = 1024
DEFAULT_WINDOW = 16  # packets in flight: 16 KiB, ~180 ms of a 921600-baud line
RX_AHEAD = 256  # packets a receiver keeps past a gap (more are dropped, and resent later)

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


def keepalive_for(ack_timeout: float) -> "tuple[float, float]":
    """(keepalive_s, dead_after_s): a host probes after 1 s of silence (two ACK timeouts on a
    slow line), and takes a board that answers probes as gone after 5 s of silence (three
    probes' worth on a slow line: every packet on the line, DATA too, counts as heard)."""
    keepalive_s = max(1.0, 2.0 * ack_timeout)
    return keepalive_s, max(5.0, 3.0 * keepalive_s)


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
        # receiving (the reader thread, under link.cond)
        self._rx = bytearray()
        self._rx_expected = 0
        self._rx_ahead: Dict[int, bytes] = {}
        self._ack_due = False
        # sending (the sender thread and the reader's _on_ack, under link.cond)
        self._tx_next = 0
        self._acked = -1  # every packet up to this one is delivered
        self._unacked: Dict[int, bytes] = {}  # in flight, in sequence order
        self._timer_start = 0.0  # when the oldest unacknowledged packet's clock started
        self._timeouts = 0  # in a row, without an ACK advancing
        self._dup_acks = 0
        self._fast_resend = False
        self._fast_resent = -1  # the packet last resent on repeated ACKs (once each)
        self._timeout: Optional[float] = None
        self._send_lock = threading.Lock()
        # keepalive (under link.cond): when a packet of this session was last heard and a
        # PING last sent; whether the peer has answered one; a close that is a lost link
        self._heard = self._probed = time.monotonic()
        self._answers_probes = False
        self._lost = False

    # -- the socket-like face --------------------------------------------------------------
    def settimeout(self, seconds: Optional[float]) -> None:
        self._timeout = seconds

    def recv(self, count: int) -> bytes:
        """What has arrived, up to `count` bytes; b"" once the session is closed, and
        ConnectionClosed once the peer is known gone (keepalive, NO_SESSION). A host that
        waits PINGs the board after keepalive_s of silence (the module's docstring)."""
        link = self.link
        deadline = None if self._timeout is None else time.monotonic() + self._timeout
        while True:
            with link.cond:
                probe = self._wait_for_data(deadline)
                if not probe:
                    if not self._rx and self._lost:
                        raise ConnectionClosed(f"serial link lost: {self.closed_reason}")
                    data = bytes(self._rx[:count])
                    del self._rx[:count]
                    return data
            link._write_packet(PING, self.id, 0)

    def _wait_for_data(self, deadline: Optional[float]) -> bool:
        """Wait (link.cond held) for data or the session's end: False then, True when a PING
        is due first (its time noted; the caller sends it without the lock)."""
        link = self.link
        while not self._rx and self.closed_reason is None:
            now = time.monotonic()
            left = None if deadline is None else deadline - now
            if left is not None and left <= 0:
                raise TimeoutError(f"no data on the serial link for {self._timeout:g} s")
            if link.keepalive_s:
                quiet = now - self._heard
                if self._answers_probes and quiet >= link.dead_after_s:
                    self._lost = True
                    self._mark_closed(f"the board stopped answering (nothing heard for "
                                      f"{quiet:.0f} s; it had answered keepalive probes)")
                    break
                due = max(self._heard, self._probed) + link.keepalive_s
                if now >= due:
                    self._probed = now
                    return True
                wake = due - now
                if self._answers_probes:
                    wake = min(wake, self._heard + link.dead_after_s - now)
                left = wake if left is None else min(left, wake)
            link.cond.wait(left)
        return False

    def sendall(self, data: bytes) -> None:
        """Returns once every byte is acknowledged; raises ConnectionClosed when the link
        gives up or the session ends first."""
        link = self.link
        window = max(1, link.window)
        with self._send_lock:
            for start in range(0, len(data), link.payload_bytes):
                self._wait_until(lambda: len(self._unacked) < window)
                payload = data[start:start + link.payload_bytes]
                with link.cond:
                    seq = self._tx_next
                    self._tx_next += 1
                    if not self._unacked:
                        self._timer_start = time.monotonic()
                    self._unacked[seq] = payload
                link._write_packet(DATA, self.id, seq, payload)
            self._wait_until(lambda: not self._unacked)

    def close(self) -> None:
        if self.closed_reason is None:
            self.link._write_packet(FIN, self.id, 0)
        self._mark_closed("closed here")

    # -- internals -------------------------------------------------------------------------
    def _wait_until(self, ready: Callable[[], bool]) -> None:
        """Wait (under link.cond) for `ready`, resending what the ACKs, or their absence,
        say was lost."""
        link = self.link
        while True:
            with link.cond:
                while True:
                    if self.closed_reason is not None:
                        raise ConnectionClosed(f"serial session closed ({self.closed_reason})")
                    if ready():
                        return
                    oldest = next(iter(self._unacked))  # not ready: something is in flight
                    now = time.monotonic()
                    if self._fast_resend:
                        self._fast_resend = False
                        self._fast_resent = oldest
                        self._timer_start = now
                        resend = [(oldest, self._unacked[oldest])]
                        break
                    left = self._timer_start + link.ack_timeout - now
                    if left <= 0:
                        self._timeouts += 1
                        if self._timeouts > link.retries:
                            self._give_up(oldest)
                        self._timer_start = now
                        resend = list(self._unacked.items())
                        break
                    link.cond.wait(left)
            for seq, payload in resend:
                link.stats.resent += 1
                link._write_packet(DATA, self.id, seq, payload)

    def _give_up(self, seq: int) -> None:
        # Called with link.cond held.
        tries = self.link.retries + 1
        self._mark_closed(f"no acknowledgement after {tries} tries")
        raise ConnectionClosed(f"serial link lost: packet {seq} was not acknowledged after "
                               f"{tries} tries")

    def _mark_closed(self, reason: str) -> None:
        with self.link.cond:
            if self.closed_reason is None:
                self.closed_reason = reason
            self.link.cond.notify_all()

    def _on_data(self, seq: int, payload: bytes) -> None:
        # Called with link.cond held; the ACK goes out after the batch (_take_ack).
        if seq == self._rx_expected:
            self._rx += payload
            self._rx_expected += 1
            while self._rx_expected in self._rx_ahead:
                self._rx += self._rx_ahead.pop(self._rx_expected)
                self._rx_expected += 1
            self.link.cond.notify_all()
        elif seq < self._rx_expected or seq in self._rx_ahead:
            self.link.stats.duplicates += 1
        elif seq < self._rx_expected + RX_AHEAD:
            self._rx_ahead[seq] = payload  # past a gap: kept until the gap is filled
        else:
            return  # too far ahead to keep: the sender resends it
        self._ack_due = True

    def _take_ack(self) -> Optional[int]:
        """The cumulative ACK owed after a batch of packets (None: none owed or nothing
        delivered yet). Called with link.cond held."""
        if not self._ack_due or self._rx_expected == 0:
            return None
        self._ack_due = False
        return self._rx_expected - 1

    def _on_ack(self, seq: int) -> None:
        # Called with link.cond held.
        if seq >= self._tx_next:
            return  # acknowledges a packet never sent: not ours to believe
        if seq > self._acked:
            for done in range(self._acked + 1, seq + 1):
                self._unacked.pop(done, None)
            self._acked = seq
            self._timer_start = time.monotonic()
            self._timeouts = self._dup_acks = 0
            self.link.cond.notify_all()
        elif seq == self._acked and self._unacked:
            self._dup_acks += 1
            if self._dup_acks >= 2 and self._fast_resent != seq + 1:
                self._fast_resend = True
                self.link.cond.notify_all()


class SerialLink:
    """Owns the port and a reader thread. The host calls connect(); the board calls accept()."""

    def __init__(self, port: Any, *, role: str, payload_bytes: int = DEFAULT_PAYLOAD,
                 ack_timeout: float = 0.25, retries: int = 20, version: bytes = LINK_VERSION,
                 window: int = DEFAULT_WINDOW, keepalive: bool = True):
        if role not in ("host", "board"):
            raise ValueError("role must be 'host' or 'board'")
        self.port = port
        self.role = role
        self.payload_bytes = payload_bytes
        self.ack_timeout = ack_timeout
        # the host probes a board it waits on (keepalive_for); a board only answers
        self.keepalive_s, self.dead_after_s = keepalive_for(ack_timeout) \
            if keepalive and role == "host" else (None, None)
        self.retries = retries
        self.window = window
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
                session = self.session
            if session is not None:
                if self.keepalive_s:  # learn now whether the board answers probes
                    self._write_packet(PING, session.id, 0)
                return session
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
            self._send_ack()

    def _send_ack(self) -> None:
        """One cumulative ACK for the packets of the batch just read, if any are owed."""
        with self.cond:
            session = self.session
            seq = session._take_ack() if session is not None else None
        if seq is not None:
            self._write_packet(ACK, session.id, seq)

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
                if self.role == "board" and kind in (DATA, PING):
                    # a host still on a session this agent does not hold (it was started
                    # again): say so, rather than leave the host to its timeout
                    self._write_packet(FIN, session_id, 0, NO_SESSION)
                return  # a leftover of an older session
            else:
                current._heard = time.monotonic()
                if kind == DATA:
                    current._on_data(seq, payload)
                elif kind == ACK:
                    current._on_ack(seq)
                elif kind == PING:
                    self._write_packet(PONG, session_id, 0)
                elif kind == PONG:
                    current._answers_probes = True
                    self.cond.notify_all()
                elif kind == FIN and payload == NO_SESSION:
                    current._lost = True
                    current._mark_closed("the board's agent holds no such session (it was "
                                         "started again)")
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
