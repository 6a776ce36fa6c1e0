"""Which agent code this process runs, and how to start another process of the same code."""

from __future__ import annotations

import functools
import hashlib
import re
import sys
from pathlib import Path
from typing import List, Optional

import edge_remat_agent


def running_archive() -> Optional[Path]:
    """The .pyz this code was imported from, or None when it runs from a package folder."""
    for parent in Path(edge_remat_agent.__file__).parents:
        if parent.is_file():
            return parent
    return None


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


CONTENT_NAME = re.compile(r"^([0-9a-f]{16})\.pyz$")


def archive_damaged(path: Path) -> bool:
    """Whether an archive named by its content (agents/<first 16 hex of its sha256>.pyz, as the
    host pushes it) no longer hashes to its name: truncated or overwritten on the board's disk.
    Read afresh each time (not build_of's cache), since the file may change under a long-lived
    front end. An archive named otherwise is not checked."""
    named = CONTENT_NAME.match(path.name)
    return bool(named) and not file_sha256(path).startswith(named.group(1))


@functools.lru_cache(maxsize=None)
def build_of(archive: Optional[Path]) -> str:
    """An archive's build id is its sha256; code run from a folder is "source-<version>"."""
    if archive is None:
        return f"source-{edge_remat_agent.__version__}"
    return file_sha256(archive)


def own_build() -> str:
    return build_of(running_archive())


@functools.lru_cache(maxsize=None)
def code_digest() -> str:
    """This agent's code down to its bytes: its archive's sha256, or, run from a package folder
    (where `own_build` names only the version), the sha256 of every .py file in it."""
    archive = running_archive()
    if archive is not None:
        return build_of(archive)
    package = Path(edge_remat_agent.__file__).parent
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def agent_command(archive: Optional[Path] = None) -> List[str]:
    """argv that runs `edge-remat-agent` from `archive` (default: the code running now)."""
    archive = archive or running_archive()
    if archive is not None:
        return [sys.executable, str(archive)]
    return [sys.executable, "-m", "edge_remat_agent"]
