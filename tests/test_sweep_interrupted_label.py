"""A sweep stopped by Ctrl-C names the budget it stopped at by the sweep's own label (the
table's, the plan file's and sweep.json's `label`: sweep.fraction_labels), not by `:g`. QA:
`plan --sweep 0.900:0.910:0.005 -o DIR` stopped in its second budget said 'interrupted
(Ctrl-C) at budget 0.9' over a table of 0.900 and a plan-0.900.json.

The real CLI in a subprocess whose second solve sends itself SIGINT (as a Ctrl-C in the
terminal would), so the stop comes at a known budget without timing a signal from outside."""

from __future__ import annotations

import json
import subprocess
import sys

from helpers.bad_inputs import INTERRUPTED, env, refused, tiny_graph

SECOND_SOLVE_INTERRUPTED = """
import os, runpy, signal, sys, time
import edge_remat.sweep as sweep
real, solved = sweep.solve, []
def solve(*args, **kwargs):
    if solved:  # the second budget: Ctrl-C while it solves
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(60)
    solved.append(True)
    return real(*args, **kwargs)
sweep.solve = solve
sys.argv = ["edge-remat", *sys.argv[1:]]
runpy.run_module("edge_remat.cli", run_name="__main__")
"""


def test_an_interrupted_sweep_names_the_budget_by_its_label(tmp_path):
    out = tmp_path / "sweep"
    proc = subprocess.run([sys.executable, "-c", SECOND_SOLVE_INTERRUPTED, "plan", "--graph",
                           tiny_graph(tmp_path), "--sweep", "0.900:0.910:0.005", "--solver",
                           "heuristic:split", "-o", out], capture_output=True, text=True,
                          env=env(), timeout=60)
    line = refused(proc, INTERRUPTED)
    assert line.startswith("error: interrupted (Ctrl-C) at budget 0.900; the 1 budget(s) "
                           "above are what was solved"), line
    table = json.loads((out / "sweep.json").read_text())
    assert [row["label"] for row in table["sweep"]] == ["0.900"]
    assert table["error"] == line.removeprefix("error: ")
    assert sorted(p.name for p in out.iterdir()) == ["plan-0.900.json", "sweep.json"]
    assert " 0.900 " in proc.stdout, proc.stdout
