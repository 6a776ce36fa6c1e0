"""An ARM64 board on this machine: a Debian arm64 userland run by qemu-user, reached over SSH.

    board = ArmBoard()                 # cache: /var/cache/edge-remat/arm-board (EDGE_REMAT_ARM_BOARD)
    board.build(say)                   # debootstrap --arch=arm64, torch's aarch64 wheel, sshd
    state = board.start(say, memory_limit_bytes=2 << 30)   # sshd on a free loopback port
    board.stop(say)                    # kills every process of the board; its mounts go with them

What it is: `debootstrap --arch=arm64` builds the root filesystem (python3, openssh-server);
binfmt_misc hands every aarch64 binary to qemu-user-static, so python3, sshd and torch run
unchanged, as aarch64 code, on this x86 machine. torch==2.13.0 comes from PyPI as the board's
own pip would fetch it (the manylinux aarch64 wheel and its dependencies), unpacked into the
root filesystem by the host's pip (unpacking under emulation would take minutes longer).

Running it: sshd starts inside a memory cgroup (the board's RAM, as on `emulated-board`) and in a
mount namespace of its own, where the root filesystem gets its own /proc, /sys, /dev, /run and a
read-only view of the memory cgroup (so the agent reads its limit as on a real board). Nothing is
mounted on the host: the namespace, and its mounts, end with the last process of the board, and
`stop` kills them all through the cgroup.

Timings on this board are qemu's (every aarch64 instruction is translated), not a Pi's.
Everything here needs root (debootstrap, chroot, mount, cgroups); `unavailable_reason()` says,
in one line, what is missing.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Optional

from edge_remat_agent.cgroup_memory import ram_total_bytes
from edge_remat_agent.units import format_size

from .cgroup import CgroupUnavailable, MemoryCgroup, find_memory_hierarchy
from .heartbeat import still_saying

DEFAULT_CACHE = "/var/cache/edge-remat/arm-board"
ENV_CACHE = "EDGE_REMAT_ARM_BOARD"
SUITE = "bookworm"  # Debian 12: python 3.11, glibc 2.36
MIRROR = "http://deb.debian.org/debian"
PACKAGES = ("python3", "openssh-server")
TORCH = "torch==2.13.0"
# The manylinux tags a glibc 2.36 aarch64 system accepts (what its own pip would try).
WHEEL_PLATFORMS = (["linux_aarch64", "manylinux2014_aarch64"]
                   + [f"manylinux_2_{minor}_aarch64" for minor in range(17, 37)])
USER = "board"
USER_ID = 4242  # its processes show as this uid on the host: one no host account is likely to use
BUILD_VERSION = 2  # bump when the recipe changes: an older cached board is rebuilt (2: bytecode)
SSH_READY_TIMEOUT_S = 90.0

Say = Callable[[str], None]


class ArmBoardError(RuntimeError):
    """The board cannot be built or started here; the message says why and what to do."""


def cache_dir() -> Path:
    return Path(os.environ.get(ENV_CACHE) or DEFAULT_CACHE)


def unavailable_reason() -> Optional[str]:
    """None where the board can be built and run here, else what is missing (one line)."""
    if os.geteuid() != 0:
        return "the arm64 board needs root (debootstrap, chroot, mounts, a memory cgroup)"
    for tool, package in (("debootstrap", "debootstrap"), ("unshare", "util-linux"),
                          ("ssh-keygen", "openssh-client")):
        if shutil.which(tool) is None:
            return (f"{tool} is missing: apt-get install debootstrap qemu-user-static "
                    f"binfmt-support ({package})")
    try:
        ensure_binfmt()
    except ArmBoardError as exc:
        return str(exc)
    try:
        find_memory_hierarchy()
    except CgroupUnavailable as exc:
        return str(exc)
    return None


BINFMT = Path("/proc/sys/fs/binfmt_misc")


def ensure_binfmt() -> None:
    """aarch64 ELF files run through qemu: mount binfmt_misc and enable Debian's qemu-aarch64
    entry (registered with the F flag, so it also works inside the chroot)."""
    if not (BINFMT / "register").exists():
        _run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT)],
             "mount binfmt_misc (needed to run aarch64 programs through qemu)")
    entry = BINFMT / "qemu-aarch64"
    if not entry.exists() or "enabled" not in entry.read_text():
        if shutil.which("update-binfmts") is None:
            raise ArmBoardError("no binfmt entry for aarch64 and no update-binfmts: apt-get "
                                "install qemu-user-static binfmt-support")
        _run(["update-binfmts", "--enable", "qemu-aarch64"],
             "enable the qemu-aarch64 binfmt entry (apt-get install qemu-user-static)")
    if "enabled" not in entry.read_text():
        raise ArmBoardError(f"{entry} is not enabled after update-binfmts --enable qemu-aarch64")


class ArmBoard:
    def __init__(self, root: "Path | str | None" = None):
        self.dir = Path(root) if root else cache_dir()
        self.rootfs = self.dir / "rootfs"
        self.wheels = self.dir / "wheels"
        self.client = self.dir / "client"
        self.state_file = self.dir / "state.json"
        self.built_file = self.dir / "built.json"
        self.log = self.dir / "board.log"

    # -- facts -------------------------------------------------------------------------------
    @property
    def cgroup_name(self) -> str:
        digest = hashlib.sha256(str(self.dir.resolve()).encode()).hexdigest()[:8]
        return f"arm-board-{digest}"

    @property
    def client_key(self) -> Path:
        return self.client / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.client / "known_hosts"

    def built(self) -> Optional[dict]:
        facts = _read_json(self.built_file)
        if facts and facts.get("version") == BUILD_VERSION and self._rootfs_complete():
            return facts
        return None

    def _rootfs_complete(self) -> bool:
        """Whether the root filesystem has what debootstrap installs for the board (a folder
        without them was left by a build stopped part way, or emptied by hand)."""
        return all((self.rootfs / path).exists() for path in ("usr/bin/python3", "usr/sbin/sshd"))

    def state(self) -> Optional[dict]:
        """The running board's state (pid, port, ...), or None when it does not run."""
        state = _read_json(self.state_file)
        if not state or not _alive(state.get("pid")):
            return None
        group = self._group()
        if group is None or not group.holds(state["pid"]):
            return None
        return state

    def status(self) -> dict:
        built, state = self.built(), self.state()
        answer = {"dir": str(self.dir), "built": built, "running": state is not None,
                  "state": state}
        group = self._group()
        if state and group is not None:
            answer.update(memory_limit_bytes=group.limit_bytes(),
                          memory_usage_bytes=group.usage_bytes(),
                          memory_peak_bytes=group.peak_bytes(), processes=len(group.pids()))
        return answer

    # -- build -------------------------------------------------------------------------------
    def build(self, say: Say = print) -> dict:
        """Build what is missing (each stage is kept, so an interrupted build resumes)."""
        reason = unavailable_reason()
        if reason:
            raise ArmBoardError(reason)
        facts = self.built()
        if facts:
            say(f"arm64 board: already built in {self.dir} ({facts['build_s']:.0f} s to build)")
            return facts
        self.dir.mkdir(parents=True, exist_ok=True)
        with self._lock():
            started = time.monotonic()
            timings = {}
            partial, target = self.dir / "rootfs.partial", lambda: self._site_packages()
            for name, stage, measure in (
                    ("debootstrap", self._debootstrap, lambda: _folder_size(partial, "so far")),
                    ("wheels", self._wheels, lambda: _folder_size(self.wheels, "of about 2.67 GiB")),
                    ("torch", self._install_torch, lambda: _folder_size(target(), "unpacked")),
                    ("bytecode", self._compile_bytecode, None),
                    ("ssh", self._configure_ssh, None), ("cpu", self._read_hwcaps, None),
                    ("check", self._check, None)):
                t0 = time.monotonic()
                with still_saying(say, f"arm64 board: {name}", measure):
                    stage(say)
                timings[name] = round(time.monotonic() - t0, 1)
            facts = {"version": BUILD_VERSION, "suite": SUITE, "torch": TORCH,
                     "python": self._python_name(), "build_s": round(time.monotonic() - started, 1),
                     "stages_s": timings, "check": self._check_result,
                     "cpu_features": self._features}
            _write_json(self.built_file, facts)
        say(f"arm64 board: built in {facts['build_s']:.0f} s ({self.dir})")
        return facts

    def _debootstrap(self, say: Say) -> None:
        if self._rootfs_complete():
            return
        if self.rootfs.exists():  # else the rename below fails: "Directory not empty"
            if self.state() is not None:
                raise ArmBoardError(f"{self.rootfs} has no python3 or sshd, and the board runs "
                                    "from it: tools/arm-board stop, then build again")
            say(f"arm64 board: {self.rootfs} has no python3 or sshd (a build stopped part way): "
                "removing it to build it again")
            _remove_tree(self.rootfs)
            if self.rootfs.exists():
                raise ArmBoardError(f"cannot remove the unfinished {self.rootfs}: remove it "
                                    f"(rm -rf {self.rootfs}), then build again")
        partial = self.dir / "rootfs.partial"
        if partial.exists():
            _remove_tree(partial)
        say(f"arm64 board: debootstrap --arch=arm64 {SUITE} ({', '.join(PACKAGES)}): a few "
            "minutes")
        command = ["debootstrap", "--arch=arm64", "--variant=minbase",
                   f"--include={','.join(PACKAGES)}", SUITE, str(partial), MIRROR]
        _stream(command, self.dir / "debootstrap.log", say, _debootstrap_progress())
        partial.rename(self.rootfs)

    def _python_name(self) -> str:
        """python3.11, from the root filesystem's python3 link."""
        return os.path.basename(os.readlink(self.rootfs / "usr/bin/python3"))

    def _site_packages(self) -> Path:
        return self.rootfs / "usr/local/lib" / self._python_name() / "dist-packages"

    def _pip_target(self) -> list:
        version = self._python_name().removeprefix("python")
        tags = [a for p in WHEEL_PLATFORMS for a in ("--platform", p)]
        return ["--only-binary=:all:", *tags, "--python-version", version,
                "--implementation", "cp"]

    def _wheels(self, say: Say) -> None:
        done = self.wheels / ".complete"
        if done.exists():
            return
        say(f"arm64 board: downloading {TORCH} for aarch64 and its dependencies from PyPI "
            "(about 2.7 GB: PyPI's aarch64 torch is its CUDA build)")
        self.wheels.mkdir(exist_ok=True)
        _stream([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
                 *self._pip_target(), "-d", str(self.wheels), TORCH],
                self.dir / "pip-download.log", say, None)
        done.write_text(TORCH + "\n")

    def _install_torch(self, say: Say) -> None:
        target = self._site_packages()
        done = target / ".edge-remat-torch"
        if done.exists() and done.read_text().strip() == TORCH:
            return
        say(f"arm64 board: installing {TORCH} into the board's {target.relative_to(self.rootfs)}")
        target.mkdir(parents=True, exist_ok=True)
        # --no-compile: the host's Python would write bytecode for its own version
        # (_compile_bytecode writes the board's).
        _stream([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                 "--no-index", "--find-links", str(self.wheels), *self._pip_target(),
                 "--no-compile", "--upgrade", "--target", str(target), TORCH],
                self.dir / "pip-install.log", say, None)
        done.write_text(TORCH + "\n")

    def _compile_bytecode(self, say: Say) -> None:
        """Bytecode for every module in the board's site-packages, as its own pip would have
        written. The board's user cannot write there, so without it every process on the board
        compiled the ~1000 modules `import torch` loads, under qemu: 43 s an import against 19 s
        with bytecode (this machine, loaded). A host Python of the board's version writes the
        same bytecode natively; another version would not, so the board's own compiles it."""
        target = self._site_packages()
        done = target / ".edge-remat-bytecode"
        if done.exists() and done.read_text().strip() == TORCH:
            return
        board_version = self._python_name().removeprefix("python")
        say(f"arm64 board: compiling the bytecode of {target.relative_to(self.rootfs)}")
        if board_version == f"{sys.version_info.major}.{sys.version_info.minor}":
            # stripped of the root filesystem's path: the board's paths in tracebacks
            _run([sys.executable, "-c", COMPILE_SCRIPT, str(target), str(self.rootfs)],
                 "compile the board's bytecode")
        else:
            inside = "/" + str(target.relative_to(self.rootfs))
            with self._namespace_shell() as run:
                run(["/usr/bin/python3", "-c", COMPILE_SCRIPT, inside, "/"])
        done.write_text(TORCH + "\n")

    def _configure_ssh(self, say: Say) -> None:
        say(f"arm64 board: user {USER!r}, its SSH key and sshd's configuration")
        if subprocess.run(["chroot", str(self.rootfs), "id", USER],
                          capture_output=True).returncode != 0:
            _run(["chroot", str(self.rootfs), "useradd", "--create-home", "--shell", "/bin/sh",
                  "--uid", str(USER_ID), USER], f"add the user {USER} on the board")
        # "*": no password, yet not locked (sshd without PAM refuses a locked account)
        _run(["chroot", str(self.rootfs), "usermod", "-p", "*", USER], f"unlock {USER}")
        self.client.mkdir(mode=0o700, exist_ok=True)
        if not self.client_key.exists():
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "edge-remat arm-board",
                  "-f", str(self.client_key)], "make the board's client key")
        home = self.rootfs / "home" / USER
        uid, gid = (home.stat().st_uid, home.stat().st_gid)
        ssh_dir = home / ".ssh"
        ssh_dir.mkdir(mode=0o700, exist_ok=True)
        keys = ssh_dir / "authorized_keys"
        keys.write_text(Path(str(self.client_key) + ".pub").read_text())
        for path in (ssh_dir, keys):
            os.chown(path, uid, gid)
        keys.chmod(0o600)
        (self.rootfs / "etc/ssh/sshd_config.d/edge-remat.conf").write_text(
            "# edge-remat arm-board: loopback only, keys only, one user\n"
            "ListenAddress 127.0.0.1\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            f"UsePAM no\nPermitRootLogin no\nAllowUsers {USER}\nUseDNS no\nX11Forwarding no\n"
            "PidFile none\n")

    def _read_hwcaps(self, say: Say) -> None:
        """The emulated CPU's features, from the aarch64 auxiliary vector qemu gives a process
        (for the /proc/cpuinfo the board gets: see cpuinfo_text)."""
        script = ("import struct; d = open('/proc/self/auxv', 'rb').read(); "
                  "v = dict(struct.iter_unpack('<QQ', d)); print(v.get(16, 0), v.get(26, 0))")
        with self._namespace_shell() as run:
            hwcap, hwcap2 = (int(n) for n in run(["/usr/bin/python3", "-c", script]).split()[-2:])
        self._features = cpu_features(hwcap, hwcap2)
        say(f"arm64 board: the emulated CPU has {' '.join(self._features)}")

    def _check(self, say: Say) -> None:
        say("arm64 board: first start of python3 and torch under qemu (about half a minute)")
        script = ("import platform, time; t = time.time(); import torch; "
                  "print(platform.machine(), torch.__version__, round(time.time() - t, 1))")
        with self._namespace_shell() as run:
            out = run(["/usr/bin/python3", "-c", script])
        machine, version, seconds = out.split()[-3:]
        if machine != "aarch64":
            raise ArmBoardError(f"the board's python3 says it runs on {machine}, not aarch64")
        self._check_result = {"machine": machine, "torch": version, "import_torch_s": float(seconds)}
        say(f"arm64 board: python3 on {machine}, torch {version}, import took {seconds} s")

    # -- run ---------------------------------------------------------------------------------
    def start(self, say: Say = print, memory_limit_bytes: Optional[int] = None) -> dict:
        """Build if needed, then run sshd (idempotent: a running board is kept; its memory
        limit is set to this one)."""
        # a board already built is no news to every command that starts it (QA: each
        # emulated-arm64 command, `job-status --json` too, said "already built" on stderr)
        self.build(say if not self.built() else lambda line: None)
        with self._lock():
            state = self.state()
            group = self._ensure_group(memory_limit_bytes)
            if state is not None:
                was = state.get("memory_limit_bytes")
                if memory_limit_bytes and was != memory_limit_bytes:
                    # `arm-board start --memory-limit` set another: the caller's stands (a
                    # device config's), and saying so explains the board's new RAM
                    say(f"arm64 board: its memory limit goes from "
                        f"{format_size(was) if was else 'none'} to "
                        f"{format_size(memory_limit_bytes)}")
                    state["memory_limit_bytes"] = memory_limit_bytes
                    _write_json(self.state_file, state)
                return state
            group.remove()  # leftovers of a board that died: kill, and a fresh peak
            group = self._ensure_group(memory_limit_bytes)
            port = _free_port()
            say(f"arm64 board: starting sshd on 127.0.0.1:{port}")
            self._write_known_hosts(port)
            log = open(self.log, "ab")
            process = subprocess.Popen(
                group.exec_prefix() + self._in_namespace(port, ["sshd"]),
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
            log.close()
            try:
                with still_saying(say, "arm64 board: waiting for its sshd (under qemu)"):
                    _wait_for_ssh(port, process, SSH_READY_TIMEOUT_S, self.log)
            except ArmBoardError:
                self._ensure_group(memory_limit_bytes).remove()
                raise
            state = {"pid": process.pid, "port": port, "user": USER,
                     "key": str(self.client_key), "known_hosts": str(self.known_hosts),
                     "memory_limit_bytes": memory_limit_bytes, "cgroup": str(group.path),
                     "started": time.strftime("%Y-%m-%dT%H:%M:%S")}
            _write_json(self.state_file, state)
            say(f"arm64 board: sshd (pid {process.pid}) listens on 127.0.0.1:{port}")
            return state

    def stop(self, say: Say = print) -> bool:
        """Kill every process of the board (sshd, sessions, the agent); True if one ran."""
        with self._lock():
            group = self._group()
            pids = group.pids() if group is not None else []
            if group is not None:
                group.remove()
            self.state_file.unlink(missing_ok=True)
        if pids:
            say(f"arm64 board: stopped ({len(pids)} processes)")
        return bool(pids)

    # -- helpers -----------------------------------------------------------------------------
    def _group(self) -> Optional[MemoryCgroup]:
        try:
            return MemoryCgroup.existing(self.cgroup_name)
        except CgroupUnavailable:
            return None

    def _ensure_group(self, memory_limit_bytes: Optional[int]) -> MemoryCgroup:
        limit = memory_limit_bytes or ram_total_bytes()
        try:
            return MemoryCgroup.ensure(self.cgroup_name, limit)
        except CgroupUnavailable as exc:
            raise ArmBoardError(f"cannot give the arm64 board its memory: {exc}") from None

    def _cgroup_mount(self) -> list:
        """(host path, path inside) of the memory hierarchy the agent reads its limit from."""
        version, mount = find_memory_hierarchy()
        inside = "/sys/fs/cgroup" if version == 2 else "/sys/fs/cgroup/memory"
        return [str(mount), inside]

    def _in_namespace(self, port: int, command: list) -> list:
        """argv: `command` run in the chroot, in a mount namespace with the board's mounts."""
        return ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c",
                BOARD_SCRIPT, "arm-board", str(self.rootfs), str(port), *self._cgroup_mount(),
                self._cpuinfo(), *command]

    def _cpuinfo(self) -> str:
        """A /proc/cpuinfo of the emulated CPU ("" before its features are known)."""
        facts = self.built()
        features = getattr(self, "_features", None) or (facts or {}).get("cpu_features")
        if not features:
            return ""
        path = self.dir / "cpuinfo"
        path.write_text(cpuinfo_text(features, os.cpu_count() or 1))
        return str(path)

    def _write_known_hosts(self, port: int) -> None:
        key = (self.rootfs / "etc/ssh/ssh_host_ed25519_key.pub").read_text().split()
        self.known_hosts.write_text(f"[127.0.0.1]:{port} {key[0]} {key[1]}\n")

    @contextmanager
    def _namespace_shell(self):
        """Run commands in the board's mounts (for the build's check), then drop them."""
        def run(command: list) -> str:
            result = subprocess.run(self._in_namespace(0, command), capture_output=True,
                                    text=True)
            if result.returncode != 0:
                raise ArmBoardError(f"{' '.join(command)} failed on the board: "
                                    f"{(result.stderr or result.stdout).strip()[-2000:]}")
            return result.stdout
        yield run

    @contextmanager
    def _lock(self):
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / "lock", "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)


