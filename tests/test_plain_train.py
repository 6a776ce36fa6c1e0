"""`run --plain` (plain_train.py) is the planned run's training done by eager PyTorch: the
same losses, step after step, for models that draw random numbers (dropout) and for a factory
that returns its model in eval mode."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from helpers.executor_plans import problem_near_floor
from helpers.user_models import spec as user_model

from edge_remat_agent.capture import capture_model
from edge_remat_agent.executor.run import run_plan
from edge_remat_agent.plain_train import train_plain
from edge_remat.planner.solve import solve

pytestmark = pytest.mark.slow  # two captures, two short trainings
MY_MODEL = str(Path(__file__).resolve().parents[1] / "examples" / "my_model.py") + ":make_model"
STEPS = 3


@pytest.mark.parametrize("spec,shape", [
    # dropout and batch norm: plain training drew other dropout masks (its generator was not
    # seeded), a loss of 1.5672 and then 1.5038 for the same command, against 1.5782 planned
    (MY_MODEL, dict(batch=8, image=16)),
    # an eval-mode factory: plain training put it in training mode (dropout on, statistics
    # updated) where the planned run keeps the mode the capture traced
    (user_model("make_eval_mode_model"), dict(batch=8)),
], ids=["dropout", "eval-mode"])
def test_plain_training_takes_the_planned_runs_steps(spec, shape, tmp_path):
    captured = capture_model(spec, refined=False, **shape)
    plan = solve(problem_near_floor(captured.graph, 0.9, "none", {}), "heuristic:split").plan
    planned = run_plan(captured.graph, plan, STEPS, str(tmp_path / "pages"),
                       captured=captured, seed=0)
    plain = train_plain(spec, STEPS, seed=0, **shape)
    assert plain["loss"] == [s["loss"] for s in planned["steps"]]
    again = train_plain(spec, STEPS, seed=0, **shape)
    assert again["loss"] == plain["loss"]  # the same command, the same training
    if "eval" in spec:  # the planned run kept batch norm's statistics, as eval mode does
        assert not captured.module.training
        assert torch.equal(captured.module.net[1].running_mean, torch.zeros(16))
