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
    root.load_state_dict(read_weights_file(weights), strict=False)
    folder, tmp = out / ADAPTER_FOLDER, out / f".{ADAPTER_FOLDER}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    root.save_pretrained(str(tmp))
    shutil.rmtree(folder, ignore_errors=True)  # an earlier run's, as weights.pt is replaced
    tmp.rename(folder)
    return str(folder)
