"""The wire layer: COBS, frames, serial packets (CRC32 + seq) and the reliable serial link
under corruption, loss and repeats."""

from __future__ import annotations

import os
import socket
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge_remat_agent.wire import cobs
from edge_remat_agent.wire.framing import (MAGIC, ConnectionClosed, FrameStream, ProtocolError,
                                           encode_frame)
from edge_remat_agent.wire.protocol import Client
from edge_remat_agent.wire.serial_link import (ACK, DATA, PacketError, SerialLink,
                                               decode_packet, encode_packet)

# -- COBS ----------------------------------------------------------------------------------


@pytest.mark.parametrize("raw, encoded", [
    (b"", b"\x01"),
    (b"\x00", b"\x01\x01"),
    (b"\x00\x00", b"\x01\x01\x01"),
    (b"\x11\x22\x00\x33", b"\x03\x11\x22\x02\x33"),
    (b"\x11\x00\x00\x00", b"\x02\x11\x01\x01\x01"),
    (bytes(range(1, 255)), b"\xff" + bytes(range(1, 255)) + b"\x01"),
])
def test_cobs_known_vectors(raw, encoded):
    assert cobs.encode(raw) == encoded
    assert cobs.decode(encoded) == raw


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2000))
def test_cobs_round_trip_has_no_zero_and_bounded_overhead(data):
    encoded = cobs.encode(data)
    assert b"\x00" not in encoded
    assert len(encoded) <= len(data) + len(data) // 254 + 1
    assert cobs.decode(encoded) == data


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([b"\x00", b"\x01", b"\xff", b"\x00" * 3, b"\x05" * 300]),
                max_size=20))
def test_cobs_round_trip_runs_of_zeros_and_long_runs(parts):
    data = b"".join(parts)
    assert cobs.decode(cobs.encode(data)) == data


def test_cobs_rejects_impossible_input():
    with pytest.raises(cobs.CobsError):
        cobs.decode(b"\x05\x11")  # claims 4 bytes, has 1
    with pytest.raises(cobs.CobsError):
        cobs.decode(b"\x03\x11\x00")


# -- frames --------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**53, 2**53) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12)


@pytest.fixture(scope="module")
def socket_pair():
    a, b = socket.socketpair()
    yield FrameStream(a), FrameStream(b)
    a.close()
    b.close()


@settings(max_examples=100, deadline=None)
@given(header=st.dictionaries(st.text(max_size=10), json_values, max_size=6),
       body=st.binary(max_size=5000))
def test_frame_round_trip(socket_pair, header, body):
    sender, receiver = socket_pair  # small frames fit in the socket buffer: no thread needed
    sender.send(header, body)
    assert receiver.recv() == (header, body)


def test_frames_back_to_back_and_large_body():
    a, b = socket.socketpair()
    body = os.urandom(3 << 20)
    sender = FrameStream(a)
    thread = threading.Thread(target=lambda: [sender.send({"n": i}, body if i == 1 else b"")
                                              for i in range(3)])
    thread.start()
    receiver = FrameStream(b)
    assert [receiver.recv() for _ in range(3)] == [({"n": 0}, b""), ({"n": 1}, body),
                                                    ({"n": 2}, b"")]
    thread.join()


def test_noise_before_the_first_frame_is_skipped_and_kept():
    a, b = socket.socketpair()
    a.sendall(b"Welcome to Ubuntu 18.04\nlast login: yesterday\n" + encode_frame({"ok": 1}))
    stream = FrameStream(b, skip_noise=True)
    assert stream.recv() == ({"ok": 1}, b"")
    assert b"Welcome" in stream.noise


def test_bad_magic_and_huge_lengths_are_protocol_errors():
    a, b = socket.socketpair()
    a.sendall(b"XXXX" + bytes(8))
    with pytest.raises(ProtocolError, match="magic"):
        FrameStream(b).recv()
    a, b = socket.socketpair()
    a.sendall(MAGIC + (2**31).to_bytes(4, "big") + bytes(4))
    with pytest.raises(ProtocolError, match="limits"):
        FrameStream(b).recv()


def test_stream_ending_mid_frame_is_connection_closed():
    a, b = socket.socketpair()
    a.sendall(encode_frame({"x": 1}, b"0123456789")[:-3])
    a.close()
    with pytest.raises(ConnectionClosed, match="middle of a frame"):
        FrameStream(b).recv()


def test_client_skips_answers_to_abandoned_requests():
    a, b = socket.socketpair()
    server = FrameStream(b)

    def answer():
        request, _ = server.recv()
        server.send({"type": "reply", "id": request["id"] - 1, "stale": True})  # an old answer
        server.send({"type": "reply", "id": request["id"], "fresh": True})

    threading.Thread(target=answer).start()
    header, _ = Client(FrameStream(a)).call("ping")
    assert header.get("fresh") and not header.get("stale")


# -- serial packets ------------------------------------------------------------------------

