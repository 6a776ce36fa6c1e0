"""Build the agent as one executable zip (a Python zipapp) that is copied onto boards.

The archive is deterministic: files in sorted order, every entry dated 1980-01-01 with fixed
permissions, one compression level. Its sha256 is therefore a function of the agent's source
alone, and a board that already has an archive of that hash is not sent it again. (The standard
library's `zipapp.create_archive` stamps each entry with the file's mtime, which would change
the hash on every checkout, so the archive is written with `zipfile` in zipapp's layout: a
shebang line, then a zip whose root `__main__.py` starts the CLI.)
"""

from __future__ import annotations

import functools
import hashlib
import io
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

import edge_remat_agent

SHEBANG = b"#!/usr/bin/env python3\n"
MAIN = b"from edge_remat_agent.cli import run_as_process\nrun_as_process()\n"
_DATE = (1980, 1, 1, 0, 0, 0)
_SKIP_DIRS = {"__pycache__"}
_SKIP_SUFFIXES = (".pyc", ".pyo", ".tmp", ".part")


@dataclass(frozen=True)
class AgentArchive:
    path: Path
    sha256: str

    @property
    def name(self) -> str:
        """Content-addressed file name used on the board: agents/<name>."""
        return f"{self.sha256[:16]}.pyz"

    @property
    def size(self) -> int:
        return self.path.stat().st_size


def _entry(name: str, data: bytes) -> "tuple[zipfile.ZipInfo, bytes]":
    info = zipfile.ZipInfo(name, date_time=_DATE)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = 0o644 << 16
    info.create_system = 3  # unix, whatever builds it
    return info, data


def archive_bytes(package_dir: "Path | None" = None) -> bytes:
    package_dir = Path(package_dir or Path(edge_remat_agent.__file__).parent)
    entries = [_entry("__main__.py", MAIN)]
    for root, dirs, files in os.walk(package_dir):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith("."))
        for name in sorted(files):
            if name.endswith(_SKIP_SUFFIXES) or name.startswith("."):
                continue
            path = Path(root) / name
            relative = path.relative_to(package_dir.parent).as_posix()
            entries.append(_entry(relative, path.read_bytes()))
    buffer = io.BytesIO()
    buffer.write(SHEBANG)
    with zipfile.ZipFile(buffer, "w") as archive:
        for info, data in entries:
            archive.writestr(info, data, compresslevel=6)
    return buffer.getvalue()


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "edge-remat" / "agents"


@functools.lru_cache(maxsize=4)
def build_agent_archive(dest_dir: "Path | None" = None) -> AgentArchive:
    """The agent archive for the code installed on this host (built once per process)."""
    data = archive_bytes()
    sha = hashlib.sha256(data).hexdigest()
    if dest_dir:
        return _write_archive(Path(dest_dir), data, sha)
    try:
        return _write_archive(cache_dir(), data, sha)
    except OSError:  # an unwritable HOME (a read-only container, a service user): use /tmp
        import tempfile
        return _write_archive(Path(tempfile.gettempdir()) / f"edge-remat-{os.getuid()}" /
                              "agents", data, sha)


def _write_archive(dest: Path, data: bytes, sha: str) -> AgentArchive:
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / f"{sha[:16]}.pyz"
    if not path.exists() or path.stat().st_size != len(data):
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.chmod(tmp, 0o755)
        os.replace(tmp, path)
        _prune(dest, keep=path)
    return AgentArchive(path, sha)


def _prune(folder: Path, keep: Path, newest: int = 5) -> None:
    """Old builds pile up as the code changes; keep the few newest."""
    old = sorted((p for p in folder.glob("*.pyz") if p != keep),
                 key=lambda p: p.stat().st_mtime, reverse=True)
    for path in old[newest - 1:]:
        try:
            path.unlink()
        except OSError:
            pass
