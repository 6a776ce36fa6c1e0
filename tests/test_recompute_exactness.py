"""Recomputation stays exact for models the earlier rounds did not try: random ops beyond
dropout (RReLU in training mode replays its noise) and fused updates (a parameter reader is never
computed again after its update has stepped the weights, whatever the solver decided)."""

from __future__ import annotations

import pytest

from helpers.executor_plans import every_forward_recomputed
from helpers.user_models import spec as user_model
from edge_remat_agent.capture import capture_model
from edge_remat_agent.executor.run import run_plan

pytestmark = pytest.mark.slow


def test_rrelu_in_training_mode_replays_its_noise_when_recomputed(tmp_path):
    captured = capture_model(user_model("make_rrelu"))
    rrelu = [n for n in captured.graph.nodes if "rrelu_with_noise_functional" in
             n.attrs.get("ops", [])]
    assert rrelu and all(n.attrs.get("random") for n in rrelu)
    report = run_plan(captured.graph, every_forward_recomputed(captured.graph), 2,
                      str(tmp_path / "pages"), captured=captured, seed=0)
    assert report["grad_check"]["bitwise_equal"], report["grad_check"]["differing"]
