"""The user's code where the host runs it (import, factory, forward): sys.exit() there is bad
input like any raise, and its print()s do not reach stdout, which is the command's own. A
fleet's captures run in this process without Ray: one model's sys.exit is that model's failed
capture, and a model whose file changed is captured again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.bad_inputs import BAD_INPUT, JOB_FAILED, cli, refused

REPO = Path(__file__).resolve().parents[1]

MODELS = '''
import sys
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, quit_in_forward=False):
        super().__init__()
        self.layer = nn.Linear(8, 8)
        self.quit_in_forward = quit_in_forward

    def forward(self, x):
        print("forward called")
        if self.quit_in_forward:
            sys.exit(5)
        return self.layer(x).pow(2).mean()


def make():
    print("building the model")
    return Net(), (torch.randn(4, 8),)


def exits_0():
    sys.exit(0)


def exits_3():
    sys.exit(3)


def exits_with_words():
    sys.exit("no weights here")


def exits_in_forward():
    return Net(quit_in_forward=True), (torch.randn(4, 8),)
'''


@pytest.fixture
def models(tmp_path) -> Path:
    path = tmp_path / "models.py"
    path.write_text(MODELS)
    return path


@pytest.mark.parametrize("factory, said", [
    # before: exit 0 and no graph, exit 3 ("board unreachable"), a bare "no weights here"
    ("exits_0", "the factory raised SystemExit: it called sys.exit(0) (models.py line 26)"),
    ("exits_3", "the factory raised SystemExit: it called sys.exit(3) (models.py line 30)"),
    ("exits_with_words", "it called sys.exit('no weights here') (models.py line 34)"),
    ("exits_in_forward", "SystemExit: it called sys.exit(5) (models.py line 16)"),
])
def test_sys_exit_in_the_users_code_is_bad_input_naming_the_line(tmp_path, models, factory,
                                                                 said):
    proc = cli("graph", "--model", f"{models}:{factory}", "-o", tmp_path / "graph.json")
    refused(proc, BAD_INPUT, "cannot capture model", said)
    assert not (tmp_path / "graph.json").exists()


def test_sys_exit_while_the_module_is_imported_is_bad_input(tmp_path):
    path = tmp_path / "leaves.py"
    path.write_text("import sys\nsys.exit(4)\n")
    proc = cli("graph", "--model", f"{path}:make", "-o", tmp_path / "graph.json")
    refused(proc, BAD_INPUT, "importing", "it called sys.exit(4) (leaves.py line 2)")


def test_the_users_prints_go_to_stderr_and_json_stays_one_object(tmp_path, models):
    proc = cli("graph", "--model", f"{models}:make", "-o", tmp_path / "graph.json", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["nodes"] > 0  # before: three printed lines before it
    assert "building the model" in proc.stderr and "forward called" in proc.stderr


def _fleet(folder: Path, models: Path, entries: list[tuple[str, str]]) -> Path:
    path = folder / "fleet.toml"
    path.write_text('budgets = ["100%"]\n[plan]\nsolver = "heuristic:split"\n'
                    + "".join(f'[[models]]\nmodel = "{models}:{factory}"\nname = "{name}"\n'
                              for name, factory in entries)
                    + f'[[boards]]\nprofile = "{REPO / "profiles" / "rpi4.json"}"\n'
                    'name = "rpi4"\n')
    return path


def test_a_model_calling_sys_exit_fails_alone_in_a_fleet_without_ray(tmp_path, models):
    """Before: the fleet ended at that model, silently, exit 0, nothing planned after it and
    no results written."""
    manifest = _fleet(tmp_path, models, [("first", "make"), ("quitter", "exits_0"),
                                         ("last", "make")])
    proc = cli("fleet", "plan", manifest, "--out", tmp_path / "out", "--no-ray", "--json")
    assert proc.returncode == JOB_FAILED, proc.stderr
    rows = {row["model"]: row for row in json.loads(proc.stdout)["rows"]}
    assert rows["quitter"]["status"] == "capture failed"
    assert "it called sys.exit(0)" in rows["quitter"]["error"]
    assert rows["first"]["plan"] and rows["last"]["plan"]
    assert (tmp_path / "out" / "results.csv").is_file()


def test_a_fleet_captures_again_a_model_whose_file_changed(tmp_path, models):
    """Before: the graph and plans of the model as it was were kept."""
    manifest = _fleet(tmp_path, models, [("mine", "make")])
    out = tmp_path / "out"

    def nodes() -> int:
        proc = cli("fleet", "plan", manifest, "--out", out, "--no-ray")
        assert proc.returncode == 0, proc.stderr
        return len(json.loads((out / "mine" / "graph.json").read_text())["nodes"])

    before = nodes()
    again = cli("fleet", "plan", manifest, "--out", out, "--no-ray")
    assert "captured mine" not in again.stderr and "kept from before" in again.stdout
    models.write_text(MODELS.replace("return self.layer(x).pow(2).mean()",
                                     "return self.layer(self.layer(x).relu()).pow(2).mean()"))
    assert nodes() > before
