"""Helpers for the bad-input catalogue (tests/test_bad_inputs_*.py): the real `edge-remat`
command as a subprocess, and the one check every case makes: the documented exit status, one
`error:` line on stderr, no traceback, and no file left behind that was not there before."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterable, Optional

REPO = Path(__file__).resolve().parents[2]
COMMAND = [sys.executable, "-m", "edge_remat.cli"]

# The exit statuses the README documents (host/edge_remat/errors.py).
JOB_FAILED, BAD_INPUT, UNREACHABLE, KILLED, INTERNAL, INTERRUPTED = 1, 2, 3, 4, 70, 130


# A finder that sends SIGINT to this process from inside the import of argv[1] (popped), the
# first time that module is asked for, and goes on importing: every run lands the Ctrl-C at
# the same place. Put before the code whose imports are to be interrupted.
SIGINT_INSIDE_IMPORT = """import os, signal, sys, time
TARGET = sys.argv.pop(1)
class SigintInside:
    fired = False
    def find_spec(self, name, path=None, target=None):
        if name == TARGET and not self.fired:
            self.fired = True
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.1)  # Python takes the signal here, inside the import
        return None
sys.meta_path.insert(0, SigintInside())
"""


def env(**extra: str) -> dict:
    path = os.pathsep.join([str(REPO / "host"), str(REPO / "agent"),
                            os.environ.get("PYTHONPATH", "")])
    return dict(os.environ, PYTHONPATH=path, COLUMNS="100", NO_COLOR="1", **extra)


def cli(*args, cwd: "Path | str | None" = None, timeout: float = 120,
        environ: Optional[dict] = None) -> subprocess.CompletedProcess:
    return subprocess.run([*COMMAND, *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout, env=environ or env())


def wait_for_line(proc: subprocess.Popen, needle: str, timeout: float = 60) -> list:
    """stderr lines of `proc` until one holds `needle` (a job's progress: it runs on the
    board); the process is killed and the test fails with what it said if none does."""
    seen, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        seen.append(line)
        if needle in line:
            return seen
    proc.kill()
    raise AssertionError(f"never saw {needle!r}: {seen}")


def tree(folder: Path) -> set:
    return {p.relative_to(folder) for p in folder.rglob("*")} if folder.exists() else set()


def refused(proc: subprocess.CompletedProcess, status: int, *words: str,
            json_out: bool = False) -> str:
    """The one error line (checked: status, single line, no traceback, each of `words`)."""
    everything = proc.stdout + proc.stderr
    assert proc.returncode == status, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in everything, everything
    lines = [line for line in proc.stderr.splitlines()
             if line.strip() and not line.startswith(("job ", "warning: "))]
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], proc.stderr
    line = errors[0]
    for word in words:
        assert word.lower() in line.lower(), (word, line)
    if json_out:
        obj = json.loads(proc.stdout.strip().splitlines()[-1])
        assert obj["error"] and obj["status"], obj
    return line


def no_new_files(before: set, folder: Path, allowed: Iterable[str] = ()) -> None:
    new = {str(p) for p in tree(folder) - before} - set(allowed)
    assert not new, f"left behind: {sorted(new)}"


def tiny_graph(folder: Path, name: str = "tiny.json", **overrides) -> Path:
    """Five nodes in our own format (plain peak 3.1 MB); `overrides` replace graph fields."""
    nodes = [("a", "forward", [], 1_000_000, 1.0), ("b", "forward", ["a"], 1_000_000, 2.0),
             ("l", "loss", ["b"], 100_000, 0.5), ("gb", "backward", ["l", "b"], 1_000_000, 2.0),
             ("ga", "backward", ["gb", "a"], 100_000, 1.0)]
    graph = {"format": "edge-remat/graph", "version": 1, "name": "tiny",
             "nodes": [{"id": i, "kind": k, "op": k, "inputs": ins, "out_bytes": size,
                        "time_s": t} for i, k, ins, size, t in nodes]}
    graph.update(overrides)
    path = folder / name
    path.write_text(json.dumps(graph))
    return path


def tiny_plan(folder: Path, graph: Path, name: str = "plan.json", budget: str = "1.0") -> Path:
    path = folder / name
    proc = cli("plan", "--graph", graph, "--budget", budget, "--solver", "heuristic:split",
               "-o", path)
    assert proc.returncode == 0, proc.stderr
    return path
