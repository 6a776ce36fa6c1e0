"""Old agent archives on the board (WORKDIR/agents/<sha>.pyz, one per agent version pushed)
piled up: a daemon starting removes those nothing can still need, and never one that a live
process runs, the current one, or one just pushed."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from helpers.bad_inputs import cli, env
from helpers.board_fixtures import local_board

pytestmark = pytest.mark.loopback


def _archive(agents, name, age_s):
    path = agents / name
    path.write_bytes(b"an older agent's archive")
    then = time.time() - age_s
    os.utime(path, (then, then))
    return path


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc to see what runs")
def test_a_starting_daemon_removes_old_archives_but_none_in_use(tmp_path):
    agents = tmp_path / "board" / "agents"
    agents.mkdir(parents=True)
    old = _archive(agents, "00000000000000aa.pyz", 86400)
    running = _archive(agents, "00000000000000bb.pyz", 86400)
    just_pushed = _archive(agents, "00000000000000cc.pyz", 5)
    not_ours = _archive(agents, "my-build.pyz", 86400)  # not named by content: not the host's
    # a process of an earlier agent, still running (a job the new daemon adopts, say)
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)",
                               str(running)])
    try:
        with local_board(tmp_path, "bench"):
            proc = cli("job", "sysinfo", "--device", "bench",
                       environ=env(EDGE_REMAT_DEVICE_CONFIGS=str(tmp_path / "configs"),
                                   XDG_CACHE_HOME=str(tmp_path / "cache")))
            assert proc.returncode == 0, proc.stderr
            current = (tmp_path / "board" / "agent.current").read_text().strip()
    finally:
        holder.kill()
        holder.wait()
    left = {p.name for p in agents.glob("*.pyz")}
    assert old.name not in left, left
    assert {running.name, just_pushed.name, not_ours.name, current} <= left, left
    assert "removed 1 old agent archive(s): 00000000000000aa.pyz" in \
        (tmp_path / "board" / "daemon.log").read_text()


def test_a_starting_daemon_removes_what_an_earlier_agent_paged_into_a_folder_named_tilde(
        tmp_path):
    """Before 7f5af9a a run took page_dir "~/..." as WORKDIR/~/...: a 1.1B model's weight
    store (4.4 GB) and dead page stores stayed there. A daemon starting removes those, by the
    names the agent gives them; anything else of the user's there stays."""
    pages = tmp_path / "board" / "~" / ".cache" / "edge-remat" / "local-board" / "pages"
    weights = pages / "edge-remat-weights"
    weights.mkdir(parents=True)
    (weights / "tinyllama-1.1b-lora-0123456789abcdef.weights").write_bytes(b"w" * 4096)
    dead_store = pages / "edge-remat-pages-999999-0badf00d"
    dead_store.mkdir()
    (dead_store / "page.bin").write_bytes(b"p" * 1024)
    mine = tmp_path / "board" / "~" / "notes.txt"
    mine.write_text("not the agent's")
    with local_board(tmp_path, "bench"):
        proc = cli("job", "sysinfo", "--device", "bench",
                   environ=env(EDGE_REMAT_DEVICE_CONFIGS=str(tmp_path / "configs"),
                               XDG_CACHE_HOME=str(tmp_path / "cache")))
        assert proc.returncode == 0, proc.stderr
    assert not weights.exists() and not dead_store.exists()
    assert not (tmp_path / "board" / "~" / ".cache").exists()  # the folders left empty
    assert mine.read_text() == "not the agent's"
    assert "removed 5120 bytes an earlier agent paged into" in \
        (tmp_path / "board" / "daemon.log").read_text()
