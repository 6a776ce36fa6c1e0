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

Parameters homed on flash are read one at a time from their home and appended to a scratch
file per dtype beside the output; torch.save then writes views of those files mapped into
memory (clean file pages, which the kernel reclaims under a memory limit), so the whole model
is never in anonymous memory at once. The file is written under a temporary name and renamed.
"""

from __future__ import annotations

import ctypes
import os
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from .errors import BadInput

SAVE_CHOICES = ("trained", "all", "none")
DEFAULT_SAVE = "trained"
WEIGHTS_FILE = "weights.pt"  # the run job's output file, fetched by the host
_ALIGN = 64  # bytes: each tensor's offset in a scratch file, a multiple of any element size


def check_save_choice(which: str) -> str:
    if which not in SAVE_CHOICES:
        raise BadInput(f"unknown save choice {which!r}: use {' | '.join(SAVE_CHOICES)}")
    return which


def state_root(module: nn.Module) -> tuple[nn.Module, str]:
    """The model whose state_dict() names the file uses, and the prefix of its names in
    `module` (a transformers model wrapped by hf.TrainingLoss: its `model`, "model.")."""
    if type(module).__name__ == "TrainingLoss" and isinstance(getattr(module, "model", None),
                                                              nn.Module):
        return module.model, "model."
    return module, ""


def _tensors(module: nn.Module, which: str) -> list[tuple[str, str, torch.Tensor]]:
    """(file key, name in `module`, the parameter or buffer) for what `which` saves, in
    state_dict() order; a tied parameter once, under its first name, as state_dict() has it."""
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
    tmp = path.with_name(path.name + ".tmp")
    if home is None:
        torch.save({key: read() for key, read in entries}, tmp)
    else:
        _save_streamed(entries, tmp)
    os.replace(tmp, path)
    return {"file": path.name, "save": which, "tensors": len(entries),
            "bytes": path.stat().st_size, "save_s": time.perf_counter() - started,
            "keys": "state_dict of " + type(state_root(module)[0]).__name__}


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


def _save_streamed(entries, tmp: Path) -> None:
    """torch.save of the entries, read one at a time into scratch files and saved from there
    (see the module's note)."""
    with tempfile.TemporaryDirectory(prefix=".weights-", dir=tmp.parent) as scratch:
        placed = []  # (key, dtype, shape, byte offset)
        files: dict[torch.dtype, tuple] = {}  # dtype -> (open file, path)
        try:
            for key, read in entries:
                value = read().contiguous()
                if value.dtype not in files:
                    where = os.path.join(scratch, f"{len(files)}.bin")
                    files[value.dtype] = (open(where, "wb"), where)
                handle = files[value.dtype][0]
                offset = _pad(handle)
                _write_tensor(handle, value)
                placed.append((key, value.dtype, tuple(value.shape), offset))
                del value  # one tensor at a time
        finally:
            for handle, _ in files.values():
                handle.close()
        storages = {dtype: _mapped(where) for dtype, (_, where) in files.items()}
        state = {}
        for key, dtype, shape, offset in placed:
            size = torch.empty((), dtype=dtype).element_size()
            state[key] = torch.empty(0, dtype=dtype).set_(
                storages[dtype], offset // size, shape, _contiguous_stride(shape))
        torch.save(state, tmp)


def _pad(handle) -> int:
    offset = handle.tell()
    gap = -offset % _ALIGN
    if gap:
        handle.write(b"\0" * gap)
    return offset + gap


def _write_tensor(handle, value: torch.Tensor) -> None:
    """The tensor's bytes, written from its own memory (no copy: torch on a board may come
    without numpy)."""
    nbytes = value.numel() * value.element_size()
    if nbytes:
        handle.write((ctypes.c_char * nbytes).from_address(value.data_ptr()))


def _mapped(path: str) -> torch.UntypedStorage:
    size = os.path.getsize(path)
    if size == 0:
        return torch.UntypedStorage(0)
    return torch.UntypedStorage.from_file(path, False, size)  # private, read-only in use


def _contiguous_stride(shape: tuple) -> tuple:
    stride, step = [], 1
    for dim in reversed(shape):
        stride.append(step)
        step *= max(dim, 1)
    return tuple(reversed(stride))


# -- starting from saved weights ---------------------------------------------------------

def load_weights(module: nn.Module, path: "str | Path") -> int:
    """Copy a saved file's tensors into `module` (before the capture's module trains);
    returns how many. Refused, naming the first mismatch, where a name is not the model's or
    a shape or dtype differs. A model built on `meta` (weights/) takes only its trainable
    parameters from the file: its frozen base is read from the weight page store."""
    state = read_weights_file(path)
    targets = {key: (name, tensor) for key, name, tensor in _tensors(module, "all")}
    for key, value in state.items():
        if key not in targets:
            near = ", ".join(sorted(targets)[:3])
            raise BadInput(f"--init {path}: {key!r} is not a parameter or buffer of this model "
                           f"(its names begin {near}, ...): the file is another model's")
        tensor = targets[key][1]
        if tuple(value.shape) != tuple(tensor.shape) or value.dtype != tensor.dtype:
            raise BadInput(f"--init {path}: {key!r} is {_described(value)} in the file but "
                           f"{_described(tensor)} in this model: the file is another "
                           "model's, or one built with other options")
        if tensor.device.type == "meta" and not tensor.requires_grad:
            raise BadInput(f"--init {path}: {key!r} is a frozen weight of a model whose "
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


def read_weights_file(path: "str | Path") -> dict:
    """The file's dict of tensors; a file that is not one is refused in one line."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise BadInput(f"--init {path}: no such file") from None
    except Exception as error:  # noqa: BLE001 - torch.load's many ways to fail on a bad file
        raise BadInput(f"--init {path} is not a weights file that torch.load reads "
                       f"({str(error).splitlines()[0][:160]}): give one a run saved "
                       "(OUT/weights.pt)") from None
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in state.items()):
        raise BadInput(f"--init {path} holds no dict of named tensors: give one a run saved "
                       "(OUT/weights.pt)")
    return state


def _described(tensor: torch.Tensor) -> str:
    return f"{list(tensor.shape)} {str(tensor.dtype).replace('torch.', '')}"

