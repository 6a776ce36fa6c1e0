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


def collect(workdir: Path, build: str = "") -> dict:
    total, available = memory_bytes()
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
        "ram_total_bytes": total,
        "ram_free_bytes": available,
        "disk_total_bytes": disk_total,
        "disk_free_bytes": disk_free,
        "workdir": str(workdir),
    }
