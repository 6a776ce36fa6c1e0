"""What the host says while it reconnects to a board whose link is gone: the cause once, then
a short "still reconnecting" line now and then, then the error. Through the real CLI, an SSH
board on loopback whose sshd is stopped while its job runs."""

from __future__ import annotations

import re
import subprocess
import time

import pytest

from helpers.bad_inputs import COMMAND, UNREACHABLE, env, refused
from helpers.board_fixtures import needs_sshd, stop_agent

pytestmark = [pytest.mark.slow, pytest.mark.loopback]

RECONNECT_S = 12  # the device's reconnect_timeout_s: a "still" line every 5 s (at most 30 s)


@needs_sshd
def test_reconnecting_says_the_cause_once_then_a_short_line_now_and_then(tmp_path,
                                                                         monkeypatch):
    """QA: with sshd gone, the host printed the identical line `emulated-arm64: cannot reach
    ...: Connection refused (...); reconnecting to wait for job ...` about 27 times in the 120 s
    before it gave up (here, in 12 s, about 7 times). Now each cause once (the link lost, then
    the refusal), then `still reconnecting ... (N s so far; gives up in M s)` at most every 5 s
    here (30 s at the default 120 s), then the error as before: exit 3."""
    from helpers.board_fixtures import SshServer, ssh_device_config
    (tmp_path / "sshd").mkdir()
    sshd = SshServer(tmp_path / "sshd").start()
    workdir = tmp_path / "board"
    ssh_device_config(tmp_path / "loopback.toml", sshd, workdir,
                      f"connect_timeout_s = 5\nreconnect_timeout_s = {RECONNECT_S}\n")
    monkeypatch.setenv("EDGE_REMAT_DEVICE_CONFIGS", str(tmp_path))
    try:
        proc = subprocess.Popen([*COMMAND, "job", "sleep", "--device", "loopback", "--param",
                                 "seconds=600", "--param", "steps=600"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env())
        seen = []
        while True:
            line = proc.stderr.readline()
            assert line, seen
            seen.append(line)
            if "step 1/600" in line:
                break
        sshd.stop()
        started = time.monotonic()
        stdout, err = proc.communicate(timeout=120)
        took = time.monotonic() - started
        refused(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, err),
                UNREACHABLE, "gave up reconnecting")
        lines = err.splitlines()
        # each cause once: the link lost (sshd's end closed), then sshd refusing
        cause = [line for line in lines if "; reconnecting to wait for job" in line]
        assert len(cause) == len(set(cause)) <= 2, err
        refusing = [line for line in cause if "Connection refused" in line]
        assert len(refusing) == 1 and refusing[0].startswith("loopback: cannot reach"), err
        still = [line for line in lines if "still reconnecting to wait for job" in line]
        assert len(still) <= took / 5 + 1, err
        assert still, err  # 12 s of trying: it said it was still at it
        for line in still:
            assert re.search(r"\(\d+ s so far; gives up in \d+ s\)$", line), line
            assert "Connection refused" not in line, line  # short: the cause was said once
        assert lines.index(refusing[0]) < lines.index(still[0]) < len(lines) - 1, err
    finally:
        stop_agent(workdir)
        sshd.stop()
