"""Where each step's batch comes from: the capture's example batch, a data spec, a callable, or
an iterable.

A batch is the model's example_args for that step: `module(*batch)` is the loss. The graph was
captured for fixed shapes and dtypes, so every batch must have exactly those. A data spec
("example", "digits", "MODULE:FUNCTION") is what a run job gets from the host; it is read by
edge_remat_agent.data, the same code plain training (plain_train.py) reads it with, so that a
plain and a planned run see the same batches.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from .errors import BadBatch

BatchSource = Callable[[int], tuple]


def is_example(data: Any) -> bool:
    """Whether `data` means the capture's example batch every step (None or "example")."""
    return data is None or (isinstance(data, str) and data.strip() in ("", "example"))


def data_name(data: Any) -> str:
    """What a run report says it trained on."""
    if is_example(data):
        return "example"
    if isinstance(data, str):
        return data.strip()
    return f"given by the caller ({'a callable' if callable(data) else type(data).__name__})"


def batch_source(data: Any, example_args: tuple, device: torch.device,
                 seed: int = 0, model: torch.nn.Module | None = None,
                 skip: int = 0) -> BatchSource:
    """data: None or "example" (the example batch every step), a data spec such as "digits" or
    "MODULE:FUNCTION" (edge_remat_agent.data, shuffled with `seed`, for `model`), a callable
    step -> batch, or an iterable of batches. `skip`: batches an earlier part of the run drew
    (a resumed run's): an iterable's first ones are drawn and dropped, so that the next is
    the one the uninterrupted run would draw (a callable is asked by the batch's index)."""
    if is_example(data):
        fixed = _to_device(tuple(example_args), device)
        return lambda step: fixed
    if isinstance(data, str):
        from ..data import DataError, batches
        try:
            data = _data_errors(batches(data.strip(), tuple(example_args), seed, model),
                                DataError)
        except DataError as error:
            raise BadBatch(str(error)) from None
    if callable(data):
        return lambda step: check_batch(data(step), example_args, step, device)
    try:
        iterator = iter(data)
    except TypeError:
        raise BadBatch(f"data must be None, a data spec (\"example\", \"digits\", "
                       f"\"MODULE:FUNCTION\"), a callable (step -> batch) or an iterable of "
                       f"batches, got {type(data).__name__}") from None
    for drawn in range(skip):
        try:
            next(iterator)
        except StopIteration:
            raise BadBatch(f"data ran out of batches at step {drawn + 1}") from None

    def next_batch(step: int) -> tuple:
        try:
            batch = next(iterator)
        except StopIteration:
            raise BadBatch(f"data ran out of batches at step {step + 1}") from None
        return check_batch(batch, example_args, step, device)
    return next_batch


def _data_errors(source, error_type):
    """A data spec's batches, its errors (raised as it yields) as BadBatch."""
    try:
        yield from source
    except error_type as error:
        raise BadBatch(str(error)) from None


def check_batch(batch: Any, example_args: tuple, step: int, device: torch.device) -> tuple:
    if isinstance(batch, torch.Tensor):
        batch = (batch,)
    if not isinstance(batch, (tuple, list)) or len(batch) != len(example_args):
        raise BadBatch(f"batch of step {step + 1}: expected {len(example_args)} arguments like "
                       f"the captured example, got {_describe(batch)}")
    for i, (got, want) in enumerate(zip(batch, example_args)):
        if isinstance(want, torch.Tensor):
            if not isinstance(got, torch.Tensor) or got.shape != want.shape \
                    or got.dtype != want.dtype:
                raise BadBatch(f"batch of step {step + 1}, argument {i}: the graph was captured "
                               f"for {_describe(want)}, got {_describe(got)}; capture again "
                               "for other shapes")
    return _to_device(tuple(batch), device)


def _to_device(batch: tuple, device: torch.device) -> tuple:
    return tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in batch)


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {str(value.dtype).removeprefix('torch.')} tensor of shape {list(value.shape)}"
    if isinstance(value, (tuple, list)):
        return f"{len(value)} arguments"
    return type(value).__name__
