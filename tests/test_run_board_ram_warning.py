"""`run` holds the plan against the board's memory by one rule, whether that is a memory limit
(--memory-limit, the emulated board) or the RAM the profile measured (an SSH board's, its
cgroup's limit where it runs in one): the plan's peak (not a budget it stays below), the
runtime's own memory and the headroom a run keeps.

QA on pi600 (an SSH board in a 600 MiB cgroup): `--budget 2GiB` was told "the budget, 2.00
GiB, is more than the 600.00 MiB of RAM ...: this plan will not fit there", and its plan of
318 MiB finished; `--budget 100%` peaked at the kernel's 600 MiB (341 MiB runtime + 259 MiB)
with no word, where a --memory-limit board warns "the limit may kill the run". A local board
stands in for the SSH board: the warning is the host's, from the profile's ram_total_bytes
and runtime_baseline_bytes, which a --profile with those set gives it (this machine's profile
otherwise, so nothing is profiled)."""

from __future__ import annotations

import json

import pytest
from helpers.board_fixtures import local_board
from helpers.local_runs import PROFILE

pytestmark = pytest.mark.slow  # two 1-step runs of digits-cnn through the CLI (~30 s)
MiB = 2**20


def _run(profile, budget, out):
    from typer.testing import CliRunner
    from edge_remat.cli import app
    result = CliRunner().invoke(app, ["run", "--device", "bench", "--model", "digits-cnn",
                                      "--budget", budget, "--steps", "1", "--profile",
                                      str(profile), "--no-plots", "--no-grad-check",
                                      "--time-limit", "3", "--out", str(out), "--json"])
    assert result.exit_code == 0, (result.stdout, result.stderr)
    # (not the profile's: it measured another graph's nodes, which is said too)
    return json.loads(result.stdout), [line for line in result.stderr.splitlines()
                                       if line.startswith("warning:") and " of RAM " in line]


def _board_of(tmp_path, name, ram_bytes):
    profile = json.loads(PROFILE.read_text())
    profile["ram_total_bytes"] = ram_bytes
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(profile))
    return path, profile["runtime_baseline_bytes"]


def test_the_boards_ram_is_held_against_the_plans_peak_and_the_runtime(tmp_path):
    roomy, runtime = _board_of(tmp_path, "roomy", 1200 * MiB)
    with local_board(tmp_path, "bench"):
        # a budget past the RAM, whose plan peaks well inside it: no warning
        report, warnings = _run(roomy, "2GiB", tmp_path / "roomy-out")
        peak = report["predicted_peak_bytes"]
        assert peak + runtime + 160 * MiB < 1200 * MiB, peak
        assert warnings == [], warnings
        # the plan and the runtime leave 50 MiB of the RAM: the limit's warning, in its words
        tight, _ = _board_of(tmp_path, "tight", runtime + peak + 50 * MiB)
        report, warnings = _run(tight, "100%", tmp_path / "tight-out")
    assert report["status"] == "finished"
    assert len(warnings) == 1, warnings
    assert f"and the runtime's own {runtime / MiB:.0f} MiB leave 50 MiB of the " \
           f"{(runtime + peak) / MiB + 50:.0f} MiB of RAM the profile of bench gives its " \
           "board for the allocator's slack, less than the 160 MiB a run keeps: the board's " \
           "out-of-memory killer may kill the run; give --budget " in warnings[0], warnings
