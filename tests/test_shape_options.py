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


# hf: models: the task decides (an image classifier reads --image, every other task --seq),
# through the zoo's rule; before, `--image` on GPT-2 or `--seq` on ViT was ignored in silence
TINY_GPT2 = 'hf:gpt2?config={"n_layer":1,"n_embd":32,"n_head":2}'
TINY_VIT = ('hf:vit?config={"num_hidden_layers":1,"hidden_size":32,"num_attention_heads":2,'
            '"intermediate_size":64}')
TINY_BERT_CLS = ('hf:bert?config={"num_hidden_layers":1,"hidden_size":32,'
                 '"num_attention_heads":2,"intermediate_size":64}&task=seq-cls')


@pytest.mark.parametrize("spec, reads", [(TINY_GPT2, "seq"), (TINY_VIT, "image"),
                                         (TINY_BERT_CLS, "seq")], ids=["gpt2", "vit", "bert"])
def test_an_hf_model_reads_the_option_its_task_names_and_not_the_other(spec, reads):
    pytest.importorskip("transformers")
    from edge_remat_agent.capture.hf import load_hf, options_without_effect

    def shapes(**option):
        module, args = load_hf(spec, batch=1, **option)
        return [tuple(a.shape) for a in args]

    for option, (a, b) in {"image": (32, 64), "seq": (16, 32)}.items():
        changed = shapes(**{option: a}) != shapes(**{option: b})
        assert changed == (option == reads), (spec, option)
        warned = options_without_effect(spec, **{"image": None, "seq": None, option: a})
        assert bool(warned) == (option != reads), warned


def test_graph_and_run_warn_of_an_option_an_hf_model_does_not_read(tmp_path):
    pytest.importorskip("transformers")
    done = cli("graph", "--model", TINY_GPT2, "--image", "32", "--seq", "16")
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith(f"warning: --image has no effect on {TINY_GPT2} (causal-lm), "
                                  "which reads only --seq\n"), done.stderr
    assert done.stderr.count("warning") == 1, done.stderr
    done = cli("run", "--device", "no-such-board", "--model", TINY_VIT, "--seq", "64",
               "--budget", "50%", "--out", tmp_path / "out")
    assert done.stderr.startswith(f"warning: --seq has no effect on {TINY_VIT} (image-cls), "
                                  "which reads only --image\n"), done.stderr
