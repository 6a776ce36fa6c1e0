"""`edge-remat run` on a board it cannot reach ran nothing there, and leaves OUT as it found
it: one it made is gone again, one that was there keeps what it held (an earlier run's
graph.json as it was). QA, an SSH device config to a closed port on 127.0.0.1: "error:
cannot reach u@127.0.0.1:P: Connection refused ...", exit 3, and OUT/graph.json was left
behind (written after the capture, before the board was first reached), and with a profile
given plan.json too, an earlier run's files replaced."""

from __future__ import annotations

import socket

import pytest

from helpers.bad_inputs import REPO, UNREACHABLE, cli, refused, tree


def closed_port() -> int:
    with socket.socket() as sock:  # a port just free: nothing listens there
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("earlier", [False, True], ids=["OUT made by the run",
                                                        "OUT of an earlier run"])
def test_a_run_that_never_reaches_its_board_leaves_out_as_it_was(tmp_path, earlier):
    config = tmp_path / "gone.toml"
    config.write_text(f'name = "gone"\n[connection]\nkind = "ssh"\nhost = "127.0.0.1"\n'
                      f'port = {closed_port()}\nuser = "u"\nconnect_timeout_s = 2\n'
                      'reconnect_timeout_s = 0\n[hardware]\nsensor = "none"\n')
    out = tmp_path / "out"
    if earlier:
        out.mkdir()
        (out / "graph.json").write_text("an earlier run's\n")
        (out / "notes.txt").write_text("the user's\n")
        (out / "plan.json").write_text("an earlier run's\n")
    before = tree(tmp_path)
    # the earlier run's OUT with a profile given: plan.json was written too, the board first
    # reached after planning
    given = ["--profile", REPO / "profiles" / "this-machine.json"] if earlier else []
    proc = cli("run", "--device", config, "--model", "mlp", "--budget", "90%", "--steps", "2",
               "--out", out, *given)
    refused(proc, UNREACHABLE, "cannot reach u@127.0.0.1", "Connection refused")
    assert tree(tmp_path) == before, sorted(map(str, tree(tmp_path) - before))
    if earlier:
        assert (out / "graph.json").read_text() == "an earlier run's\n"
        assert (out / "plan.json").read_text() == "an earlier run's\n"
        assert (out / "notes.txt").read_text() == "the user's\n"
