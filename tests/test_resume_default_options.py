"""`run --resume OUT` compares the options a run trains at, not the words typed: digits-cnn's
defaults given (--batch 256 --image 24) resume the run that gave neither (QA: refused with
"the checkpoint's run had --batch (not given), this run has 256: give --batch as it was"),
and a real difference is still refused, saying both values. Through the CLI on a local board
(the --resume check is the host's, the same for any board; this machine's profile, no
profiling)."""

from __future__ import annotations

import json

import pytest
from helpers.board_fixtures import local_board
from helpers.local_runs import PROFILE



def _run(*args):
    from typer.testing import CliRunner
    from edge_remat.cli import app
    return CliRunner().invoke(app, ["run", "--device", "bench", "--model", "digits-cnn",
                                    "--budget", "60%", "--steps", "3", "--profile",
                                    str(PROFILE), "--no-plots", "--time-limit", "3",
                                    *map(str, args)])


def test_the_zoo_table_of_defaults_is_what_its_factories_make():
    """zoo_shapes, which the comparison reads, holds each zoo model's defaults: the shapes its
    own factory makes given none (the cheap ones built; every model is in the table)."""
    from edge_remat_agent.zoo import MODELS, READS
    from edge_remat_agent.zoo_shapes import SHAPE_DEFAULTS
    assert set(SHAPE_DEFAULTS) == set(MODELS)
    assert all(SHAPE_DEFAULTS[name][1] == READS[name] for name in MODELS)
    for name in ("digits-cnn", "mlp", "gpt-tiny", "lstm-lm", "llama-tiny-lora"):
        model, args = MODELS[name]()  # the factory's own defaults, not zoo.build's table
        batch, reads, size = SHAPE_DEFAULTS[name]
        made = model.scale * 8 if name == "digits-cnn" else \
            args[0].shape[2] if reads == "image" else args[0].shape[1]  # 8x8 digits enlarged
        assert (args[0].shape[0], made) == (batch, size), name


@pytest.mark.slow  # trains digits-cnn through the CLI (~30 s; longer on a busy machine)
def test_a_resume_at_the_models_default_shapes_goes_on(tmp_path):
    part = tmp_path / "part"
    with local_board(tmp_path, "bench"):
        first = _run("--stop-after", "1", "--checkpoint-every", "1", "--out", part)
        assert first.exit_code == 0, (first.stdout, first.stderr)
        same = _run("--resume", part, "--out", part, "--stop-after", "2", "--batch", "256",
                    "--image", "24", "--seq", "9", "--json")  # --seq: no effect on digits-cnn
        assert same.exit_code == 0, (same.stdout, same.stderr)
        report = json.loads(same.stdout)
        assert report["checkpoint"]["resumed_from_step"] == 1, report["checkpoint"]
        assert report["checkpoint"]["step"] == 2 and len(report["loss"]) == 1, report
        other = _run("--resume", part, "--out", part, "--batch", "128")
    assert other.exit_code == 2, (other.stdout, other.stderr)
    assert "the checkpoint's run had --batch 256, this run has 128: give --batch as it was" \
        in other.stderr, other.stderr