# What the board's device tree calls it (as a Pi's says "Raspberry Pi 4 Model B"): the agent's
# profile names the board by it, so every profile and report says the timings are qemu's.
BOARD_MODEL = "edge-remat emulated arm64 board (qemu-user on this x86_64 machine: timings are qemu's)"

# The board's mounts, made inside its own mount namespace, then a command in the chroot:
# sh -c BOARD_SCRIPT arm-board ROOTFS PORT CGROUP_HIERARCHY PATH_INSIDE CPUINFO|"" COMMAND...
BOARD_SCRIPT = r"""
set -e
BOARD_MODEL="{model}"
R="$1"; PORT="$2"; CG_HOST="$3"; CG_IN="$4"; CPUINFO="$5"; shift 5
mount -t proc proc "$R/proc"
[ -n "$CPUINFO" ] && mount --bind "$CPUINFO" "$R/proc/cpuinfo"
mount -t sysfs -o ro sysfs "$R/sys"
mount -t tmpfs -o mode=755,size=64k tmpfs "$R/sys/fs/cgroup"
mount -t tmpfs -o mode=755,size=64k tmpfs "$R/sys/firmware"
mkdir -p "$R/sys/firmware/devicetree/base"
printf '%s' "$BOARD_MODEL" > "$R/sys/firmware/devicetree/base/model"
mkdir -p "$R$CG_IN"
mount --bind "$CG_HOST" "$R$CG_IN"
mount -o remount,bind,ro "$R$CG_IN"
mount -t tmpfs -o mode=755 tmpfs "$R/dev"
for node in null:1:3 zero:1:5 full:1:7 random:1:8 urandom:1:9 tty:5:0; do
    name=${node%%:*}; numbers=${node#*:}
    mknod -m 666 "$R/dev/$name" c "${numbers%%:*}" "${numbers#*:}"
done
mkdir "$R/dev/pts" "$R/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666 devpts "$R/dev/pts"
ln -s pts/ptmx "$R/dev/ptmx"
ln -s /proc/self/fd "$R/dev/fd"
mount -t tmpfs -o mode=1777 tmpfs "$R/dev/shm"
mount -t tmpfs -o mode=755 tmpfs "$R/run"
mkdir -m 755 "$R/run/sshd"
[ "$1" = sshd ] && exec chroot "$R" /usr/sbin/sshd -D -e -p "$PORT"
exec chroot "$R" "$@"
""".replace("{model}", BOARD_MODEL)


