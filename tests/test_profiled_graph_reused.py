"""A profile `edge-remat profile --graph` measured feeds the runs of that graph on that board.

QA: `profile --device local --graph g.json --out P` and then `run` of the same model and batch
measured the board again (~30 s), with no word of P/profile.json. The profile job's profile is
now noted by board and graph fingerprint (run/profiles.py), and a run of that graph plans with
it, says so and caches it as its own.
"""

from __future__ import annotations

import json

import pytest
from helpers.bad_inputs import cli, env

pytestmark = pytest.mark.slow


def test_a_run_of_the_profiled_graph_plans_with_that_profile(tmp_path):
    environ = env(XDG_CACHE_HOME=str(tmp_path / "cache"))  # no profile cached before
    graph = tmp_path / "g.json"
    proc = cli("graph", "--model", "mlp", "--output", graph, environ=environ)
    assert proc.returncode == 0, proc.stderr
    # the board-wide measurements cut short: what is checked is which profile the run takes
    quick = [a for p in ("idle_s=0.1", "busy_s=0.1", "sizes=64KiB,1MiB", "share_s=0")
             for a in ("--param", p)]
    proc = cli("profile", "--device", "local", "--graph", graph, "--out", tmp_path / "P",
               *quick, environ=environ, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    measured = (tmp_path / "P" / "profile.json").resolve()

    def run(out):
        proc = cli("run", "--device", "local", "--model", "mlp", "--budget", "100%",
                   "--params-home", "ram", "--steps", "1", "--no-plots", "--no-grad-check",
                   "--out", tmp_path / out, environ=environ, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout + proc.stderr, json.loads((tmp_path / out / "report.json").read_text())

    said, report = run("run1")
    assert "profiling every graph node" not in said, said
    assert f"planning with {measured}, which `edge-remat profile` measured" in said
    assert report["profile"]["how"] == "cached" and report["profile"]["path"] == str(measured)
    # ... and kept in the run's cache: the next run finds it there
    said, report = run("run2")
    assert "profiling every graph node" not in said and "planning with" not in said
    assert report["profile"]["how"] == "cached"
