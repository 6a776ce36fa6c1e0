"""Who measured a profile: board, OS, CPU, memory, torch, sensor. JSON-friendly, Linux first.

Every /proc and /sys path is read under `root` (default "/"), as the sensors do, so tests can
point it at a fixture tree shaped like a Jetson or a Pi.
"""

from __future__ import annotations

import os
import platform
from typing import Any

import torch

# The memory figures are read without torch (the daemon's sysinfo needs them too).
from ..cgroup_memory import cgroup_memory_limit_bytes, ram_total_bytes
from ..cgroup_memory import read_under as _read

# ARM's MIDR part numbers (implementer 0x41) for the cores of the boards we target; arm64
# /proc/cpuinfo gives only these numbers, no model name.
ARM_PARTS = {"0xd03": "Cortex-A53", "0xd04": "Cortex-A35", "0xd05": "Cortex-A55",
             "0xd07": "Cortex-A57", "0xd08": "Cortex-A72", "0xd09": "Cortex-A73",
             "0xd0a": "Cortex-A75", "0xd0b": "Cortex-A76", "0xd0d": "Cortex-A77",
             "0xd41": "Cortex-A78", "0xd42": "Cortex-A78AE", "0xd44": "Cortex-X1",
             "0xd46": "Cortex-A510", "0xd47": "Cortex-A710", "0xd4d": "Cortex-A715",
             "0xd81": "Cortex-A720"}
BOARD_FILES = ("/proc/device-tree/model", "/sys/firmware/devicetree/base/model",
               "/sys/class/dmi/id/product_name")


def board_model(root: str = "/") -> str | None:
    """'NVIDIA Jetson Orin Nano ...', 'Raspberry Pi 5 Model B Rev 1.0', or a PC's DMI name."""
    for path in BOARD_FILES:
        text = _read(root, path)
        if text:
            return text
    return None


def cpu_model(root: str = "/") -> str:
    text = _read(root, "/proc/cpuinfo") or ""
    fields: dict[str, str] = {}
    parts: list[str] = []
    for line in text.splitlines():
        name, _, value = line.partition(":")
        name, value = name.strip(), value.strip()
        if name and value:
            fields.setdefault(name, value)
            if name == "CPU part" and value not in parts:
                parts.append(value)
    for name in ("model name", "Model", "Hardware", "cpu model"):
        if name in fields:
            return fields[name]
    if parts and fields.get("CPU implementer") == "0x41":
        return " + ".join(ARM_PARTS.get(p, f"ARM part {p}") for p in parts)  # big.LITTLE
    return platform.processor() or platform.machine() or "unknown"


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def board_identity(sensor: str | None = None, root: str = "/") -> dict[str, Any]:
    os_release = {}
    for line in (_read(root, "/etc/os-release") or "").splitlines():
        name, _, value = line.partition("=")
        os_release[name] = value.strip().strip('"')
    cuda = None
    if torch.cuda.is_available():
        cuda = torch.cuda.get_device_name(0)
    physical = ram_total_bytes(root)
    limit = cgroup_memory_limit_bytes(root)
    return {
        "board": board_model(root),
        "machine": platform.machine(),
        "os": platform.system(),
        "os_release": os_release.get("PRETTY_NAME"),
        "kernel": platform.release(),
        "cpu": cpu_model(root),
        "cpu_count": os.cpu_count(),
        "cpu_usable": usable_cores(),
        "ram_physical_bytes": physical,
        "cgroup_memory_limit_bytes": limit,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cuda_device": cuda,
        "sensor": sensor,
    }


def effective_ram_bytes(identity: dict[str, Any]) -> int | None:
    """The RAM this process can have: physical RAM, or its cgroup's limit when smaller."""
    figures = [identity.get("ram_physical_bytes"), identity.get("cgroup_memory_limit_bytes")]
    figures = [n for n in figures if n]
    return min(figures) if figures else None
