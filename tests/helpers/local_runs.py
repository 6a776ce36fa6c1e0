"""A model trained twice through `edge-remat run` (in this process) on a local board: once by
a plan that recomputes and pages to flash, once with `--plain`, for the tests that hold a
model's planned training against its plain PyTorch training on the board (test_dtype,
test_mixed_precision)."""

from __future__ import annotations

import json
from pathlib import Path

from .board_fixtures import local_board

PROFILE = Path(__file__).resolve().parents[2] / "profiles" / "this-machine.json"


def run_report(*args) -> dict:
    """`edge-remat run ARGS --json` with this machine's profile (no profiling) and no plots:
    its report; the run must end well."""
    from typer.testing import CliRunner
    from edge_remat.cli import app
    result = CliRunner().invoke(app, ["run", *map(str, args), "--profile", str(PROFILE),
                                      "--no-plots", "--json"])
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return json.loads(result.stdout)


def planned_and_plain(root: Path, *model_options) -> tuple[dict, dict]:
    """The reports of the model `model_options` give (--model, --dtype, --steps, ...) run on
    a local board "bench" under `root`, planned at 60% of its peak with paging to flash (its
    files in root/planned) and plain (root/plain)."""
    with local_board(root, "bench"):
        planned = run_report("--device", "bench", *model_options, "--budget", "60%",
                             "--paging", "flash", "--time-limit", "5",
                             "--out", root / "planned")
        plain = run_report("--device", "bench", *model_options, "--plain",
                           "--out", root / "plain")
    return planned, plain
