"""The step a run's checkpoint was written after, read without torch.

A run job started again by its daemon (stopped or killed mid-job) picks up from its own newest
checkpoint, and says from which step in its first progress, before its capture: the job
process must not import torch before the capture's child has traced the model
(jobs._capture_before_torch). The checkpoint is torch.save's zip (checkpoint.py); its
data.pkl holds the plain meta dict beside the tensors, which this unpickles into stand-ins
(no torch class is looked up, no code of the file's is run).
"""

from __future__ import annotations

import io
import pickle
import zipfile
from pathlib import Path
from typing import Optional

FORMAT = "edge-remat/checkpoint"
META = "checkpoint"  # the key of the plain meta dict in the checkpoint's dict


class _StandIn:
    """Whatever global the pickle names (torch's tensor rebuild, storages, OrderedDict)."""

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state):
        pass


class _MetaOnly(pickle.Unpickler):
    def find_class(self, module, name):
        return _StandIn

    def persistent_load(self, pid):
        return None  # a tensor's storage record: not read


def checkpoint_step(path: "str | Path") -> Optional[int]:
    """steps_done of the checkpoint at `path`; None where there is none or it is no
    edge-remat checkpoint (read_checkpoint then says what is wrong with it)."""
    try:
        with zipfile.ZipFile(path) as archive:
            name = next(n for n in archive.namelist() if n.endswith("/data.pkl"))
            loaded = _MetaOnly(io.BytesIO(archive.read(name))).load()
        meta = loaded.get(META) if isinstance(loaded, dict) else None
        if isinstance(meta, dict) and meta.get("format") == FORMAT:
            return int(meta["steps_done"])
    except Exception:  # noqa: BLE001 - missing, damaged, foreign: no step to pick up from
        pass
    return None
