"""The serial link's sliding window: several packets in flight, cumulative ACKs, resends on
repeated ACKs and on timeouts. Exactly-once, in-order delivery both ways at once through a line
that drops, flips, cuts and repeats bytes at random; packets really in flight together (a line
whose ACKs come back late is not paid once a packet); and a windowed sender talking to a
receiver that knows only stop-and-wait (drops packets past a gap, acknowledges each in-order
packet at once), as an agent from before the window does."""

from __future__ import annotations

import os
import random
import socket
import threading
import time

import pytest

from edge_remat_agent.wire import serial_link
from edge_remat_agent.wire.serial_link import ACK, DATA, LinkSession, SerialLink, decode_packet


class NoisyPort:
    """One end of a socketpair as a serial line with faults drawn from a seeded generator:
    each written packet may be dropped, have a bit flipped, lose a run of bytes, or be
    written twice."""

    def __init__(self, sock, seed: int, drop=0.0, flip=0.0, cut=0.0, repeat=0.0):
        self.sock = sock
        self.sock.settimeout(0.05)
        self.rng = random.Random(seed)
        self.drop, self.flip, self.cut, self.repeat = drop, flip, cut, repeat
        self.lock = threading.Lock()
        self.faults = 0
        self.data_lost = 0  # DATA packets dropped, flipped or cut: each needs a resend
        self.flipped = 0  # packets with a bit flipped: each reaches the peer as a bad CRC

    def read(self, n):
        try:
            return self.sock.recv(n)
        except (socket.timeout, OSError):
            return b""

    def write(self, packet):
        is_data = decode_packet(packet[:-1])[0] == DATA
        with self.lock:
            roll = self.rng.random()
            if roll < self.drop:
                self.faults += 1
                self.data_lost += is_data
                return
            roll -= self.drop
            if roll < self.flip:
                self.faults += 1
                self.data_lost += is_data
                self.flipped += 1
                damaged = bytearray(packet)
                bit = self.rng.randrange(len(damaged) * 8)
                damaged[bit // 8] ^= 1 << (bit % 8)
                packet = bytes(damaged)
            elif roll - self.flip < self.cut:
                self.faults += 1
                self.data_lost += is_data
                start = self.rng.randrange(len(packet))
                packet = packet[:start] + packet[start + self.rng.randint(1, 40):]
            elif roll - self.flip - self.cut < self.repeat:
                self.faults += 1
                packet = packet + packet
        try:
            self.sock.sendall(packet)
        except OSError:
            pass

    def close(self):
        self.sock.close()


class LateAckPort(NoisyPort):
    """A clean line on which every ACK leaves `delay` seconds late (a slow turnaround, as a
    USB-serial adapter's latency timer makes), the writer not held up meanwhile."""

    def __init__(self, sock, delay: float):
        super().__init__(sock, seed=0)
        self.delay = delay

    def write(self, packet):
        if decode_packet(packet[:-1])[0] == ACK:
            timer = threading.Timer(self.delay, super().write, args=(packet,))
            timer.daemon = True
            timer.start()
        else:
            super().write(packet)


def _pair(host_port, board_port, *, window=16, payload=256, ack_timeout=0.05, retries=60):
    host = SerialLink(host_port, role="host", ack_timeout=ack_timeout, payload_bytes=payload,
                      window=window, retries=retries)
    board = SerialLink(board_port, role="board", ack_timeout=ack_timeout, payload_bytes=payload,
                       window=window, retries=retries)
    return host, board


def _read_exactly(session, count, timeout=30):
    session.settimeout(timeout)
    data = bytearray()
    while len(data) < count:
        chunk = session.recv(count - len(data))
        assert chunk, f"session closed early ({session.closed_reason})"
        data += chunk
    return bytes(data)


def _both_ways(host, board, up_bytes, down_bytes, timeout=60):
    host_session = host.connect(timeout=10)
    board_session = board.accept(timeout=10)
    up, down = os.urandom(up_bytes), os.urandom(down_bytes)
    errors = []

    def send(session, data):
        try:
            session.sendall(data)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    senders = [threading.Thread(target=send, args=(host_session, up)),
               threading.Thread(target=send, args=(board_session, down))]
    for sender in senders:
        sender.start()
    got_down = []
    reader = threading.Thread(target=lambda: got_down.append(
        _read_exactly(host_session, len(down), timeout)))
    reader.start()
    got_up = _read_exactly(board_session, len(up), timeout)
    reader.join(timeout)
    for sender in senders:
        sender.join(timeout)  # sendall returns once everything is acknowledged
    assert not errors, errors
    assert got_up == up, "upload arrived different"
    assert got_down == [down], "download arrived different"


@pytest.mark.parametrize("host_window, board_window, seed", [
    (16, 16, 1), (16, 16, 2), (1, 16, 3), (16, 1, 4), (4, 64, 5)])
def test_random_drops_flips_cuts_and_repeats_both_ways(host_window, board_window, seed):
    faults = dict(drop=0.04, flip=0.04, cut=0.03, repeat=0.03)
    a, b = socket.socketpair()
    host_port, board_port = NoisyPort(a, seed, **faults), NoisyPort(b, seed + 100, **faults)
    host, board = _pair(host_port, board_port)
    host.window, board.window = host_window, board_window
    try:
        _both_ways(host, board, 30_000, 15_000)
        assert host_port.faults + board_port.faults >= 10  # the line really was bad
        # Which packets the seeded faults hit depends on how the threads interleave, so each
        # side is held to what its own line did to it (a side whose data all got through
        # whole owes no resend).
        assert host_port.data_lost > 0 or board_port.data_lost > 0
        for port, link in ((host_port, host), (board_port, board)):
            assert port.data_lost == 0 or link.stats.resent > 0
        for sender, receiver in ((host_port, board), (board_port, host)):
            assert sender.flipped == 0 or receiver.stats.corrupt > 0
    finally:
        host.close()
        board.close()


def test_packets_are_in_flight_together():
    """60 packets against ACKs that each come back 50 ms late: stop-and-wait needs 3 s at
    least; a window of 16 about 4 round trips."""
    a, b = socket.socketpair()
    host, board = _pair(NoisyPort(a, 0), LateAckPort(b, 0.05), ack_timeout=1.0)
    try:
        host_session = host.connect(timeout=10)
        board_session = board.accept(timeout=10)
        data = os.urandom(60 * 256)
        started = time.monotonic()
        sender = threading.Thread(target=host_session.sendall, args=(data,))
        sender.start()
        assert _read_exactly(board_session, len(data)) == data
        sender.join(30)
        elapsed = time.monotonic() - started
        assert not sender.is_alive()
        assert elapsed < 1.5, f"{elapsed:.2f} s: packets waited for each other's ACKs"
        assert host.stats.resent == 0
    finally:
        host.close()
        board.close()


class StopAndWaitReceiver(LinkSession):
    """The receiving half of a link from before the window: delivers only the next packet in
    sequence (drops any past a gap) and acknowledges each packet it gets at once, by its own
    number."""

    def _on_data(self, seq, payload):
        if seq == self._rx_expected:
            self._rx += payload
            self._rx_expected += 1
            self.link.cond.notify_all()
        elif seq < self._rx_expected:
            self.link.stats.duplicates += 1
        else:
            return
        self.link._write_packet(ACK, self.id, seq)

    def _take_ack(self):
        return None


def test_a_windowed_sender_and_a_stop_and_wait_receiver_agree(monkeypatch):
    monkeypatch.setattr(serial_link, "LinkSession", StopAndWaitReceiver)  # both ends
    a, b = socket.socketpair()
    faults = dict(drop=0.03, flip=0.03)
    host, board = _pair(NoisyPort(a, 7, **faults), NoisyPort(b, 8, **faults))
    try:
        _both_ways(host, board, 40_000, 20_000)
        assert host.stats.resent > 0 and board.stats.resent > 0
    finally:
        host.close()
        board.close()


class DropDataPort(NoisyPort):
    """A clean line that loses the DATA packets written as the given indices (0, 1, ...)."""

    def __init__(self, sock, drop_data):
        super().__init__(sock, seed=0)
        self.drop_data, self.data_packets = set(drop_data), 0

    def write(self, packet):
        if decode_packet(packet[:-1])[0] == DATA:
            index, self.data_packets = self.data_packets, self.data_packets + 1
            if index in self.drop_data:
                return
        super().write(packet)


def test_a_lost_tail_is_resent_after_the_timeout():
    """The last packets of a burst have no later packet to reveal their loss (no repeated
    ACKs): the timeout resends what is unacknowledged, and the receiver delivers it once."""
    a, b = socket.socketpair()
    host, board = _pair(DropDataPort(a, drop_data={2, 3}), NoisyPort(b, 0), ack_timeout=0.5)
    try:
        host_session = host.connect(timeout=10)
        board_session = board.accept(timeout=10)
        data = os.urandom(4 * 256)  # packets 0..3; 2 and 3 lost the first time
        sender = threading.Thread(target=host_session.sendall, args=(data,))
        sender.start()
        assert _read_exactly(board_session, len(data)) == data
        sender.join(10)
        assert not sender.is_alive()
        assert host.stats.resent == 2 and board.stats.duplicates == 0
    finally:
        host.close()
        board.close()


def test_a_dead_line_gives_up_with_a_clear_error():
    a, b = socket.socketpair()
    host_port = NoisyPort(a, 0)
    host, board = _pair(host_port, NoisyPort(b, 0), retries=3)
    try:
        host_session = host.connect(timeout=10)
        board.accept(timeout=10)
        host_port.drop = 1.0  # everything from here on is lost
        started = time.monotonic()
        with pytest.raises(ConnectionError, match="packet 0 was not acknowledged after 4 tries"):
            host_session.sendall(os.urandom(1000))
        assert time.monotonic() - started < 5
        assert host.stats.resent == 3 * 4  # 4 packets in flight, all resent on each timeout
        assert host_session.closed_reason is not None
    finally:
        host.close()
        board.close()