# python -c COMPILE_SCRIPT FOLDER ROOT: bytecode for FOLDER's modules, as if ROOT were "/". Like
# pip, a module this Python cannot compile is left as it is (torch ships py312_intrinsics.py,
# which 3.11 never imports); compileall's exit status would fail the build on it.
COMPILE_SCRIPT = ("import compileall, sys; compileall.compile_dir(sys.argv[1], quiet=2, "
                  "workers=0, stripdir=sys.argv[2], prependdir='/')")


# qemu 7.2 (Debian 12) passes the host's x86 /proc/cpuinfo through to aarch64 programs (qemu
# 8.1 emulates it); torch's cpuinfo library then finds CPUs in /sys but no ARM entries for them
# and crashes at import. So the board gets the cpuinfo an arm64 kernel would write for qemu's
# "max" CPU (MIDR implementer 0x00, part 0x051), with the features its auxv really has.
HWCAP_NAMES = ("fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm "
               "jscvt fcma lrcpc dcpop sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat "
               "ilrcpc flagm ssbs sb paca pacg").split()
HWCAP2_NAMES = ("dcpodp sve2 sveaes svepmull svebitperm svesha3 svesm4 flagm2 frint svei8mm "
                "svef32mm svef64mm svebf16 i8mm bf16 dgh rng bti mte ecv afp rpres").split()


