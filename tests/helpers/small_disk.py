"""A real small filesystem for tests of a full disk: a tmpfs of a few MiB, mounted for the
test and unmounted after (root; the test skips elsewhere, saying so)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_disk(folder: Path, size: str = "2M"):
    """`folder` (made here) with a tmpfs of `size` mounted on it while the block runs."""
    folder.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}",
                                            "tmpfs", str(folder)],
                                           capture_output=True).returncode != 0:
        pytest.skip("mounting a tmpfs needs root")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)
