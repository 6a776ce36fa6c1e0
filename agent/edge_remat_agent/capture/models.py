"""Where models come from: the zoo by name, a transformers model as hf:MODEL (hf.py), or the
user's own code as MODULE:FACTORY.

The whole contract for bringing your own model: `FACTORY()` returns `(module, example_args)` and
`module(*example_args)` returns the scalar training loss. MODULE is an importable module name
(`my_pkg.models`) or a path to a Python file (`examples/my_model.py`). A factory that takes
parameters named `batch`, `image`, `seq` or `seed` receives the command line's values for them.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from ..user_code import (USER_CODE_FAILURES, UserCodeError, import_user_module, raised,
                         users_frame)
from .errors import CaptureError

FACTORY_OPTIONS = ("batch", "image", "seq", "seed")


def load_model(spec: str, batch: int | None = None, image: int | None = None,
               seq: int | None = None, seed: int = 0, dtype: str | None = None,
               train: list[str] | None = None,
               trainable_dtype: str | None = None) -> tuple[torch.nn.Module, tuple]:
    """Build `(module, example_args)` for a zoo name, an hf: spec (hf.py) or MODULE:FACTORY,
    in floating dtype `dtype` (precision.py; None: as the model comes, fp32). `train`: name
    patterns of the parameters to train, the rest frozen (freeze.py; None: as the model
    comes); `trainable_dtype`: the dtype those keep (None: `dtype`). Freezing comes first:
    which parameters train decides their dtype."""
    from .freeze import freeze_except
    from .precision import in_dtype
    module, args = _load(spec, batch, image, seq, seed)
    if train is not None:
        freeze_except(module, list(train), spec)
    return in_dtype(module, args, dtype, spec, trainable_dtype)


def load_source_model(source: dict) -> tuple[torch.nn.Module, tuple]:
    """The model a graph's `capture.source` was captured from, built again as it was (the
    board's executor, plain training of the graph, the footprint probe)."""
    return load_model(source["model"], source.get("batch"), source.get("image"),
                      source.get("seq"), source.get("seed", 0), source.get("dtype"),
                      source.get("train"), source.get("trainable_dtype"))


# torch's sizes are 64-bit: past this it cannot take the size at all ("Overflow when unpacking
# long long", an internal error); below it, a size no machine holds fails to allocate (_too_big)
MAX_EXTENT = 2**63 - 1


def _load(spec: str, batch: int | None, image: int | None, seq: int | None,
          seed: int) -> tuple[torch.nn.Module, tuple]:
    from .hf import load_hf
    from .hf_spec import is_hf_spec
    for name, value in (("batch", batch), ("image", image), ("seq", seq)):
        if value is not None and value > MAX_EXTENT:
            raise CaptureError(spec, f"--{name} {value} does not fit a tensor's 64-bit "
                               f"size (at most {MAX_EXTENT}); use a smaller --{name}")
    if is_hf_spec(spec):
        return _check_result(spec, load_hf(spec, batch, image, seq, seed))
    if ":" not in spec:
        return _from_zoo(spec, batch, image, seq, seed)
    module_part, _, factory_name = spec.rpartition(":")
    if not module_part or not factory_name:  # `:make` read as importing '': "Empty module name"
        empty = "MODULE (before the ':')" if not module_part else "FACTORY (after the ':')"
        raise CaptureError(spec, f"{empty} is empty: give MODULE:FACTORY, MODULE an importable "
                           "module or a .py file, e.g. examples/my_model.py:make_model")
    factory = getattr(_import(module_part, spec), factory_name, None)
    if factory is None or not callable(factory):
        raise CaptureError(spec, f"{module_part} has no callable named {factory_name!r}")
    given = {"batch": batch, "image": image, "seq": seq, "seed": seed}
    try:
        accepted = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        accepted = {}
    kwargs = {k: v for k, v in given.items() if k in accepted and v is not None}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)  # the same initial weights on the host and on the board
        try:
            result = factory(**kwargs)
        except TypeError as exc:
            if users_frame(exc) is not None:  # raised inside the factory
                raise CaptureError(spec, f"the factory raised {raised(exc)}") from exc
            raise CaptureError(spec, f"the factory cannot be called as {factory_name}("
                               + ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
                               + f"): {exc}; its parameters may be only batch, image, seq "
                               "and seed (by those names), each with a default or given "
                               "on the command line") from exc
        except USER_CODE_FAILURES as exc:  # the user's code: say what it raised
            raise _too_big(spec, kwargs, exc) or CaptureError(
                spec, f"the factory raised {raised(exc)}") from exc
    return _check_result(spec, result)


def _from_zoo(name, batch, image, seq, seed):
    from ..zoo import ZooError, build, not_a_model
    if (why := not_a_model(name)) is not None:
        raise CaptureError(name, why)
    try:
        return build(name, batch=batch, image=image, seq=seq, seed=seed)
    except ZooError as exc:
        raise CaptureError(name, str(exc)) from exc
    except (RuntimeError, MemoryError) as exc:
        from ..zoo import READS
        reads = READS[name]  # its one shape option besides the batch: the other has no effect
        shape = {"batch": batch, reads: {"image": image, "seq": seq}[reads]}
        raise _too_big(name, shape, exc) or exc


def _too_big(spec: str, shape: dict, exc: BaseException) -> CaptureError | None:
    """The example inputs are real tensors (the weights are not): a --batch, --image or --seq
    this machine cannot allocate is bad input, said with the size, not an internal error.
    `shape`: the shape options the model reads, as given (None: left out). None where `exc`
    is no failed allocation."""
    import re
    tried = re.search(r"tried to allocate (\d+) bytes", str(exc))
    overflowed = "size calculation overflowed" in str(exc)  # the bytes pass 64 bits
    if not (tried or overflowed or isinstance(exc, MemoryError)):
        return None
    from ..units import format_size
    size = f"a {format_size(int(tried.group(1)))} tensor" if tried else "them"
    why = ("their size in bytes passes 64 bits" if overflowed
           else f"this machine cannot allocate {size}")
    given = {name: value for name, value in shape.items() if name != "seed" and value}
    what = "the example inputs" + (" of " + ", ".join(f"{name} {value}" for name, value
                                                       in given.items()) if given else "")
    todo = ("use a smaller " + " or ".join(f"--{name}" for name in given) if given
            else "make smaller example inputs")
    return CaptureError(spec, f"cannot build {what}: {why}; {todo}")


def _import(module_part: str, spec: str):
    try:
        return import_user_module(module_part, "edge_remat_user_")
    except UserCodeError as exc:
        raise CaptureError(spec, str(exc)) from exc


def _check_result(spec: str, result: Any) -> tuple[torch.nn.Module, tuple]:
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise CaptureError(spec, "the factory must return (module, example_args), got "
                           f"{type(result).__name__}")
    module, args = result
    if not isinstance(module, torch.nn.Module):
        raise CaptureError(spec, f"the factory returned {type(module).__name__} where a "
                           "torch.nn.Module was expected")
    if isinstance(args, torch.Tensor):
        args = (args,)
    if not isinstance(args, (tuple, list)):
        raise CaptureError(spec, "example_args must be a tuple of the forward's arguments, got "
                           f"{type(args).__name__}")
    return module, tuple(args)

