"""What the host wants to know about a board before it sends work: versions, RAM, disk.

Cheap on purpose (no torch import: that takes seconds on a Raspberry Pi); the torch version
comes from the installed package's metadata.
"""

from __future__ import annotations

import os
import platform
import shutil
import socket
import sys
from pathlib import Path
from typing import Optional

from .. import __version__
from ..pages.folder import make_page_dir
from .layout import job_page_dir


def torch_version() -> Optional[str]:
    """The installed torch's version, "installed" when it has no metadata, or None."""
    import importlib.util
    try:
        if importlib.util.find_spec("torch") is None:
            return None
    except (ImportError, ValueError):
        return None
    try:
        from importlib import metadata
        return metadata.version("torch")
    except Exception:  # noqa: BLE001 - no metadata (a source build, an old Python)
        return "installed"


def memory_bytes() -> "tuple[Optional[int], Optional[int]]":
    """(total, available) RAM: MemAvailable is what a new process can really get."""
    fields = {}
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                name, _, rest = line.partition(":")
                fields[name] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    if "MemTotal" in fields:
        return fields["MemTotal"], fields.get("MemAvailable", fields.get("MemFree"))
    try:
        import psutil  # optional: macOS and other non-Linux hosts acting as a board
        vm = psutil.virtual_memory()
        return vm.total, vm.available
    except ImportError:
        return None, None


def board_model() -> Optional[str]:
    """The device-tree model ("Raspberry Pi 4 Model B Rev 1.4", "NVIDIA Jetson Nano ...")."""
    for path in ("/proc/device-tree/model", "/sys/firmware/devicetree/base/model"):
        try:
            return Path(path).read_bytes().rstrip(b"\x00").decode("utf-8", "replace").strip()
        except OSError:
            continue
    if "com.termux" in os.environ.get("PREFIX", ""):
        return "Android (Termux)"
    return None


def memory_limit() -> "tuple[Optional[int], Optional[int]]":
    """(limit, free under it) of the memory cgroup this daemon runs in, or (None, None): an
    emulated board's RAM is its cgroup's limit, not the machine's."""
    from ..cgroup_memory import cgroup_memory_limit_bytes, cgroup_memory_usage
    limit = cgroup_memory_limit_bytes()
    if limit is None:
        return None, None
    charged = cgroup_memory_usage()
    return limit, None if charged is None else max(0, limit - charged[0])


def page_dir_status(page_dir: Path) -> dict:
    """Whether the run job could keep its flash pages in page_dir: it exists as a folder or can
    be made, a file can be written there, and how much room there is. `error` says why not."""
    status: dict = {"path": str(page_dir), "ok": False, "free_bytes": None}
    try:
        if page_dir.exists() and not page_dir.is_dir():
            return {**status, "error": f"{page_dir} is a file, not a folder"}
        make_page_dir(page_dir)  # not its parents: an unmounted drive's folder is refused
        probe = page_dir / f".edge-remat-check-{os.getpid()}"
        probe.write_bytes(b"\0")  # the run writes page files here: try one
        probe.unlink()
        status["free_bytes"] = shutil.disk_usage(page_dir).free
    except OSError as exc:
        return {**status, "error": f"cannot write in {page_dir}: {exc.strerror or exc}"}
    return {**status, "ok": True}


def collect(workdir: Path, build: str = "", page_dir: "str | None" = None) -> dict:
    """The board's figures; with page_dir (default WORKDIR/pages, where the run job pages),
    whether that folder is usable (page_dir_status)."""
    total, available = memory_bytes()
    limit, free_under_limit = memory_limit()
    if free_under_limit is not None:
        available = free_under_limit if available is None else min(available, free_under_limit)
    try:
        disk = shutil.disk_usage(workdir)
        disk_total, disk_free = disk.total, disk.free
    except OSError:
        disk_total = disk_free = None
    return {
        "agent_version": __version__,
        "build": build,
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "torch": torch_version(),
        "system": platform.system(),
        "release": platform.release(),
        "machine": platform.machine(),
        "hostname": socket.gethostname(),
        "board": board_model(),
        "cpu_count": os.cpu_count(),
        "ram_total_bytes": total,  # the machine's: profiles are shared across emulated limits
        "ram_limit_bytes": limit,
        "ram_free_bytes": available,
        "disk_total_bytes": disk_total,
        "disk_free_bytes": disk_free,
        "workdir": str(workdir),
        "page_dir": page_dir_status(Path(job_page_dir(page_dir, workdir))),
    }
