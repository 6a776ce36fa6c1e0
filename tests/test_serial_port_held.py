"""A serial board's only link is held by the command that waits on its job (a real socat
pseudo-terminal pair): the line that says the job was sent offers Ctrl-C there, not the
job-status / job-cancel commands that cannot open the port meanwhile; and those commands,
run meanwhile, name the edge-remat process that holds it. QA: deploy --json's line offered
`job-cancel ID --device serialb`, which failed 'serial port ... is in use by another program
(close it and retry)', exit 3, and the job was never cancelled.
"""

from __future__ import annotations

import signal
import subprocess

import pytest

from helpers.bad_inputs import COMMAND, INTERRUPTED, UNREACHABLE, cli, env, refused, wait_for_line
from helpers.board_fixtures import PtyPair, agent_command, needs_socat, stop_agent

pytestmark = [needs_socat, pytest.mark.loopback]


@pytest.fixture
def serial_board(tmp_path):
    """`edge-remat-agent serve --serial` on the board's end; a device config for the other."""
    ptys = PtyPair(tmp_path).start()
    workdir = tmp_path / "board"
    agent = subprocess.Popen(agent_command() + ["serve", "--serial", ptys.board_end,
                                                "--workdir", str(workdir)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    config = tmp_path / "serialb.toml"
    config.write_text(f'name = "serialb"\n[connection]\nkind = "serial"\nport = '
                      f'"{ptys.host_end}"\nbaud = 921600\nconnect_timeout_s = 5\n'
                      'reconnect_timeout_s = 30\n')
    try:
        yield config, ptys.host_end
    finally:
        agent.terminate()
        agent.wait(10)
        stop_agent(workdir)
        ptys.kill()


def test_the_waiting_command_holds_the_port_and_says_how_to_stop_its_job(serial_board,
                                                                          tmp_path):
    config, port = serial_board
    environ = env(HOME=str(tmp_path / "home"))
    proc = subprocess.Popen([*COMMAND, "job", "sleep", "--device", str(config), "--param",
                             "seconds=60", "--param", "steps=60", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=environ)
    try:
        seen = wait_for_line(proc, "sent to serialb", timeout=120)
        sent = seen[-1]
        assert "job-cancel" not in sent and "job-status" not in sent, sent
        assert "Ctrl-C here cancels the job" in sent and f"serial port {port}" in sent, sent
        job_id = sent.split()[1]
        for args in (("job-cancel", job_id), ("job-status", job_id, "--wait")):
            refused(cli(*args, "--device", config, timeout=60, environ=environ), UNREACHABLE,
                    f"serial port {port} is held by a running `edge-remat job sleep` (pid "
                    f"{proc.pid})", "press Ctrl-C there")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == INTERRUPTED, err
        assert f"cancelled job {job_id}" in err, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
