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


def _made(name: str, batch: int | None, image: int | None, seq: int | None) -> dict:
    """{"batch", "image", "seq"} of the example zoo.build makes for `name` given these: built on
    meta, so the big models cost nothing and keep their real vocabularies and depths."""
    import torch
    from edge_remat_agent.zoo import READS, build
    with torch.device("meta"):
        model, args = build(name, batch, image, seq)
    # an image's side, a sequence's length (conv-gru's: its frames, the last axis); digits-cnn's
    # real digits stay 8x8, its image the size its first layer enlarges them to
    size = model.scale * 8 if name == "digits-cnn" else args[0].shape[-1]
    return {"batch": args[0].shape[0], "image": None, "seq": None, READS[name]: size}


def test_every_zoo_model_builds_at_the_shapes_effective_shape_gives():
    """zoo_shapes, which the comparison reads, is the one table of the zoo's defaults (the
    factories have none): zoo.build makes every model's example at what effective_shape says,
    given nothing and given values (the option a model does not read given too: no effect)."""
    from edge_remat_agent.zoo import MODELS, READS
    from edge_remat_agent.zoo_shapes import SHAPE_DEFAULTS, effective_shape
    assert set(SHAPE_DEFAULTS) == set(MODELS) == set(READS)
    for name in sorted(MODELS):
        assert _made(name, None, None, None) == effective_shape(name, None, None, None), name
        assert _made(name, 3, 64, 16) == effective_shape(name, 3, 64, 16), name


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


def test_an_hf_models_default_batch_and_seq_given_resume_the_run_that_gave_neither():
    """capture/hf.py trains an hf: model at --batch 2 --seq 32 when not given: a resume
    that gives them is the same run (before: refused, "had --batch (not given), this run has
    2"); another value is still refused."""
    from edge_remat.run import RunOptions
    from edge_remat.run.resume import training_identity
    from edge_remat_agent.executor.save_choice import identity_mismatch
    base = dict(device="bench", model="hf:gpt2", steps=6)
    earlier = training_identity(RunOptions(**base))
    assert identity_mismatch(earlier, training_identity(RunOptions(batch=2, seq=32, **base))) \
        is None
    said = identity_mismatch(earlier, training_identity(RunOptions(seq=16, **base)))
    assert said is not None and "--seq 32, this run has 16" in said, said
