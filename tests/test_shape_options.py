"""--image and --seq given to a model that does not read them: `graph` and `run` warn (before,
`graph --model mlp --seq 64` captured the same graph as without it and said nothing). Which
option each zoo model reads is one table, zoo.READS, checked here against the factories."""

from __future__ import annotations

import pytest
import torch
from helpers.bad_inputs import cli

from edge_remat_agent.zoo import MODELS, READS, build

# the zoo's large models take seconds each to build: the table's entries for them are read
# off their factories (bert, gpt and llama take `seq` only)
SLOW_TO_BUILD = {"bert-base", "gpt2-small", "gpt2-small-lora", "gpt-mini",
                 "tinyllama-1.1b-lora", "tinyllama-2l-lora"}


def _shapes(name: str, **option) -> list:
    model, args = build(name, batch=1, **option)
    # digits-cnn's real digits stay 8x8: its image is the size its first layer enlarges them to
    scale = getattr(model, "scale", None)
    return [tuple(a.shape) for a in args if isinstance(a, torch.Tensor)] + [scale]


def test_the_table_names_one_option_for_every_zoo_model():
    assert set(READS) == set(MODELS) and set(READS.values()) == {"image", "seq"}


@pytest.mark.parametrize("name", sorted(set(MODELS) - SLOW_TO_BUILD))
def test_a_model_reads_the_option_the_table_names_and_not_the_other(name):
    values = {"image": (32, 64), "seq": (16, 32)}
    for option, (a, b) in values.items():
        changed = _shapes(name, **{option: a}) != _shapes(name, **{option: b})
        assert changed == (READS[name] == option), (name, option)


def test_graph_warns_of_an_option_the_model_does_not_read(tmp_path):
    done = cli("graph", "--model", "mlp", "--batch", "2", "--seq", "64")
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == \
        "warning: --seq has no effect on mlp, which reads only --image"
    done = cli("graph", "--model", "gpt-tiny", "--batch", "2", "--seq", "16")
    assert done.returncode == 0 and "warning" not in done.stderr, done.stderr


def test_run_warns_before_it_starts(tmp_path):
    """The same table: a run's capture would ignore it too (an unknown device ends it here)."""
    done = cli("run", "--device", "no-such-board", "--model", "resnet18", "--seq", "64",
               "--budget", "50%", "--out", tmp_path / "out")
    assert done.stderr.startswith(
        "warning: --seq has no effect on resnet18, which reads only --image\n"), done.stderr