def cpu_features(hwcap: int, hwcap2: int) -> list:
    return ([name for bit, name in enumerate(HWCAP_NAMES) if hwcap >> bit & 1]
            + [name for bit, name in enumerate(HWCAP2_NAMES) if hwcap2 >> bit & 1])


def cpuinfo_text(features: list, cpus: int) -> str:
    block = ("processor\t: {n}\nBogoMIPS\t: 100.00\nFeatures\t: " + " ".join(features)
             + "\nCPU implementer\t: 0x00\nCPU architecture: 8\nCPU variant\t: 0x0\n"
             "CPU part\t: 0x051\nCPU revision\t: 0\n\n")
    return "".join(block.format(n=n) for n in range(cpus))


def attach(device, say: Say = print):
    """`device` (a config with [emulator]) with the running board's port, user and keys;
    builds and starts the board first when it is not running."""
    import dataclasses

    from .transport.errors import TransportError
    board = ArmBoard()
    try:
        state = board.start(say, device.emulator.memory_limit_bytes)
    except ArmBoardError as exc:
        raise TransportError(f"cannot start {device.name}: {exc}") from None
    except OSError as exc:  # e.g. a cache folder that cannot be made
        raise TransportError(f"cannot start {device.name}: {exc.strerror}: {exc.filename} "
                             f"(set ${ENV_CACHE} to a writable folder)") from None
    connection = dataclasses.replace(
        device.connection, port=state["port"], user=state["user"], key=state["key"],
        known_hosts=state["known_hosts"], host_key_policy="strict",
        ssh_config=str(board.dir / "no_ssh_config"))
    return dataclasses.replace(device, connection=connection)


