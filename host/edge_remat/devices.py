"""Device configs: one TOML per board (device_configs/*.toml), found by name or by path.

    name = "rpi4-lab"
    [connection]
    kind = "ssh"                    # "local" | "ssh" | "serial"
    host = "rpi4"                   # an ~/.ssh/config alias works (HostName, User, Port,
    port = 22                       #   IdentityFile, ProxyJump); fields given here win
    user = "pi"
    key = "~/.ssh/id_ed25519"
    python = "python3"
    workdir = "~/edge-remat"
    host_key_policy = "strict"      # or "accept-new"
    known_hosts = "~/.ssh/known_hosts"
    # serial: port = "/dev/ttyUSB0", baud = 921600
    [hardware]
    ram_bytes = 4294967296
    page_dir = "/home/pi/edge-remat/pages"
    sensor = "none"
    family = "rpi"                  # "jetson" | "rpi" | "android" | "generic": install hints
    memory_limit_bytes = 608174080  # local only: an emulated board, the agent in a memory cgroup
    torch_device = "cpu"            # or "cuda": the board's GPU (a Jetson's) runs its run and
                                    #   profile jobs; its torch must be a CUDA build
    [emulator]                      # ssh only: a board this machine emulates (tools/arm-board),
    kind = "arm64"                  #   built and started on first use; port and keys are its own
    memory_limit_bytes = 2147483648 #   its RAM: a memory cgroup around the board's sshd

Every error names the file and the field.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from edge_remat_agent.device_kinds import TORCH_DEVICES  # its CPU cores, or its GPU
from edge_remat_agent.formats import FormatError
from edge_remat_agent.formats.fields import Reader

from .shipped import shipped_dir
from .tomlfile import read_toml

KINDS = ("local", "ssh", "serial")
HOST_KEY_POLICIES = ("strict", "accept-new")
FAMILIES = ("generic", "jetson", "rpi", "android")
ENV_SEARCH_PATH = "EDGE_REMAT_DEVICE_CONFIGS"


def sensor_names() -> tuple:
    from edge_remat_agent.sensors import SENSORS
    return ("none",) + tuple(sorted(SENSORS))


class DeviceError(ValueError):
    """A device that cannot be found (the message lists the ones that can)."""


@dataclass(frozen=True)
class Connection:
    kind: str
    host: Optional[str] = None
    port: Optional[int] = None
    user: Optional[str] = None
    key: Optional[str] = None
    python: Optional[str] = None
    workdir: str = "~/edge-remat"
    host_key_policy: str = "strict"
    known_hosts: str = "~/.ssh/known_hosts"
    ssh_config: str = "~/.ssh/config"
    agent_port: Optional[int] = None
    device: Optional[str] = None
    baud: int = 921600
    keepalive_s: float = 15.0
    connect_timeout_s: float = 10.0
    reconnect_timeout_s: float = 120.0


@dataclass(frozen=True)
class Hardware:
    ram_bytes: Optional[int] = None
    page_dir: Optional[str] = None
    sensor: str = "none"
    family: str = "generic"
    memory_limit_bytes: Optional[int] = None  # an emulated board: a cgroup's hard limit (local)
    torch_device: str = "cpu"  # where the board's run and profile jobs run torch (TORCH_DEVICES)


# The board's jobs that take a `device` param (the agent's executor and op profiler).
TORCH_DEVICE_JOBS = ("run", "profile")


def with_torch_device(kind: str, params: dict, hardware: Hardware) -> dict:
    """A job's params with the board's torch device added where the job takes one and the
    config names a device other than the CPU (a `device` param given wins)."""
    if kind not in TORCH_DEVICE_JOBS or hardware.torch_device == "cpu" or "device" in params:
        return params
    return {**params, "device": hardware.torch_device}


@dataclass(frozen=True)
class Emulator:
    kind: str = "arm64"
    memory_limit_bytes: Optional[int] = None


@dataclass(frozen=True)
class DeviceConfig:
    name: str
    path: Path
    connection: Connection
    hardware: Hardware = field(default_factory=Hardware)
    description: str = ""
    emulator: Optional[Emulator] = None

    def address(self) -> str:
        c = self.connection
        if c.kind == "local":
            return "this machine"
        if c.kind == "serial":
            return f"{c.device} @ {c.baud} baud"
        if self.emulator and not c.port:
            return f"{c.user}@{c.host} ({self.emulator.kind} under qemu; port chosen at start)"
        user = f"{c.user}@" if c.user else ""
        port = f":{c.port}" if c.port else ""
        return f"{user}{c.host}{port}"


def load_device(path: "str | os.PathLike[str]") -> DeviceConfig:
    path = Path(path)
    top = Reader(read_toml(path, "device config"), str(path))
    top.reject_unknown({"name", "description", "connection", "hardware", "emulator"})
    name = top.str("name", path.stem)
    conn = _connection(top.child("connection"))
    hardware = _hardware(top.child("hardware", None))
    if hardware.memory_limit_bytes and conn.kind != "local":
        raise FormatError(str(path), "hardware.memory_limit_bytes", "no memory limit on a "
                          f"{conn.kind} board (it emulates a board on this machine: kind local)")
    emulator = _emulator(top.child("emulator", None))
    if emulator and conn.kind != "ssh":
        raise FormatError(str(path), "emulator", "an emulated board reached over ssh "
                          "(connection.kind = \"ssh\", host = \"127.0.0.1\")", conn.kind)
    return DeviceConfig(name=name, path=path, connection=conn, hardware=hardware,
                        description=top.str("description", ""), emulator=emulator)


EMULATOR_KINDS = ("arm64",)


def _emulator(r: Optional[Reader]) -> Optional[Emulator]:
    if r is None:
        return None
    r.reject_unknown({"kind", "memory_limit_bytes"})
    return Emulator(kind=r.str("kind", "arm64", choices=EMULATOR_KINDS),
                    memory_limit_bytes=r.integer("memory_limit_bytes", None, minimum=1 << 20))


def _connect_timeout(r: Reader) -> float:
    """Seconds to wait for the board to answer: 0 made every SSH connect fail at once, said as
    "cannot reach ... Operation now in progress" (a socket with timeout 0 does not block)."""
    seconds = r.number("connect_timeout_s", 10.0)
    if seconds == 0:
        raise r.error("connect_timeout_s", "a number of seconds > 0", seconds)
    return seconds


def _connection(r: Reader) -> Connection:
    kind = r.str("kind", choices=KINDS)
    common = {"python", "workdir", "kind", "connect_timeout_s", "reconnect_timeout_s"}
    values = dict(kind=kind, python=r.str("python", None), workdir=r.str("workdir", "~/edge-remat"),
                  connect_timeout_s=_connect_timeout(r),
                  reconnect_timeout_s=r.number("reconnect_timeout_s", 120.0))
    if kind == "ssh":
        r.reject_unknown(common | {"host", "port", "user", "key", "host_key_policy",
                                   "known_hosts", "ssh_config", "agent_port", "keepalive_s"})
        values.update(
            host=r.str("host"), port=_port(r, "port"), user=r.str("user", None),
            key=r.str("key", None),
            host_key_policy=r.str("host_key_policy", "strict", choices=HOST_KEY_POLICIES),
            known_hosts=r.str("known_hosts", "~/.ssh/known_hosts"),
            ssh_config=r.str("ssh_config", "~/.ssh/config"), agent_port=_port(r, "agent_port"),
            keepalive_s=r.number("keepalive_s", 15.0))
        if not values["host"]:
            raise r.error("host", "a host name, address or ~/.ssh/config alias", "")
    elif kind == "serial":
        r.reject_unknown(common | {"port", "device", "baud"})
        device = r.str("port", None) or r.str("device", None)
        if not device:
            raise r.error("port", 'the serial device, e.g. "/dev/ttyUSB0"')
        values.update(device=device, baud=r.integer("baud", 921600, minimum=300))
    else:
        r.reject_unknown(common)
    return Connection(**values)


def _port(r: Reader, key: str) -> Optional[int]:
    value = r.integer(key, None, minimum=1)
    if value is not None and value > 65535:
        raise r.error(key, "a TCP port (1-65535)", value)
    return value


def _hardware(r: Optional[Reader]) -> Hardware:
    if r is None:
        return Hardware()
    r.reject_unknown({"ram_bytes", "page_dir", "sensor", "family", "memory_limit_bytes",
                      "torch_device"})
    return Hardware(ram_bytes=r.integer("ram_bytes", None, minimum=1),
                    page_dir=r.str("page_dir", None),
                    sensor=r.str("sensor", "none", choices=sensor_names()),
                    family=r.str("family", "generic", choices=FAMILIES),
                    memory_limit_bytes=r.integer("memory_limit_bytes", None, minimum=1 << 20),
                    torch_device=r.str("torch_device", "cpu", choices=TORCH_DEVICES))


def write_local_device(folder: Path, name: str, workdir: Path, **hardware) -> Path:
    """Write a device config `name` for this machine into `folder` (made if missing): workdir
    `workdir`, no power sensor, `hardware` as more [hardware] keys (page_dir,
    memory_limit_bytes). Returns the file; EDGE_REMAT_DEVICE_CONFIGS=folder finds it."""
    folder.mkdir(parents=True, exist_ok=True)
    # JSON's string escapes are valid in TOML basic strings
    keys = "".join(f"{key} = {json.dumps(str(v)) if isinstance(v, (str, Path)) else v}\n"
                   for key, v in hardware.items())
    path = folder / f"{name}.toml"
    path.write_text(f'name = {json.dumps(name)}\n[connection]\nkind = "local"\n'
                    f'workdir = {json.dumps(str(workdir))}\n[hardware]\n{keys}sensor = "none"\n')
    return path


def search_dirs() -> "list[Path]":
    dirs = [Path(p) for p in os.environ.get(ENV_SEARCH_PATH, "").split(os.pathsep) if p]
    dirs.append(Path.cwd() / "device_configs")
    dirs.append(shipped_dir("device_configs"))  # the wheel's, or the repository's
    seen, unique = set(), []
    for d in dirs:
        key = d.resolve()
        if key not in seen and d.is_dir():
            seen.add(key)
            unique.append(d)
    return unique


def config_files() -> "list[Path]":
    """Every device config on the search path; an earlier folder shadows a later one."""
    found: dict = {}
    for directory in search_dirs():
        for path in sorted(directory.glob("*.toml")):
            found.setdefault(path.stem, path)
    return list(found.values())


def list_devices() -> "list[DeviceConfig]":
    return [load_device(path) for path in config_files()]


def find_device(name_or_path: str) -> DeviceConfig:
    """By path (anything ending in .toml or containing a slash), by file name or `name`, or
    by an unambiguous prefix of either."""
    if not name_or_path.strip():  # a prefix of every name: not "ambiguous", but no name at all
        raise DeviceError("no device named (an empty name): give a device config's name "
                          "(`edge-remat devices` lists them) or a path to a .toml")
    if name_or_path.endswith(".toml") or os.sep in name_or_path or "/" in name_or_path:
        return load_device(name_or_path)
    files = config_files()
    by_stem = {p.stem: p for p in files}
    if name_or_path in by_stem:
        return load_device(by_stem[name_or_path])
    # A config that cannot be read is no match by its `name` (unknown), but stops a lookup
    # its file name could match: one broken file made every other name unknowable (QA).
    devices, broken = [], {}
    for path in files:
        try:
            devices.append(load_device(path))
        except FormatError as error:
            broken[path.stem] = error
    if (error := next((e for stem, e in broken.items() if stem.startswith(name_or_path)),
                      None)) is not None:
        raise error
    exact = [d for d in devices if d.name == name_or_path]
    if len(exact) == 1:
        return exact[0]
    prefixed = [d for d in devices if d.path.stem.startswith(name_or_path)
                or d.name.startswith(name_or_path)]
    if len(prefixed) == 1:
        return prefixed[0]
    known = ", ".join(sorted(by_stem)) or "none"
    if broken:
        known += f" (not readable: {', '.join(sorted(broken))})"
    if prefixed:
        raise DeviceError(f"device {name_or_path!r} is ambiguous: it could be "
                          + ", ".join(sorted(d.path.stem for d in prefixed)))
    where = ", ".join(str(d) for d in search_dirs()) or "no device_configs folder"
    raise DeviceError(f"no device config named {name_or_path!r} (known: {known}; searched "
                      f"{where}; or pass a path to a .toml)")


def device_argument(device: DeviceConfig) -> str:
    """What `--device` takes to find this config again, for the commands a message names: its
    name where that finds this very file, else its path (QA: a run given `--device
    ser/serial.toml` said to come back with `--device my-serial`, which no search finds)."""
    try:
        if os.path.realpath(find_device(device.name).path) == os.path.realpath(device.path):
            return device.name
    except (DeviceError, FormatError):
        pass
    import shlex
    return shlex.quote(str(device.path))


def shared_names(configs: list[tuple[str, str]]) -> list[str]:
    """A note for each name that several configs give (name, path): which one `--device NAME`
    takes, by find_device's rules (a file name first), or that it is ambiguous. A listing
    showed two rows named rpi4 and said nothing of which one a run would reach (QA)."""
    by_name: dict[str, list[Path]] = {}
    for name, path in configs:
        by_name.setdefault(name, []).append(Path(path))
    notes = []
    for name, paths in by_name.items():
        if len(paths) < 2:
            continue
        named = [path for path in paths if path.stem == name]
        takes = (f"--device {name} takes {named[0]}, whose file name it is" if named else
                 f"--device {name} is ambiguous: give a config's path")
        notes.append(f"{len(paths)} device configs are named {name!r} "
                     f"({', '.join(map(str, paths))}): {takes}")
    return notes


def local_python(conn: Connection) -> str:
    return conn.python or sys.executable
