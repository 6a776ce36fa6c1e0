"""A user's model file (a factory in a .py file of its own, as `--model FILE.py:make` names
it), captured and planned on the host: for the tests of boards that do not share the host's
files (test_pushed_copies.py, test_arm_board.py)."""

from __future__ import annotations

from helpers.bad_inputs import cli

MODEL = '''
import torch
import torch.nn.functional as F
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 3)

    def forward(self, x, y):
        return F.cross_entropy(self.b(torch.relu(self.a(x))), y)


def make(batch: int = 4):
    torch.manual_seed(0)
    return Net(), (torch.randn(batch, 8), torch.randint(0, 3, (batch,)))
'''


def captured_and_planned(tmp_path):
    """(model file, graph, plan): tmp_path/code/tiny_net.py, captured at batch 4 and planned
    at 0.8 of its plain peak, all on this host."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "tiny_net.py").write_text(MODEL)
    graph, plan = tmp_path / "graph.json", tmp_path / "plan.json"
    proc = cli("graph", "--model", f"{code / 'tiny_net.py'}:make", "--batch", 4, "-o", graph,
               timeout=300)
    assert proc.returncode == 0, proc.stderr
    proc = cli("plan", "--graph", graph, "--budget", "0.8", "--time-limit", 5, "-o", plan)
    assert proc.returncode == 0, proc.stderr
    return code / "tiny_net.py", graph, plan
