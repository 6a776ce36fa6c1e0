"""A small model zoo written here (no torchvision / transformers on the boards).

Every model is loss-returning: ``module(*example_args)`` gives the scalar training
loss, because the executor fine-tunes and only ever needs loss.backward().

    module, args = build("resnet18", batch=4)
    module(*args).backward()

Factories take ``(batch, image, seq, generator, **keywords)``; arguments that do
not apply to a family (``image`` for text, ``seq`` for images) are ignored. They have
no defaults of their own: build fills in each model's from zoo_shapes.SHAPE_DEFAULTS,
the one table of them (importable without torch: a resume compares options at them).
"""

import torch

import functools

from ..zoo_shapes import SHAPE_DEFAULTS, effective_shape
from . import bert, digits, gpt, llama, mlp, mobilenet, recurrent, resnet, vgg


class ZooError(ValueError):
    """An unknown model name, or a configuration the model cannot take."""


MODELS = {
    "mlp": mlp.mlp,
    "resnet18": resnet.resnet18,
    "resnet18-imagenet": resnet.resnet18_imagenet,
    "resnet50": resnet.resnet50,
    "resnet50-imagenet": resnet.resnet50_imagenet,
    "mobilenet_v2": mobilenet.mobilenet_v2,
    "vgg11": vgg.vgg11,
    "vgg16": vgg.vgg16,
    "bert-tiny": bert.bert_tiny,
    "bert-mini": bert.bert_mini,
    "bert-base": bert.bert_base,
    "gpt2-small": gpt.gpt2_small,
    "gpt2-small-lora": gpt.with_lora(gpt.gpt2_small),
    "gpt-tiny": gpt.gpt_tiny,
    "gpt-mini": gpt.gpt_mini,
    "gpt-tiny-lora": gpt.with_lora(gpt.gpt_tiny),
    "conv-gru": recurrent.conv_gru,
    "lstm-lm": recurrent.lstm_lm,
    "digits-cnn": digits.digits_cnn,  # real data: the bundled handwritten digits
    # Weights made per tensor from the seed; built on meta for capture and the executor, which
    # read the frozen base from a weight page store (weights/)
    "tinyllama-1.1b-lora": llama.tinyllama_lora,
    "tinyllama-2l-lora": functools.partial(llama.tinyllama_lora, layers=2),
    "llama-tiny-lora": llama.llama_tiny_lora,
}
SEEDED = {"tinyllama-1.1b-lora", "tinyllama-2l-lora", "llama-tiny-lora"}  # take `seed`
# The one shape option each model reads (`image`: the side of its input images; `seq`: its
# sequence length, digits-cnn's image the size it enlarges the 8x8 digits to): every factory
# takes both, so the other one given has no effect (`graph` and `run` warn of it). Read off
# zoo_shapes' table, which names it beside its default.
READS = {name: reads for name, (_batch, reads, _size) in SHAPE_DEFAULTS.items()}


def options_without_effect(name: str, image: int | None, seq: int | None) -> list[str]:
    """Why each shape option given has no effect on zoo model `name` ([] for a model not in
    the zoo: a factory's own parameters, or a transformers model's task, decide there)."""
    reads = READS.get(name)
    if reads is None:
        return []
    return unread_shape_options(name, reads, image, seq)


def unread_shape_options(name: str, reads: str, image: int | None,
                         seq: int | None) -> list[str]:
    """The rule for any model that reads one shape option (`reads`): each other one given has
    no effect (the zoo's table says which for its models, hf.py's task for transformers')."""
    given = {"image": image, "seq": seq}
    return [f"--{option} has no effect on {name}, which reads only --{reads}"
            for option, value in given.items() if value is not None and option != reads]


def build(name, batch=None, image=None, seq=None, seed=0, **keywords):
    """Return ``(module, example_args)`` for ``name``, reproducible from ``seed``.

    ``keywords`` go to the factory (e.g. ``num_classes=1000``, ``vocab=1000``,
    ``batch_norm=True``). None for batch/image/seq means the family default.
    """
    if name not in MODELS:
        known = ", ".join(sorted(MODELS))
        raise ZooError(f"unknown model {name!r}; known models: {known}")
    # fork_rng so that seeding for the init does not disturb the caller's RNG.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        # The example batch has its own generator: it does not depend on how
        # many random numbers the init consumed.
        generator = torch.Generator().manual_seed(seed)
        # the defaults every run trains at (zoo_shapes: a resume compares options at them)
        shape = effective_shape(name, batch, image, seq)
        batch, image, seq = shape["batch"], shape["image"] or image, shape["seq"] or seq
        try:
            if name in SEEDED:
                keywords.setdefault("seed", seed)
            return MODELS[name](batch=batch, image=image, seq=seq, generator=generator, **keywords)
        except ZooError:
            raise
        except ValueError as exc:
            raise ZooError(f"{name}: {exc}") from exc


def not_a_model(name: str) -> str | None:
    """Why `name` names no model, where it is neither in the zoo nor MODULE:FACTORY (the
    capture's refusal, and the host's before a job is sent); None where it may."""
    if ":" in name or name in MODELS:
        return None
    return "not a zoo model and not MODULE:FACTORY; zoo models: " + ", ".join(sorted(MODELS))


__all__ = ["MODELS", "READS", "ZooError", "build", "not_a_model", "options_without_effect",
           "unread_shape_options"]
