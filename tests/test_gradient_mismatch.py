"""A run whose first step's gradients differ from eager PyTorch's exits 1 with one error line,
not 0 beside a report that says so (BYOM QA #10). The model here really differs: its forward
reads a Python call counter, which the capture fixes as a constant."""

from __future__ import annotations

import textwrap

import pytest

from edge_remat_agent.run_command import gradient_mismatch
from helpers.bad_inputs import REPO, cli
from helpers.board_fixtures import local_board

COUNTING_MODEL = textwrap.dedent('''
    import torch
    from torch import nn


    class Counting(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 4)
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            return (self.lin(x) * self.calls).pow(2).mean()


    def make_model(batch: int = 4):
        torch.manual_seed(0)
        return Counting(), (torch.randn(batch, 8),)
''')


def test_only_a_check_that_found_a_difference_is_a_mismatch():
    assert gradient_mismatch(None) is None
    assert gradient_mismatch({"status": "not checked", "why": "no executor"}) is None
    assert gradient_mismatch({"bitwise_equal": True, "max_abs_diff": 0.0}) is None
    line = gradient_mismatch({"bitwise_equal": False, "max_abs_diff": 0.075,
                              "differing": ["a.weight", "b.weight", "c.bias", "d.bias"],
                              "missing": [], "extra": []})
    assert "0.075" in line and "a.weight, b.weight, c.bias ..." in line
    assert "the loss" in gradient_mismatch({"bitwise_equal": False, "max_abs_diff": 0.0,
                                            "differing": [], "missing": [], "extra": []})


@pytest.mark.slow
def test_a_run_whose_gradients_differ_exits_1_with_one_line(tmp_path):
    (tmp_path / "counting.py").write_text(COUNTING_MODEL)
    with local_board(tmp_path / "bench", "counting-board"):  # its agent stopped at the end
        proc = cli("run", "--device", "counting-board", "--model",
                   f"{tmp_path / 'counting.py'}:make_model", "--budget", "98%", "--steps", 1,
                   "--no-plots", "--time-limit", 5, "--profile",
                   REPO / "profiles" / "this-machine.json", "--out", tmp_path / "out",
                   cwd=tmp_path, timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert "DIFFERENT from eager PyTorch" in proc.stdout  # the report, as before
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "gradients differ from those of eager PyTorch" in errors[0] \
        and "lin.weight" in errors[0], proc.stderr
    assert (tmp_path / "out" / "report.json").exists()  # the report is kept
