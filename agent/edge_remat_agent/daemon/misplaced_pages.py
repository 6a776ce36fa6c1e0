"""What earlier agents paged into WORKDIR/~: before the `~` of a device config's page_dir meant
the board user's home (daemon.layout.job_page_dir), the run and profile jobs took
`page_dir = "~/..."` as a folder under their working directory and left there a model's weight
store (4.4 GB for the 1.1B Llama) and the page stores of killed runs. A daemon starting with no
job running removes what of ours is there, by the names the agent gives it (weight stores,
dead page stores), then the folders that leaves empty; anything else stays."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

_log = logging.getLogger(__name__)


def remove_misplaced_pages(root: Path) -> int:
    """Bytes removed from root/"~" (see the module's docstring)."""
    tilde = root / "~"
    if not tilde.is_dir() or tilde.is_symlink():
        return 0
    try:  # here, not at the top: they import torch, which a daemon starts without
        from ..pages.flash import remove_dead_stores
        from ..weights import WEIGHTS_FOLDER
    except ImportError:
        return 0
    removed = 0
    for folder, subfolders, _ in os.walk(tilde):
        removed += remove_dead_stores(folder)["bytes"]
        if WEIGHTS_FOLDER in subfolders:
            subfolders.remove(WEIGHTS_FOLDER)
            weights = Path(folder) / WEIGHTS_FOLDER
            size = sum(f.stat().st_size for f in weights.rglob("*") if f.is_file())
            shutil.rmtree(weights, ignore_errors=True)
            removed += size if not weights.exists() else 0
    for folder, _, _ in os.walk(tilde, topdown=False):
        try:
            os.rmdir(folder)  # only an empty one
        except OSError:
            pass
    if removed:
        _log.info("removed %d bytes an earlier agent paged into %s (its page_dir's ~ taken "
                  "as a folder name)", removed, tilde)
    return removed
