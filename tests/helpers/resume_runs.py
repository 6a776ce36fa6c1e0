"""What the resume tests share (tests/test_resume.py, test_resume_restarts.py): gpt-tiny
planned near its floor, run options for a local board, and the checks that a resumed run
ended as the uninterrupted one."""

from __future__ import annotations

from pathlib import Path

import torch

from helpers.executor_plans import problem_near_floor

from edge_remat_agent.capture import capture_model
from edge_remat_agent.formats import Tier
from edge_remat.planner.solve import solve

FLASH = {"flash": Tier(read_bytes_per_s=5e8, write_bytes_per_s=2e8, latency_s=1e-4)}


def planned(home: str, accumulate: int = 1):
    """gpt-tiny (dropout 0.1) for AdamW, captured afresh (the run trains its module), and a
    plan that recomputes and pages near the floor."""
    captured = capture_model("gpt-tiny", batch=2, seq=16, optimizer="adamw", params_home=home,
                             refined=False, accumulate=accumulate)
    plan = solve(problem_near_floor(captured.graph, 0.5, "flash", FLASH),
                 "heuristic:paging").plan
    return captured, plan


def assert_same_checkpoint(mine: Path, theirs: Path) -> None:
    a, b = torch.load(mine), torch.load(theirs)
    assert a.keys() == b.keys()
    assert any(k.startswith("optimizer/") and k.endswith("exp_avg_sq") for k in a)
    for key in a:
        if isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key], b[key]), key
    assert a["checkpoint"]["steps_done"] == b["checkpoint"]["steps_done"]


def assert_same_outputs(whole: Path, part: Path) -> None:
    """An uninterrupted run's folder and a resumed one's: the same checkpoint and weights."""
    assert_same_checkpoint(whole / "checkpoint.pt", part / "checkpoint.pt")
    theirs = torch.load(part / "weights.pt")
    for name, value in torch.load(whole / "weights.pt").items():
        assert torch.equal(value, theirs[name]), name


REPO = Path(__file__).resolve().parents[2]
QUICK = dict(profile=str(REPO / "profiles" / "this-machine.json"), plots=False, time_limit=3)
GPT = dict(device="bench", model="gpt-tiny", batch=2, seq=16, optimizer="adamw", data="text",
           lr_schedule="cosine", warmup=2, budget="70%", params_home="flash", paging="flash",
           checkpoint_every=2, **QUICK)

