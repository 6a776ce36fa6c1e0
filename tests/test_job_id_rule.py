"""A job id the board would refuse: `job --id .hidden` is refused on the host before anything
is sent, and the board's own refusal (another host's submit) says the same rule: an id starts
with a letter or digit. QA: '.hidden' was refused by a message that listed '.' as allowed."""

from __future__ import annotations

import socket
import subprocess

import pytest

from helpers.bad_inputs import BAD_INPUT, cli, env, refused
from helpers.board_fixtures import agent_command
from edge_remat_agent.wire.framing import FrameStream
from edge_remat_agent.wire.protocol import Client, RemoteError

pytestmark = pytest.mark.loopback

RULE = "starts with a letter or digit"


@pytest.mark.parametrize("job_id", [".hidden", "-x", "a" * 65, "a/b"])
def test_a_job_id_the_board_would_refuse_is_refused_before_anything_is_sent(tmp_path, bench,
                                                                            job_id):
    line = refused(cli("job", "sleep", "--device", "bench", "--id", job_id, environ=env()),
                   BAD_INPUT, f"--id {job_id!r}", RULE, "at most 64")
    assert "(letters, digits" not in line, line
    assert not bench.exists(), "something was sent to the board"


def test_the_boards_own_refusal_of_a_job_id_states_the_rule(tmp_path):
    proc = subprocess.Popen(agent_command() + ["serve", "--tcp", "127.0.0.1:0", "--workdir",
                                               str(tmp_path / "board")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("listening on"), proc.stderr.read()
        port = int(line.strip().rsplit(":", 1)[1])
        client = Client(FrameStream(socket.create_connection(("127.0.0.1", port))))
        with pytest.raises(RemoteError) as err:
            client.call("submit", kind="echo", params={}, job=".hidden")
        assert "'.hidden'" in str(err.value) and RULE in str(err.value), str(err.value)
    finally:
        proc.terminate()
        proc.wait(15)
