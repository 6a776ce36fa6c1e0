"""`edge-remat run --operator-level`: one planner node per ATen op, as `graph --operator-level`,
so that `run` reaches the finer graph's lower floors; --max-nodes (a cap on module-level
grouping) and --plain (no plan) are refused with it, in one line, as --max-nodes and --level
are by `graph` and a fleet manifest.

digits-cnn at batch 16, planned with this machine's profile (nothing is profiled): its
module-level graph cannot go below 2,116,456 bytes with parameters in RAM (2,372,376 homed on
flash), the operator-level one homed on flash 1,800,728 (measured when written). So 2 MiB
is refused at module level and trains at operator level."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from edge_remat.cli import app

REPO = Path(__file__).resolve().parents[1]
PROFILE = str(REPO / "profiles" / "this-machine.json")  # measured: no profiling in the test
DIGITS = ("--model", "digits-cnn", "--batch", "16")


def cli(*args):
    result = CliRunner().invoke(app, [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr


def one_error_line(code: int, out: str, err: str) -> str:
    assert code == 2 and "Traceback" not in out + err, (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


@pytest.mark.slow
def test_run_at_operator_level_trains_below_the_module_level_floor(tmp_path):
    from helpers.board_fixtures import local_board
    budget = ("--budget", "2MiB", "--profile", PROFILE, "--steps", 2, "--no-plots")
    with local_board(tmp_path, "opl"):
        module = cli("run", "--device", "opl", *DIGITS, *budget, "--out", tmp_path / "module")
        code, out, err = cli("run", "--device", "opl", *DIGITS, *budget, "--operator-level",
                             "--json", "--out", tmp_path / "operator")
    code_module, out_module, err_module = module  # its progress lines, then the refusal
    assert code_module == 2 and "Traceback" not in out_module + err_module
    assert err_module.strip().splitlines()[-1].startswith("error: budget 2097152 bytes is too "
                                                           "small"), err_module
    assert code == 0, (out, err)
    report = json.loads(out)
    assert report["status"] == "finished" and len(report["loss"]) == 2
    assert report["grad_check"]["bitwise_equal"] and report["grad_check"]["compared"] > 0
    assert report["predicted_peak_bytes"] <= 2 * 2**20
    graph = json.loads((tmp_path / "operator" / "graph.json").read_text())
    assert graph["capture"]["operator_level"] is True


@pytest.mark.parametrize("args, words", [
    (["--operator-level", "--max-nodes", "100"], ["--max-nodes caps", "give one of them"]),
    (["--operator-level", "--plain"], ["--plain trains without a plan", "give one of them"]),
])
def test_run_refuses_what_operator_level_would_drop(args, words, tmp_path):
    line = one_error_line(*cli("run", "--device", "local", *DIGITS, "--budget", "30%",
                               "--out", tmp_path / "out", *args))
    assert "--operator-level" in line and all(word in line for word in words), line
    assert not (tmp_path / "out").exists()  # refused before any work


def test_graph_refuses_a_node_cap_at_operator_level():
    line = one_error_line(*cli("graph", "--model", "mlp", "--operator-level",
                               "--max-nodes", "50"))
    assert "--max-nodes" in line and "--operator-level" in line and "give one of them" in line


def test_a_fleet_manifest_captures_at_operator_level_and_refuses_a_cap_with_it(tmp_path):
    from edge_remat.fleet.manifest import ManifestError, load_manifest
    profile = f'[[boards]]\nprofile = "{PROFILE}"\n'
    path = tmp_path / "fleet.toml"
    path.write_text('budgets = ["50%"]\n[[models]]\nmodel = "mlp"\noperator_level = true\n'
                    + profile)
    assert load_manifest(path).models[0].capture == {"operator_level": True}
    path.write_text('budgets = ["50%"]\n[[models]]\nmodel = "mlp"\noperator_level = true\n'
                    'max_nodes = 40\n' + profile)
    with pytest.raises(ManifestError) as refused:
        load_manifest(path)
    assert "models[0]: max_nodes caps" in str(refused.value)
    assert "operator_level makes one node per ATen op" in str(refused.value)
