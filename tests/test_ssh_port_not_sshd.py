"""A port that answers with something other than SSH: the line says what it sent or that it
closed, at once; only a port that stays silent is said to have said nothing within the
config's connect_timeout_s (QA: an HTTP server's answer, 1.1 s after connecting, was reported
as "did not speak SSH within 10 s")."""

from __future__ import annotations

import time

import pytest
from helpers.not_sshd import HTTP_REPLY, OneShotServer

from edge_remat.devices import load_device
from edge_remat.transport import Board, BoardUnreachable


def unreachable(tmp_path, reply, timeout_s: int) -> "tuple[str, float]":
    server = OneShotServer(reply)
    path = tmp_path / "board.toml"
    path.write_text(f"""name = "board"
[connection]
kind = "ssh"
host = "127.0.0.1"
port = {server.port}
user = "nobody"
connect_timeout_s = {timeout_s}
reconnect_timeout_s = 0
known_hosts = "{tmp_path / 'known_hosts'}"
ssh_config = "none"
""")
    started = time.monotonic()
    try:
        with pytest.raises(BoardUnreachable) as err:
            Board(load_device(path), reconnect_timeout_s=0).hello()
    finally:
        server.close()
    return str(err.value), time.monotonic() - started


def test_an_http_server_is_quoted_not_timed(tmp_path):
    message, took = unreachable(tmp_path, HTTP_REPLY, 10)
    assert "did not speak SSH" in message and "'HTTP/1.1 400 Bad Request'" in message
    assert "closed the connection" in message and "within" not in message
    assert took < 5


def test_a_port_that_closes_at_once_says_it_closed(tmp_path):
    message, took = unreachable(tmp_path, b"", 10)
    assert "closed the connection" in message and "within" not in message
    assert took < 5


def test_a_silent_port_still_says_how_long_it_waited(tmp_path):
    message, _ = unreachable(tmp_path, None, 1)
    assert "did not speak SSH" in message and "within 1 s" in message
