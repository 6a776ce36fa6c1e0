"""Training data that works offline, on the board as on the host.

A data spec names where a run's batches come from; every batch is a tuple shaped like the
model's example arguments, so the executor and plain training feed it straight to the model:

    "example"          the model's own example batch, every step (no data set)
    "digits"           the bundled handwritten digits (digits.csv.gz, 1797 8x8 images),
                       shuffled per epoch; for models that take (images [B,1,8,8], labels [B])
    "text"             the bundled English text (story.txt) as byte-level tokens, for language
                       models with a vocabulary >= 259 that take (input_ids [B,S], labels
                       [B,S]), or hf: causal and seq2seq LMs (input_ids, attention_mask,
                       labels; a seq2seq LM's labels are the text that follows its input)
    "MODULE:FUNCTION"  your own: FUNCTION(batch, seed) yields argument tuples forever; MODULE
                       is an importable module or a Python file (`my_data.py`, `data/mine.py`),
                       as for a model's MODULE:FACTORY

    for args in batches("digits", example_args, seed=0, model=module):
        loss = module(*args)

`model` (optional) is the module the batches feed: an hf: model says which head it trains and
its vocabulary (`task`, `vocab_size`: capture/hf.py TrainingLoss), which "text" follows.

The host checks a spec with the same table before it sends it (`check_data_spec`), and names a
file by its absolute path (user_code.spec_file): the board reads it in another working
directory.
"""

from __future__ import annotations

from typing import Callable, Iterator

from ..user_code import USER_CODE_FAILURES, UserCodeError, import_user_module, names_file
from .digits import digits_batches, load_digits
from .text import SMALLEST_VOCAB, text_batches

NAMED_DATA = ("example", "digits", "text")
DATA_SPECS = NAMED_DATA + ("MODULE:FUNCTION",)


class DataError(ValueError):
    """A data spec that cannot feed this model (unknown name, shapes that do not match)."""


class DataFunctionFailed(DataError):
    """The user's MODULE:FUNCTION raised (or exited) before its first batch: the run's input
    is wrong, nothing trained (a board's job refuses it as bad input, as the host does)."""


def batches(spec: str | None, example_args: tuple, seed: int = 0,
            model=None) -> Iterator[tuple]:
    """An endless iterator of argument tuples for `model(*args)`."""
    import torch

    spec = spec or "example"
    example_args = tuple(example_args)
    if spec == "example":
        return _repeat(example_args)
    batch = _batch_size(example_args)
    if spec == "digits":
        source = digits_batches(batch, seed)
    elif spec == "text":
        source = text_batches(batch, _seq_length(example_args), seed, _text_layout(model))
    else:
        source = _first_batch_said(spec, load_data_function(spec), batch, seed)
    return _checked(spec, source, example_args, torch)


def check_data_fits(spec: str, example_args: tuple, seed: int = 0, model=None,
                    user_data: bool = False) -> None:
    """The first batch of bundled data against the model's example arguments (DataError if
    it cannot feed them). A MODULE:FUNCTION only with `user_data` (where it runs here as on
    the board): it may read data only the board has."""
    if spec in NAMED_DATA and spec != "example":
        next(batches(spec, example_args, seed, model))
    elif user_data and spec not in NAMED_DATA:
        next(batches(spec, example_args, seed, model))


def check_data_spec(spec: str) -> None:
    """Refuse a spec that names no data: an unknown name, or MODULE:FUNCTION missing a part.
    (Whether MODULE imports is known only where it is imported: `load_data_function`.)"""
    if spec in NAMED_DATA:
        return
    module_part, colon, name = spec.rpartition(":")
    if not colon:
        raise DataError(f"unknown data {spec!r}; use one of {', '.join(DATA_SPECS)} (MODULE: "
                        "an importable module or a .py file)")
    if not module_part or not name:
        raise DataError(f"data {spec!r}: name both MODULE (an importable module or a .py "
                        "file) and FUNCTION, as MODULE:FUNCTION")


def load_data_function(spec: str) -> Callable:
    """FUNCTION of a MODULE:FUNCTION spec, imported (not called)."""
    check_data_spec(spec)
    if spec in NAMED_DATA:
        raise DataError(f"data {spec!r} is bundled, not MODULE:FUNCTION")
    module_part, _, name = spec.rpartition(":")
    module = _import_data_module(spec, module_part)
    function = getattr(module, name, None)
    if not callable(function):
        raise DataError(f"data {spec!r}: {module_part} has no function named {name!r}")
    return function


