"""`--solver milp` keeps to the time limit: its re-solves share it, model building counts,
CBC's preprocessing cut short by the limit is a timeout, not a proof of infeasibility, and CBC
is stopped where its own limit does not reach."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.exact_problems import problem
from helpers.small_graphs import training_chain

from edge_remat.planner import isolated
from edge_remat.planner.evaluate import evaluate
from edge_remat.planner.milp import MilpOutcome, _cbc_preprocessing_cut_short
from edge_remat.planner.solve import solve
from edge_remat.planner.stages import StageDecision

ROOT = Path(__file__).resolve().parents[1]
# CBC cannot be stopped while it reads the model and its warm start and preprocesses: the
# plan may end this much past --time-limit (docs/planner.md)
MILP_OVERRUN_S = 1.5


def test_milp_resolves_share_the_time_limit(monkeypatch):
    """A MILP plan the simulator rejects by a hair is re-solved with a tighter budget: each
    re-solve once had the whole time limit again (10 s became 20 s)."""
    p = problem(training_chain(3, 1), 0.5)
    # the plain schedule, keeping every tensor: above a budget of half its peak
    over_budget = [StageDecision([t], set(range(t + 1))) for t in range(p.n)]
    assert not evaluate(p, over_budget).feasible
    calls = []

    def slow_milp(library, function, p, time_limit, *args, **kwargs):
        calls.append(time_limit)
        time.sleep(time_limit)  # a solver that uses all the time it is given
        return MilpOutcome(over_budget, "timeout", 1.0, None, time_limit, "cbc")

    monkeypatch.setattr(isolated, "call", slow_milp)
    report = solve(p, "milp", time_limit=2.0)
    assert len(calls) == 1, calls  # under a second left: no re-solve
    assert report.plan.solver["solve_time_s"] <= 2.0 + 0.5
    assert report.plan.solver["name"].startswith("heuristic:")  # the MILP's plan does not fit


def test_cbc_preprocessing_cut_short_is_not_infeasible():
    cut = ("Pre-processing says infeasible or unbounded\n"
           "Total time (CPU seconds):       1.78   (Wallclock seconds):       2.62\n")
    assert _cbc_preprocessing_cut_short_text(cut, 1.74)
    assert not _cbc_preprocessing_cut_short_text(cut, 10.0)  # within its limit: a proof
    assert not _cbc_preprocessing_cut_short_text("Result - Stopped on time limit\n", 1.0)


def _cbc_preprocessing_cut_short_text(text: str, limit: float) -> bool:
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "cbc.log"
        log.write_text(text)
        return _cbc_preprocessing_cut_short(log, limit)


def test_milp_plan_keeps_to_a_short_time_limit(tmp_path):
    """examples/my_model.py at half its activations with paging (12,407 columns): at 2-4 s
    CBC's preprocessing, cut off, said "infeasible" and the plan took 4.9-5.6 s."""
    env_cmd = [sys.executable, "-m", "edge_remat"]
    graph, plan = tmp_path / "my_model.json", tmp_path / "plan.json"
    made = subprocess.run([*env_cmd, "graph", "--model",
                           f"{ROOT / 'examples' / 'my_model.py'}:make_model", "--batch", "16",
                           "-o", graph], capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    limit = 3.0
    proc = subprocess.run([*env_cmd, "plan", "--graph", graph, "--profile",
                           ROOT / "profiles" / "jetson-orin-nano.json", "--budget", "50%",
                           "--solver", "milp", "--time-limit", str(limit), "--arena", "none",
                           "-o", plan], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    solver = json.loads(plan.read_text())["solver"]
    assert solver["solve_time_s"] <= limit + MILP_OVERRUN_S
    assert "infeasible" not in solver.get("fallback_from", ""), solver


@pytest.mark.slow  # a 40 s plan
def test_cbc_is_stopped_at_the_time_limit_where_its_own_limit_does_not_reach(tmp_path):
    """digits-cnn (192 nodes) at 30% with paging is a MILP of 149,096 columns with the Pi's
    flash (204,296 with a measured profile's flash and host tiers) whose root LP CBC's limit
    does not interrupt: 133 s of it under -sec 38.6, and `plan --time-limit 60` took 187 s;
    here, at 25 s, CBC still ran at 400 s (2026-12-05). CBC is stopped when the limit has
    passed; the heuristics' plan stands and says so."""
    env_cmd = [sys.executable, "-m", "edge_remat"]
    graph, plan = tmp_path / "digits.json", tmp_path / "plan.json"
    made = subprocess.run([*env_cmd, "graph", "--model", "digits-cnn", "-o", graph],
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    # a quarter of it may build the model (5-6 s here alone, more beside other tests), so
    # that CBC is started; its root LP then runs for minutes
    limit = 40.0
    proc = subprocess.run([*env_cmd, "plan", "--graph", graph, "--profile",
                           ROOT / "profiles" / "rpi4.json", "--budget", "30%", "--solver", "milp",
                           "--time-limit", str(limit), "--arena", "none", "-o", plan],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    solver = json.loads(plan.read_text())["solver"]
    assert solver["solve_time_s"] <= limit + MILP_OVERRUN_S
    if solver["fallback_from"] == "milp:cbc build-timeout":
        # the whole suite beside it once slowed the build past its share (5-6 s alone): the
        # limit held, but CBC never started, so its watchdog was not what this run tested
        pytest.skip("the MILP's build took its share of the limit on this loaded host, so "
                    "CBC did not start")
    assert solver["fallback_from"] == "milp:cbc stopped at the time limit", solver


def test_a_crashed_cbc_is_no_internal_error(monkeypatch):
    """CBC exiting non-zero was an internal error; now the MILP has no answer (status
    "failed") and the heuristics' plan stands."""
    import pulp

    def crash(self, solver=None, **kwargs):
        raise pulp.PulpSolverError("Pulp: Error while trying to execute")

    monkeypatch.setattr(pulp.LpProblem, "solve", crash)
    from edge_remat.planner.milp import solve_milp
    outcome = solve_milp(problem(training_chain(3, 1), 0.5), time_limit=5, threads=1)
    assert outcome.status == "failed" and outcome.decisions is None
