"""The trained weights a run hands back (`--save`), and weights a run starts from (`--init`).

The file is torch.save's: a dict from the model's own state_dict() names to tensors, so that
`model.load_state_dict(torch.load(f), strict=False)` loads it into a freshly built model. For a
transformers model (capture/hf.TrainingLoss around it) the names are the transformers model's,
without the wrapper's "model." prefix.

  trained  the parameters that train (requires_grad: all of them, or only those --train or
           LoRA leaves trainable) and the persistent buffers (batch-norm statistics): a LoRA
           run's file holds its adapters only
  all      every parameter and persistent buffer
  none     nothing is saved

The file is written one tensor at a time (_save_streamed): parameters homed on flash are read
from their home one by one, so the whole model is never in memory at once, and what is written
leaves the page cache, which a memory cgroup charges to the run. It is written under a
temporary name and renamed.
"""

from __future__ import annotations

import ctypes
import math
import os
import time
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from ..capture.own_names import state_root
from .errors import BadInput
from .save_choice import check_save_choice
from .torch_file import load_torch_file


def _tensors(module: nn.Module, which: str) -> list[tuple[str, str, torch.Tensor]]:
    """(file key, name in `module`, the parameter or buffer) for what `which` saves: the
    parameters, then the persistent buffers; a tied parameter once, under its first name, as
    state_dict() has it."""
    root, prefix = state_root(module)
    persistent = set(root.state_dict(keep_vars=True))
    out = []
    for key, param in root.named_parameters():
        if which == "all" or param.requires_grad:
            out.append((key, prefix + key, param))
    for key, buffer in root.named_buffers():
        if key in persistent:
            out.append((key, prefix + key, buffer))
    return out


def save_weights(module: nn.Module, home, which: str, path: "str | Path") -> dict | None:
    """Write what `which` saves of the trained `module` to `path` (atomically); `home`: the
    run's ParameterHome (None: every parameter in RAM). Returns the file's figures, or None
    for "none"."""
    if check_save_choice(which) == "none":
        return None
    started = time.perf_counter()
    path = Path(path)
    entries = [(key, _reader(name, tensor, home)) for key, name, tensor in
               _tensors(module, which)]
    write_tensors(entries, path)
    return {"file": path.name, "save": which, "tensors": len(entries),
            "bytes": path.stat().st_size, "save_s": time.perf_counter() - started,
            "keys": "state_dict of " + type(state_root(module)[0]).__name__}


class WeightsSaver:
    """A training job's saving of its trained weights to `path` (`which`: --save's choice),
    as its on_trained callback: `figures` (save_weights'), or `error` where the disk refused
    them (a full disk, say: the job's report still comes back). The planned run's job and
    plain training's share it."""

    def __init__(self, path: "str | Path", which: str):
        self.path, self.which = Path(path), which
        self.figures: dict | None = None
        self.error: str | None = None

    def save(self, module: nn.Module, home=None) -> None:
        try:
            self.figures = save_weights(module, home, self.which, self.path)
        except OSError as error:
            self.error = f"the trained weights were not saved: {error}"


