"""Training data that works offline, on the board as on the host.

A data spec names where a run's batches come from; every batch is a tuple shaped like the
model's example arguments, so the executor and plain training feed it straight to the model:

    "example"          the model's own example batch, every step (no data set)
    "digits"           the bundled handwritten digits (digits.csv.gz, 1797 8x8 images),
                       shuffled per epoch; for models that take (images [B,1,8,8], labels [B])
    "text"             the bundled English text (story.txt) as byte-level tokens, for language
                       models that take (input_ids [B,S], labels [B,S]) with a vocabulary >= 259
    "MODULE:FUNCTION"  your own: FUNCTION(batch, seed) yields argument tuples forever

    for args in batches("digits", example_args, seed=0):
        loss = module(*args)
"""

from __future__ import annotations

import importlib
from typing import Iterator

from .digits import digits_batches, load_digits
from .text import text_batches

DATA_SPECS = ("example", "digits", "text", "MODULE:FUNCTION")


class DataError(ValueError):
    """A data spec that cannot feed this model (unknown name, shapes that do not match)."""


def batches(spec: str | None, example_args: tuple, seed: int = 0) -> Iterator[tuple]:
    """An endless iterator of argument tuples for `module(*args)`."""
    import torch

    spec = spec or "example"
    example_args = tuple(example_args)
    if spec == "example":
        return _repeat(example_args)
    batch = _batch_size(example_args)
    if spec == "digits":
        source = digits_batches(batch, seed)
    elif spec == "text":
        source = text_batches(batch, _seq_length(example_args), seed)
    elif ":" in spec:
        module_name, _, name = spec.partition(":")
        try:
            factory = getattr(importlib.import_module(module_name), name)
        except (ImportError, AttributeError) as exc:
            raise DataError(f"data {spec!r}: cannot load {name} from {module_name}: {exc}") \
                from None
        source = iter(factory(batch, seed))
    else:
        raise DataError(f"unknown data {spec!r}; use one of {', '.join(DATA_SPECS)}")
    return _checked(spec, source, example_args, torch)


def _repeat(args: tuple) -> Iterator[tuple]:
    while True:
        yield args


def _batch_size(example_args: tuple) -> int:
    for arg in example_args:
        if hasattr(arg, "shape") and len(arg.shape) > 0:
            return int(arg.shape[0])
    raise DataError("the model's example arguments have no batch dimension to fill")


def _seq_length(example_args: tuple) -> int:
    for arg in example_args:
        if hasattr(arg, "shape") and len(arg.shape) == 2:
            return int(arg.shape[1])
    raise DataError("data 'text' feeds models that take token ids [batch, seq]")


def _checked(spec: str, source, example_args: tuple, torch) -> Iterator[tuple]:
    """Each batch must match the example's shapes and dtypes: the captured graph is static."""
    for args in source:
        args = tuple(args)
        if len(args) != len(example_args):
            raise DataError(f"data {spec!r} gives {len(args)} arguments; the model takes "
                            f"{len(example_args)}")
        for k, (got, want) in enumerate(zip(args, example_args)):
            if isinstance(want, torch.Tensor) and (
                    not isinstance(got, torch.Tensor) or got.shape != want.shape
                    or got.dtype != want.dtype):
                shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
                raise DataError(f"data {spec!r}: argument {k} is {shape}, the model's example "
                                f"is {tuple(want.shape)} {want.dtype}")
        yield args


__all__ = ["DATA_SPECS", "DataError", "batches", "digits_batches", "load_digits",
           "text_batches"]
