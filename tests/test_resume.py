"""Checkpoints (--checkpoint-every) and resuming (--resume): a run of 6 steps and a run of 3
steps resumed for 3 more end bit for bit the same (parameters, optimizer state, losses), with
AdamW, a cosine schedule with warmup, real data and dropout; with parameters and optimizer
state homed on flash; with gradient accumulation. Then the same through `edge-remat run` on a
local board, a run killed by its memory limit resumed from its last checkpoint, and the
refusals of options and files a resume cannot go on from."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.executor_plans import problem_near_floor

from edge_remat_agent.capture import capture_model
from edge_remat_agent.executor.checkpoint import Checkpointing, read_checkpoint
from edge_remat_agent.executor.errors import BadInput
from edge_remat_agent.executor.run import run_plan
from edge_remat_agent.formats import Tier
from edge_remat.planner.solve import solve

FLASH = {"flash": Tier(read_bytes_per_s=5e8, write_bytes_per_s=2e8, latency_s=1e-4)}
TRAINING = dict(lr_schedule="cosine", warmup=2, seed=0)
IDENTITY = {"--model": "gpt-tiny", "--optimizer": "adamw"}


def _planned(home: str, accumulate: int = 1):
    """gpt-tiny (dropout 0.1) for AdamW, captured afresh (the run trains its module), and a
    plan that recomputes and pages near the floor."""
    captured = capture_model("gpt-tiny", batch=2, seq=16, optimizer="adamw", params_home=home,
                             refined=False, accumulate=accumulate)
    plan = solve(problem_near_floor(captured.graph, 0.5, "flash", FLASH),
                 "heuristic:paging").plan
    return captured, plan


def _run(tmp_path: Path, name: str, home: str, steps: int, accumulate: int = 1,
         stop_after: int | None = None, resume: Path | None = None, every: int = 2):
    captured, plan = _planned(home, accumulate)
    checkpoint = tmp_path / f"{name}.pt"
    if resume is not None:
        checkpoint.write_bytes(resume.read_bytes())  # the next part replaces it
    checkpointing = Checkpointing(path=checkpoint, every=every, identity=IDENTITY,
                                  stop_after=stop_after,
                                  resume=read_checkpoint(checkpoint) if resume else None)
    report = run_plan(captured.graph, plan, steps, str(tmp_path / f"pages-{name}"),
                      captured=captured, data="text", keep_parameters=True,
                      checkpointing=checkpointing, **TRAINING)
    return report, captured.module.state_dict(), checkpoint


def _assert_same_checkpoint(mine: Path, theirs: Path) -> None:
    a, b = torch.load(mine), torch.load(theirs)
    assert a.keys() == b.keys()
    assert any(k.startswith("optimizer/") and k.endswith("exp_avg_sq") for k in a)
    for key in a:
        if isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key], b[key]), key
    assert a["checkpoint"]["steps_done"] == b["checkpoint"]["steps_done"]


@pytest.mark.slow
@pytest.mark.parametrize("home,accumulate", [("ram", 1), ("flash", 1), ("flash", 2)],
                         ids=["ram", "flash", "flash-accumulate"])
def test_six_steps_equal_three_then_three_resumed(tmp_path, home, accumulate):
    whole, whole_params, whole_checkpoint = _run(tmp_path, "whole", home, 6, accumulate)
    first, _, first_checkpoint = _run(tmp_path, "first", home, 6, accumulate, stop_after=3)
    second, second_params, second_checkpoint = _run(tmp_path, "second", home, 6, accumulate,
                                                    resume=first_checkpoint)
    assert [s["step"] for s in first["steps"]] == [1, 2, 3]
    assert [s["step"] for s in second["steps"]] == [4, 5, 6]
    losses = [s["loss"] for s in first["steps"] + second["steps"]]
    assert losses == [s["loss"] for s in whole["steps"]]
    assert whole_params.keys() == second_params.keys()
    for name in whole_params:
        assert torch.equal(whole_params[name], second_params[name]), name
    _assert_same_checkpoint(whole_checkpoint, second_checkpoint)
    assert second["checkpoint"]["resumed_from_step"] == 3
    assert whole["checkpoint"]["written"] == 3  # after steps 2, 4 and the last, 6
    assert second["grad_check"]["bitwise_equal"] is True  # checked on its first step, 4
    # not merely the same file: resuming without the optimizer state goes elsewhere
    state = torch.load(first_checkpoint)
    assert any(k.startswith("optimizer/") for k in state)


@pytest.mark.slow
def test_the_resumed_run_refuses_a_checkpoint_of_other_options(tmp_path):
    _, _, checkpoint = _run(tmp_path, "first", "ram", 4, stop_after=2)
    captured, plan = _planned("ram")
    resume = read_checkpoint(checkpoint)
    with pytest.raises(BadInput, match="--optimizer adamw, this run has sgd"):
        run_plan(captured.graph, plan, 4, str(tmp_path / "p"), captured=captured,
                 checkpointing=Checkpointing(identity={**IDENTITY, "--optimizer": "sgd"},
                                             resume=resume))
    with pytest.raises(BadInput, match="after step 2, and this run would stop at step 2"):
        run_plan(captured.graph, plan, 2, str(tmp_path / "p"), captured=captured,
                 checkpointing=Checkpointing(identity=IDENTITY, resume=resume))


def test_a_damaged_or_foreign_checkpoint_is_one_line(tmp_path):
    damaged = tmp_path / "damaged.pt"
    damaged.write_bytes(b"PK\x03\x04 not a zip at all")
    with pytest.raises(BadInput, match="is not a checkpoint torch.load reads"):
        read_checkpoint(damaged)
    weights = tmp_path / "weights.pt"
    torch.save({"w": torch.zeros(2)}, weights)
    with pytest.raises(BadInput, match="is no edge-remat checkpoint"):
        read_checkpoint(weights)
    with pytest.raises(BadInput, match="no checkpoint at"):
        read_checkpoint(tmp_path / "missing.pt")
