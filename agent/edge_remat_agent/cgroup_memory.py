"""The RAM a process on this board can have: physical RAM, and the memory cgroup's limit and
charge where it runs in one (an emulated board is a memory cgroup; its limit is its RAM).
Standard library only, so the daemon's sysinfo reads them without importing torch.

Every /proc and /sys path is read under `root` (default "/"), so tests can point it at a
fixture tree.
"""

from __future__ import annotations

import os


def read_under(root: str, path: str) -> str | None:
    try:
        with open(os.path.join(root, path.lstrip("/")), "rb") as handle:
            return handle.read().decode(errors="replace").replace("\x00", "").strip()
    except OSError:
        return None


def ram_total_bytes(root: str = "/") -> int | None:
    for line in (read_under(root, "/proc/meminfo") or "").splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def cgroup_memory_limit_bytes(root: str = "/") -> int | None:
    """The tightest memory limit of this process's cgroup and its ancestors; None if none.

    An emulated board is a memory cgroup, and its limit, not the host's RAM, is its RAM.
    """
    limits = []
    for line in (read_under(root, "/proc/self/cgroup") or "").splitlines():
        hierarchy, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if hierarchy == "0" and controllers == "":  # cgroup v2: memory.max along the path
            directory = path
            while True:
                value = read_under(root, f"/sys/fs/cgroup{directory.rstrip('/')}/memory.max")
                if value and value != "max":
                    limits.append(int(value))
                if directory in ("/", ""):
                    break
                directory = os.path.dirname(directory.rstrip("/")) or "/"
        elif "memory" in controllers.split(","):  # cgroup v1
            # Inside a container the hierarchy is often mounted at the group itself, so the
            # mount's top file is tried too.
            for directory in (path.rstrip("/"), ""):
                value = read_under(root, f"/sys/fs/cgroup/memory{directory}/memory.limit_in_bytes")
                if value and value.isdigit():
                    limits.append(int(value))
    physical = ram_total_bytes(root)
    # v1 reports "no limit" as a huge number (PAGE_COUNTER_MAX pages).
    real = [n for n in limits if physical is None or n < physical]
    return min(real) if real else None


def _own_group_folders(root: str) -> list[tuple[str, int, str]]:
    """(folder, version, group path) where this process's own memory cgroup may be, in order;
    none where the process is in the root group (whose figures are the whole machine's)."""
    folders = []
    for line in (read_under(root, "/proc/self/cgroup") or "").splitlines():
        hierarchy, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if path.rstrip("/") == "":
            continue
        if hierarchy == "0" and controllers == "":
            folders.append((f"/sys/fs/cgroup{path.rstrip('/')}", 2, path))
        elif "memory" in controllers.split(","):
            # Inside a container the hierarchy may be mounted at the group itself.
            folders += [(f"/sys/fs/cgroup/memory{path.rstrip('/')}", 1, path),
                        ("/sys/fs/cgroup/memory", 1, path)]
    return folders


# Each cgroup version's file for a memory group's high-water mark, and for its usage now
PEAK_FILE = {1: "memory.max_usage_in_bytes", 2: "memory.peak"}
USAGE_FILE = {1: "memory.usage_in_bytes", 2: "memory.current"}
# What a peak restarted by the runtime baseline (restart_cgroup_peak) spans, as reports say it
RESTARTED_PEAK_SCOPE = "since the runtime baseline, just before step 1"


# cgroup v2's memory.peak restarts (Linux 6.12 and later) only for reads through the descriptor
# that wrote to it: restart_cgroup_peak keeps that descriptor open here, by the file's path, and
# cgroup_memory_peak reads through it.
_restarted_peaks: dict[str, int] = {}


def _group_file(root: str, folder: str, name: str) -> str:
    return os.path.join(root, folder.lstrip("/"), name)


def _read_group_file(root: str, folder: str, name: str) -> str | None:
    held = _restarted_peaks.get(_group_file(root, folder, name))
    if held is None:
        return read_under(root, f"{folder}/{name}")
    try:
        return os.pread(held, 64, 0).decode(errors="replace").strip()
    except OSError:
        return None


def _own_group_figure(root: str, files: dict[int, str]) -> tuple[int, int, str] | None:
    """(bytes, cgroup version, group name) from this process's own memory cgroup's file of its
    version in `files`."""
    for folder, version, path in _own_group_folders(root):
        value = _read_group_file(root, folder, files[version])
        if value and value.isdigit():
            return int(value), version, os.path.basename(path.rstrip("/"))
    return None


def cgroup_memory_usage(root: str = "/") -> tuple[int, str] | None:
    """(bytes the kernel charges this process's own memory cgroup now, which group), or None
    where the process is in the root group (whose figure is the whole machine's) or there is
    none. The runtime baseline of a run (executor/baseline.py) reads it."""
    figure = _own_group_figure(root, USAGE_FILE)
    return None if figure is None else (figure[0], f"cgroup v{figure[1]} {figure[2]}")


def cgroup_memory_peak(root: str = "/") -> tuple[int, str] | None:
    """(the most the kernel has charged this process's own memory cgroup, which file of which
    group), or None as for cgroup_memory_usage. Since the group began, or since
    restart_cgroup_peak."""
    figure = _own_group_figure(root, PEAK_FILE)
    if figure is None:
        return None
    peak, version, group = figure
    return peak, f"cgroup v{version} {PEAK_FILE[version]} of {group}"


def restart_cgroup_peak(root: str = "/") -> bool:
    """Restart this process's memory cgroup's high-water mark from its usage now, where the
    kernel lets it: cgroup v1's memory.max_usage_in_bytes, with write access; v2's memory.peak
    on Linux 6.12 and later, for this process's later reads (cgroup_memory_peak) only, since
    the reset belongs to the descriptor written (an older kernel refuses the write). True if
    done."""
    for folder, version, _ in _own_group_folders(root):
        path = _group_file(root, folder, PEAK_FILE[version])
        if os.path.exists(path):
            return _restart_v1(path) if version == 1 else _restart_v2(path)
    return False


def _restart_v1(path: str) -> bool:
    try:
        with open(path, "w") as handle:
            handle.write("0")
        return True
    except OSError:
        return False


def _restart_v2(path: str) -> bool:
    try:
        held = os.open(path, os.O_RDWR)
    except OSError:
        return False
    try:
        os.write(held, b"reset\n")  # any text: the kernel restarts the figure from usage now
    except OSError:
        os.close(held)
        return False
    old = _restarted_peaks.pop(path, None)
    if old is not None:
        os.close(old)
    _restarted_peaks[path] = held
    return True
