"""The zoo's default shapes, without torch: what `--batch` and the one shape option a zoo model
reads (`--image` or `--seq`; zoo.READS is read off this table) come to when not given.
zoo.build fills them in from here and the zoo's factories have none of their own, so these
are the values every run of a zoo model trains at; a resumed run's options are compared at
them (executor/save_choice.identity_mismatch: `--batch 256` to digits-cnn is the run that
gave no --batch), and the run's profile cache keys a zoo model at them (run/profiles.py:
model_key)."""

from __future__ import annotations

# name -> (batch, the shape option it reads, its default)
SHAPE_DEFAULTS: dict[str, tuple[int, str, int]] = {
    "mlp": (8, "image", 32),
    "resnet18": (8, "image", 32),
    "resnet18-imagenet": (8, "image", 224),
    "resnet50": (8, "image", 32),
    "resnet50-imagenet": (8, "image", 224),
    # its stem is the ImageNet one (stride 2, 32x downsampling overall)
    "mobilenet_v2": (8, "image", 224),
    "vgg11": (8, "image", 32),
    "vgg16": (8, "image", 32),
    "bert-tiny": (8, "seq", 128),
    "bert-mini": (8, "seq", 128),
    "bert-base": (8, "seq", 128),
    "gpt2-small": (8, "seq", 128),
    "gpt2-small-lora": (8, "seq", 128),
    "gpt-tiny": (4, "seq", 32),
    "gpt-mini": (4, "seq", 128),
    "gpt-tiny-lora": (4, "seq", 32),
    "conv-gru": (8, "seq", 100),  # spectrogram frames: one second at 10 ms
    "lstm-lm": (8, "seq", 64),
    "digits-cnn": (256, "image", 24),  # the side it enlarges the 8x8 digits to
    "tinyllama-1.1b-lora": (1, "seq", 128),
    "tinyllama-2l-lora": (1, "seq", 128),
    "llama-tiny-lora": (2, "seq", 16),
}

# An hf: model's (capture/hf.py) --batch and --seq when not given; its --image is its
# config's image_size, which only the config says.
HF_BATCH, HF_SEQ = 2, 32


def effective_shape(name: str, batch: int | None, image: int | None,
                    seq: int | None) -> dict:
    """{"batch", "image", "seq"} as zoo model `name` trains at: each not given its default,
    and the shape option it does not read None (it has no effect). An hf: model's --batch and
    --seq not given are HF_BATCH and HF_SEQ (which of --image and --seq it reads only its
    config says: both stay). A factory's model keeps what was given (its defaults are its
    own)."""
    from .capture.hf_spec import is_hf_spec
    if is_hf_spec(name):
        return {"batch": batch or HF_BATCH, "image": image, "seq": seq or HF_SEQ}
    if name not in SHAPE_DEFAULTS:
        return {"batch": batch, "image": image, "seq": seq}
    default_batch, reads, default_size = SHAPE_DEFAULTS[name]
    given = {"image": image, "seq": seq}[reads]
    return {"batch": batch or default_batch, "image": None, "seq": None,
            reads: given or default_size}
