"""A file of tensors a run reads (--init's weights, --resume's checkpoint), loaded with
torch.load's weights_only unpickler; a missing or damaged one is refused in the caller's words,
never torch's traceback."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch

from .errors import BadInput


def load_torch_file(path: "str | Path", missing: str, unreadable: Callable[[str], str],
                    mmap: bool = False) -> Any:
    """What torch.save wrote at `path`, on the CPU (tensors and plain values only: a pickle
    cannot run code). A missing file is refused with the line `missing`; one torch.load cannot
    read with `unreadable(why)`, `why` being the first sentence of torch's error."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except FileNotFoundError:
        raise BadInput(missing) from None
    except Exception as error:  # noqa: BLE001 - torch.load's many ways to fail on a bad file
        # its first sentence: the rest of "Weights only load failed. In PyTorch 2.6, ..."
        # advises weights_only=False, a pickle that can run code, on a file that is no weights
        why = (str(error).splitlines() or [type(error).__name__])[0].split(". ")[0][:160]
        raise BadInput(unreadable(why)) from None