# -- small helpers ---------------------------------------------------------------------------

def _debootstrap_progress():
    """Picks debootstrap's stage lines, each stage once (not one line per package)."""
    stages = ("I: Retrieving Release", "I: Resolving dependencies of base", "I: Retrieving packages",
              "I: Extracting", "I: Installing core", "I: Unpacking the base",
              "I: Configuring the base", "I: Base system installed")
    seen = set()

    def pick(line: str) -> Optional[str]:
        for stage in stages:
            if line.startswith(stage) and stage not in seen:
                seen.add(stage)
                return "arm64 board: debootstrap: " + line[3:].strip()
        return None
    return pick


def _stream(command: list, log_path: Path, say: Say, progress) -> None:
    """Run `command`, its output into log_path, the lines `progress` picks to `say`."""
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, stdin=subprocess.DEVNULL)
        tail = []
        try:
            for line in process.stdout:
                log.write(line)
                tail = (tail + [line.rstrip()])[-15:]
                message = progress(line) if progress else None
                if message:
                    say(message)
        except BaseException:  # Ctrl-C, SIGTERM: the stage stops with the command
            _stop(process)
            raise
        code = process.wait()
    if code != 0:
        shown = "\n".join(t for t in tail if not t.startswith("WARNING: Location"))
        raise ArmBoardError(f"`{' '.join(command[:6])} ...` failed with status {code} "
                            f"(log: {log_path}):\n{shown}")


