"""A PEFT model's trained adapter as PEFT itself reads it (`PeftModel.from_pretrained(base,
OUT/adapter)`: adapter_model.safetensors and adapter_config.json), written on the host from
the weights the board handed back (OUT/weights.pt), through this host's capture of the model."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Optional

ADAPTER_FOLDER = "adapter"


def write_peft_adapter(module, weights: "str | Path", out: Path) -> Optional[str]:
    """OUT/adapter for an `hf:` model with a PEFT adapter (None for any other model): the
    trained tensors loaded into this host's copy of the model, saved by PEFT into a folder
    of another name and renamed into place."""
    from edge_remat_agent.capture.own_names import state_root
    from edge_remat_agent.executor.saved_weights import read_weights_file
    root, _ = state_root(module)
    if not (hasattr(root, "peft_config") and hasattr(root, "save_pretrained")):
        return None
    _put_trained(root, read_weights_file(weights))
    folder, tmp = out / ADAPTER_FOLDER, out / f".{ADAPTER_FOLDER}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    root.save_pretrained(str(tmp))
    shutil.rmtree(folder, ignore_errors=True)  # an earlier run's, as weights.pt is replaced
    tmp.rename(folder)
    return str(folder)


def _put_trained(root, trained: dict) -> None:
    """The trained tensors set into this host's copy by reference, not copied in: a plan that
    homes the parameters on flash, checked on this host, leaves that copy's parameters empty
    (QA: load_state_dict refused "[8, 64] into [0]", exit 70 after the run had finished)."""
    import torch
    from edge_remat_agent.weights.deferred import set_parameter
    held = root.state_dict(keep_vars=True)
    for name, value in trained.items():
        if name not in held:
            continue
        value = value.to(held[name].dtype)
        if isinstance(held[name], torch.nn.Parameter):
            set_parameter(held[name], value)
        else:
            held[name].data = value