def _import_data_module(spec: str, module_part: str):
    try:
        return import_user_module(module_part, "edge_remat_user_data_")
    except UserCodeError as exc:
        hint = "" if names_file(module_part) else " (a Python file? give its path, ending in .py)"
        raise DataError(f"data {spec!r}: {exc}{hint}") from None


def _first_batch_said(spec: str, function: Callable, batch: int,
                      seed: int) -> Iterator[tuple]:
    """FUNCTION(batch, seed)'s batches; none at all, or its error before the first, in one
    line as a DataError (QA: over SSH the board's run failed on "RuntimeError: data boom",
    exit 1, where the host refused it for a local board, exit 2). Later errors are its own."""
    try:
        source = iter(function(batch, seed))
        first = next(source)
    except StopIteration:
        raise DataError(f"data {spec!r} gives no batch") from None
    except DataError:
        raise
    except USER_CODE_FAILURES as error:  # the user's code: its error, in one line
        raise DataFunctionFailed(f"data {spec!r} failed on its first batch: "
                                 f"{type(error).__name__}: {error}") from None
    yield first
    yield from source


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
    takes = ", ".join(f"[{', '.join(map(str, arg.shape))}]"
                      + (f" {str(arg.dtype).replace('torch.', '')}" if hasattr(arg, "dtype")
                         else "")
                      for arg in example_args if hasattr(arg, "shape")) or "no tensors"
    # QA: the line had no remedy (deploy --data text of a digits-cnn graph)
    raise DataError(f"data 'text' feeds language models, which take token ids [batch, seq]; "
                    f"this model takes {takes}: use --data example (the graph's example "
                    "batch), digits (8x8 digit images, for an image classifier) or your own "
                    "MODULE:FUNCTION")


def _text_layout(model) -> str:
    """How "text" feeds `model`: a transformers model by its task (a causal LM and a seq2seq
    LM learn from plain text: a masked LM needs a mask token the byte tokenizer lacks, a
    classifier class labels), anything else as (input_ids, next-token labels)."""
    task = getattr(model, "task", None)
    if task not in (None, "causal-lm", "seq2seq-lm"):
        raise DataError(f"data 'text' feeds causal and seq2seq language models; this model "
                        f"trains a {task} "
                        "head (no mask token or class labels in the bundled text): use "
                        "--data example or your own MODULE:FUNCTION")
    vocab = getattr(model, "vocab_size", None)
    if vocab is not None and vocab < SMALLEST_VOCAB:
        raise DataError(f"data 'text' is byte tokens (ids up to {SMALLEST_VOCAB - 1}); the "
                        f"model's vocabulary has {vocab}: give it a vocab_size of at least "
                        f"{SMALLEST_VOCAB}")
    return "next-token" if task is None else task


def _checked(spec: str, source, example_args: tuple, torch) -> Iterator[tuple]:
    """Each batch must match the example's shapes and dtypes: the captured graph is static.
    A floating tensor is first cast to the example's floating dtype (a model trained in bf16
    or fp16 takes the bundled float32 images in its own dtype, as plain PyTorch would)."""
    for args in source:
        args = tuple(_in_dtype_of(got, want, torch) for got, want in zip(args, example_args)) \
            if isinstance(args, (tuple, list)) and len(args) == len(example_args) else tuple(args)
        if len(args) != len(example_args):
            raise DataError(f"data {spec!r} gives {len(args)} arguments; the model takes "
                            f"{len(example_args)}")
        for k, (got, want) in enumerate(zip(args, example_args)):
            if isinstance(want, torch.Tensor) and (
                    not isinstance(got, torch.Tensor) or got.shape != want.shape
                    or got.dtype != want.dtype):
                # its dtype too: a float batch for integer ids had the example's very shape
                given = f"{tuple(got.shape)} {got.dtype}" if isinstance(got, torch.Tensor) \
                    else type(got).__name__
                raise DataError(f"data {spec!r}: argument {k} is {given}, the model's example "
                                f"is {tuple(want.shape)} {want.dtype}")
        yield args


def _in_dtype_of(got, want, torch):
    if isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor) and \
            got.is_floating_point() and want.is_floating_point():
        return got.to(want.dtype)
    return got


__all__ = ["DATA_SPECS", "NAMED_DATA", "DataError", "DataFunctionFailed", "batches",
           "check_data_fits", "check_data_spec", "digits_batches", "load_data_function",
           "load_digits", "text_batches"]