def test_packet_round_trip():
    packet = encode_packet(DATA, 0xDEADBEEF, 7, b"\x00payload\x00")
    assert packet.endswith(b"\x00") and b"\x00" not in packet[:-1]
    assert decode_packet(packet[:-1]) == (DATA, 0xDEADBEEF, 7, b"\x00payload\x00")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.data())
def test_any_single_bit_flip_is_detected(payload, data):
    encoded = bytearray(encode_packet(DATA, 1, 2, payload)[:-1])
    bit = data.draw(st.integers(0, len(encoded) * 8 - 1))
    encoded[bit // 8] ^= 1 << (bit % 8)
    with pytest.raises(PacketError):
        decode_packet(bytes(encoded))


# -- the reliable link ---------------------------------------------------------------------

class LossyPort:
    """One end of a socketpair as a serial port that corrupts, drops or repeats chosen
    packets (each write is one packet)."""

    def __init__(self, sock, corrupt=(), drop=(), drop_acks=(), repeat=()):
        self.sock = sock
        self.sock.settimeout(0.05)
        self.corrupt, self.drop, self.drop_acks, self.repeat = (set(corrupt), set(drop),
                                                                set(drop_acks), set(repeat))
        self.data_packets = 0
        self.acks = 0

    def read(self, n):
        try:
            return self.sock.recv(n)
        except socket.timeout:
            return b""
        except OSError:
            return b""

    def write(self, packet):
        kind = decode_packet(packet[:-1])[0]
        if kind == DATA:
            index, self.data_packets = self.data_packets, self.data_packets + 1
            if index in self.drop:
                return
            if index in self.corrupt:
                damaged = bytearray(packet)
                damaged[len(damaged) // 2] ^= 0x10
                packet = bytes(damaged)
            if index in self.repeat:
                packet = packet + packet
        elif kind == ACK:
            index, self.acks = self.acks, self.acks + 1
            if index in self.drop_acks:
                return
        self.sock.sendall(packet)

    def close(self):
        self.sock.close()


def _link_pair(host_faults=None, board_faults=None):
    a, b = socket.socketpair()
    host = SerialLink(LossyPort(a, **(host_faults or {})), role="host", ack_timeout=0.05,
                      payload_bytes=256)
    board = SerialLink(LossyPort(b, **(board_faults or {})), role="board", ack_timeout=0.05,
                       payload_bytes=256)
    return host, board


def _read_exactly(session, count):
    session.settimeout(10)
    data = bytearray()
    while len(data) < count:
        chunk = session.recv(count - len(data))
        assert chunk, "session closed early"
        data += chunk
    return bytes(data)


def test_link_delivers_exactly_once_through_corruption_loss_and_repeats():
    host, board = _link_pair(host_faults={"corrupt": {2, 9}, "drop": {5}, "repeat": {12}},
                             board_faults={"drop_acks": {3, 4}, "corrupt": {1}})
    try:
        host_session = host.connect(timeout=5)
        board_session = board.accept(timeout=5)
        up, down = os.urandom(20_000), os.urandom(7_000)
        sender = threading.Thread(target=host_session.sendall, args=(up,))
        sender.start()
        board_session.sendall(down)
        assert _read_exactly(board_session, len(up)) == up
        assert _read_exactly(host_session, len(down)) == down
        sender.join()
        assert host.stats.resent >= 3  # two corrupted, one dropped
        assert board.stats.corrupt >= 2
        # The repeat is re-acked, not re-delivered. (A lost ACK is usually covered by the next,
        # cumulative one, so it need not cause a repeat of its own.)
        assert board.stats.duplicates >= 1
        assert host.stats.corrupt >= 1
    finally:
        host.close()
        board.close()


def test_new_session_ends_the_old_one_on_the_board():
    host, board = _link_pair()
    try:
        host.connect(timeout=5)
        first = board.accept(timeout=5)
        second_host = host.connect(timeout=5)
        second = board.accept(timeout=5)
        assert first.recv(10) == b""  # closed: a host that reconnects starts afresh
        second_host.sendall(b"hello")
        assert _read_exactly(second, 5) == b"hello"
    finally:
        host.close()
        board.close()


def test_unanswered_link_gives_up_with_a_clear_error():
    a, b = socket.socketpair()
    host = SerialLink(LossyPort(a), role="host", ack_timeout=0.02, retries=3)
    try:
        with pytest.raises(TimeoutError, match="no agent answered"):
            host.connect(timeout=0.3)
    finally:
        host.close()
        b.close()


def test_link_version_mismatch_is_named():
    a, b = socket.socketpair()
    host = SerialLink(LossyPort(a), role="host", ack_timeout=0.05, version=b"ERs9")
    board = SerialLink(LossyPort(b), role="board", ack_timeout=0.05)
    try:
        with pytest.raises(ConnectionError, match="link version b'ERs1', this host b'ERs9'"):
            host.connect(timeout=2)
    finally:
        host.close()
        board.close()