def write_tensors(entries, path: Path, extra: dict | None = None) -> None:
    """torch.save's file of `entries` ((key, how to read its tensor), read one at a time) and
    `extra` (plain values under their own keys), written under a temporary name and renamed:
    a kill or a full disk mid-write leaves the file that was there (the weights, a run's
    checkpoint: checkpoint.py)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        _save_streamed(entries, tmp, extra or {})
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk leaves no half file
        raise
    _sync_folder(path.parent)


def _sync_folder(folder: Path) -> None:
    """The rename on disk too (a power cut after it then finds the new file, not none)."""
    try:
        handle = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(handle)
    except OSError:
        pass  # a filesystem that cannot sync a folder: the rename is still atomic
    finally:
        os.close(handle)


def _reader(name: str, tensor: torch.Tensor, home) -> Callable[[], torch.Tensor]:
    """How to get the trained value of parameter or buffer `name`: from RAM, or from the
    parameter home (a homed parameter's RAM copy is empty between uses)."""
    if home is not None and name in home.params:
        alias = _homed_alias(home, home.params[name])
        if alias is not None:
            if alias in home.served:  # frozen, in the weight page store: read, not paged
                return lambda: home.frozen.file.read(alias)
            return lambda: home.load(alias)
    return lambda: tensor.detach().cpu()


def _homed_alias(home, param: torch.Tensor) -> str | None:
    """The name under which `param` lives in the home (a tied parameter has several)."""
    for name in home.names:
        if home.params[name] is param:
            return name
    return None


def _save_streamed(entries, tmp: Path, extra: dict) -> None:
    """torch.save's format, written one tensor at a time: each tensor is read, written as
    its own record of the zip archive (flushed to disk and dropped from the page cache, which
    a memory cgroup charges to the run) and let go; the pickle of the dict, which needs only
    names, shapes and dtypes, comes last."""
    import zipfile
    placed = []  # (key, dtype, shape)
    with open(tmp, "w+b") as raw, zipfile.ZipFile(raw, "w", zipfile.ZIP_STORED) as archive:
        for index, (key, read) in enumerate(entries):
            value = read().contiguous()
            with archive.open(f"{_ARCHIVE}/data/{index}", "w", force_zip64=True) as record:
                record.write(_memory_of(value))
            placed.append((key, value.dtype, tuple(value.shape)))
            del value  # one tensor at a time
            _drop_written(raw)
        archive.writestr(f"{_ARCHIVE}/data.pkl", _pickled(placed, extra))
        archive.writestr(f"{_ARCHIVE}/byteorder", "little")
        archive.writestr(f"{_ARCHIVE}/version", "3\n")
    with open(tmp, "rb") as raw:
        _drop_written(raw)


_ARCHIVE = "weights"  # the folder inside the zip; torch.load takes whatever name it has


def _memory_of(value: torch.Tensor):
    """The tensor's bytes as a buffer over its own memory (no copy: torch on a board may come
    without numpy)."""
    return (ctypes.c_char * (value.numel() * value.element_size())).from_address(
        value.data_ptr())


def _drop_written(raw) -> None:
    raw.flush()
    os.fdatasync(raw.fileno())  # dirty pages cannot be dropped
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(raw.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def _pickled(placed: list, extra: dict) -> bytes:
    """data.pkl as torch.save writes it: the dict, each tensor rebuilt by
    torch._utils._rebuild_tensor_v2 from the storage record of its index, and `extra`'s
    plain values (what torch.load's weights_only reads: dicts, lists, str, numbers)."""
    import collections
    import io
    import pickle
    storage_types = torch.storage._dtype_to_storage_type_map()

    class Storage:
        def __init__(self, index: int, dtype: torch.dtype, numel: int):
            self.id = ("storage", getattr(torch, storage_types[dtype]), str(index), "cpu",
                       numel)

    class Tensor:
        def __init__(self, storage: Storage, shape: tuple):
            self.storage, self.shape = storage, shape

        def __reduce_ex__(self, protocol):
            return (torch._utils._rebuild_tensor_v2,
                    (self.storage, 0, torch.Size(self.shape), _contiguous_stride(self.shape),
                     False, collections.OrderedDict()))

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj):
            return obj.id if isinstance(obj, Storage) else None

    state = {key: Tensor(Storage(index, dtype, math.prod(shape)), shape)
             for index, (key, dtype, shape) in enumerate(placed)}
    state.update(extra)
    buffer = io.BytesIO()
    Pickler(buffer, protocol=2).dump(state)
    return buffer.getvalue()


def _contiguous_stride(shape: tuple) -> tuple:
    stride, step = [], 1
    for dim in reversed(shape):
        stride.append(step)
        step *= max(dim, 1)
    return tuple(reversed(stride))


# -- starting from saved weights ---------------------------------------------------------

def _mismatch_remedy(saved, model_tensor) -> str:
    """What to do about a tensor of the file unlike the model's: a dtype alone is --dtype, or
    --trainable-dtype for a trainable parameter (mixed precision: precision.py)."""
    if tuple(saved.shape) == tuple(model_tensor.shape):
        from ..capture.precision import DTYPES
        names = [name for name, dtype in DTYPES.items() if dtype == saved.dtype]
        if model_tensor.requires_grad and saved.dtype == torch.float32:
            return ("the file's trainable parameters are fp32 (--dtype fp32, or "
                    "--trainable-dtype fp32 with a half-precision --dtype): give the "
                    "--dtype and --trainable-dtype it was trained with")
        if names:
            return f"the file was trained with --dtype {names[0]}; give the same --dtype"
    return "the file is another model's, or one built with other options"


def load_weights(module: nn.Module, path: "str | Path") -> int:
    """Copy a saved file's tensors into `module` (before the capture's module trains);
    returns how many. Refused, naming the first mismatch, where a name is not the model's or
    a shape or dtype differs. A model built on `meta` (weights/) takes only its trainable
    parameters from the file: its frozen base is read from the weight page store."""
    return load_tensors(module, read_weights_file(path), f"--init {path}")


def load_tensors(module: nn.Module, state: dict, what: str) -> int:
    """load_weights' copy of `state` (state_dict names -> tensors) into `module`, checked
    first; `what` names the file in a refusal ("--init FILE")."""
    targets = {key: (name, tensor) for key, name, tensor in _tensors(module, "all")}
    check_tensors({key: tensor for key, (_, tensor) in targets.items()}, state, what)
    for key in state:
        if targets[key][1].device.type == "meta" and not targets[key][1].requires_grad:
            raise BadInput(f"{what}: {key!r} is a frozen weight of a model whose "
                           "frozen weights are made from its seed (built on meta): give a "
                           "file of its trainable parameters only (--save trained)")
    from ..weights.deferred import set_parameter
    with torch.no_grad():
        for key, value in state.items():
            tensor = targets[key][1]
            if tensor.device.type == "meta":
                set_parameter(tensor, value.clone())
            else:
                tensor.copy_(value)
    return len(state)


def check_tensors(targets: dict, state: dict, what: str) -> None:
    """Refuse, naming the first, a tensor of `state` that `targets` (file key -> the model's
    tensor, or one on meta standing for it) has no name for, or has with another shape or
    dtype."""
    for key, value in state.items():
        if key not in targets:
            near = ", ".join(sorted(targets)[:3])
            raise BadInput(f"{what}: {key!r} is not a parameter or buffer of this model "
                           f"(its names begin {near}, ...): the file is another model's")
        tensor = targets[key]
        if tuple(value.shape) != tuple(tensor.shape) or value.dtype != tensor.dtype:
            raise BadInput(f"{what}: {key!r} is {_described(value)} in the file but "
                           f"{_described(tensor)} in this model: "
                           + _mismatch_remedy(value, tensor))


def state_dict_record(module: nn.Module) -> dict:
    """What a file saved from `module` may hold, for the graph (capture["state_dict"]): file
    key -> shape, dtype and whether it trains. `deploy --init` checks a file against it on
    the host, before anything is sent (recorded_targets)."""
    return {key: {"shape": list(tensor.shape), "dtype": str(tensor.dtype).replace("torch.", ""),
                  "trainable": tensor.requires_grad}
            for key, _, tensor in _tensors(module, "all")}


def recorded_targets(record: dict) -> dict:
    """A state_dict_record as check_tensors' targets: tensors on meta of those shapes and dtypes
    (no memory), the trainable ones requiring gradients (the remedy a dtype calls for)."""
    return {key: torch.empty(entry["shape"], dtype=getattr(torch, entry["dtype"]),
                             device="meta", requires_grad=bool(entry["trainable"]))
            for key, entry in record.items()}


def read_weights_file(path: "str | Path") -> dict:
    """The file's dict of tensors; a file that is not one is refused in one line."""
    state = load_torch_file(
        path, f"--init {path}: no such file",
        lambda why: f"--init {path} is not a weights file that torch.load reads ({why}): give "
                    "one a run saved (OUT/weights.pt)")
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in state.items()):
        raise BadInput(f"--init {path} holds no dict of named tensors: give one a run saved "
                       "(OUT/weights.pt)")
    return state


def _described(tensor: torch.Tensor) -> str:
    return f"{list(tensor.shape)} {str(tensor.dtype).replace('torch.', '')}"