def _stop(process: subprocess.Popen, grace_s: float = 30.0) -> None:
    """Interrupt a build stage as Ctrl-C would and wait for it (debootstrap cleans up on
    SIGINT), killing it after grace_s. QA: the host said 'interrupted' while debootstrap still
    wrote into rootfs.partial, the next build's to remove."""
    import signal
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _run(command: list, what: str) -> None:
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise ArmBoardError(f"cannot {what}: `{' '.join(command)}` exited {result.returncode}: "
                            f"{(result.stderr or result.stdout).strip()}")


def _wait_for_ssh(port: int, process: subprocess.Popen, timeout_s: float, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ArmBoardError(f"the board's sshd exited with status {process.returncode}: "
                                f"{_tail(log)}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
                sock.settimeout(10)
                if sock.recv(64).startswith(b"SSH-"):
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise ArmBoardError(f"the board's sshd did not answer on 127.0.0.1:{port} within "
                        f"{timeout_s:.0f} s: {_tail(log)}")


def _tail(path: Path, lines: int = 8) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _alive(pid) -> bool:
    if not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _folder_size(path: Path, what: str) -> str:
    """'1.2 GB so far': how far a stage that writes into `path` got ('' before it exists)."""
    if not path.exists():
        return ""
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:
                pass
    return f"{format_size(total)} {what}"


def _remove_tree(path: Path) -> None:
    # A half-built root filesystem never has anything mounted in it (mounts are namespaced).
    shutil.rmtree(path, ignore_errors=True)


def _read_json(path: Path) -> Optional[dict]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)


__all__ = ["ArmBoard", "ArmBoardError", "unavailable_reason", "ensure_binfmt", "cache_dir"]
