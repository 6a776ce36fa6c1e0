#!/usr/bin/env python3
"""Protocol throughput over loopback SSH and over a pty pair at 921600 baud, as a fraction of
the raw link's throughput measured in the same run.

SSH: a throwaway sshd on a free loopback port. Raw = one paramiko exec channel running
`cat > /dev/null` (upload) or `cat FILE` (download); protocol = AgentSession.put_file /
get_file through the agent (`serve --stdio` relaying to the workdir's daemon), as Board uses
them: sha256 on both ends, 256 KiB put chunks written with fsync, 1 MiB get chunks, one
request in flight at a time.

Serial: a socat pty pair set to 921600 baud (raw, echo=0). Raw = pyserial on both ends, one
blob written on one end and read on the other; protocol = the same put_file / get_file through
`edge-remat-agent serve --serial` over the reliable link (COBS + CRC32 + sequence numbers,
a sliding window of 16 packets with cumulative acknowledgements, 1 KiB payloads).

    python benchmarks/transport.py                  # 32 MiB over SSH, 1 MiB over serial
    python benchmarks/transport.py --size 4MiB      # both links
    python benchmarks/transport.py --ssh-size 256MiB --serial-size 8MiB --repeat 5
    python benchmarks/transport.py --only serial

Each figure is the best of --repeat runs (the machine is shared; the best run is the one least
disturbed). MB = 10^6 bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # helpers.testbed

from edge_remat.devices import load_device  # noqa: E402
from edge_remat.transport import Board  # noqa: E402
from edge_remat.transport.serial import SerialTransport, open_serial_port  # noqa: E402
from helpers.testbed import (LinkUnavailable, PtyPair, SshServer, agent_command,  # noqa: E402
                             stop_agent)
from edge_remat_agent.units import format_size  # noqa: E402
from edge_remat_agent.wire.serial_link import (ACK, DATA, DEFAULT_PAYLOAD, DEFAULT_WINDOW,
                                               encode_packet)

from arguments import existing_folder, positive_int, positive_size  # noqa: E402 - a neighbour

MB = 1e6
BAUD = 921600


@dataclass
class Timing:
    nbytes: int
    seconds: List[float] = field(default_factory=list)
    in_requests: List[float] = field(default_factory=list)  # of each run, in chunk requests
    requests: int = 0

    def add(self, seconds: float, in_requests: Optional[float] = None) -> None:
        self.seconds.append(seconds)
        if in_requests is not None:
            self.in_requests.append(in_requests)

    def split(self, what: str) -> str:
        """Where the best run's time went: chunk requests vs the checks around them."""
        best = self.seconds.index(min(self.seconds))
        share = self.in_requests[best] / self.seconds[best]
        return (f"{what}: the best run spent {share * 100:.0f}% of its "
                f"{self.seconds[best] * 1e3:.0f} ms in {self.requests} chunk requests, the "
                "rest in sha256 (both ends) and stat_file")

    @property
    def best_mb_s(self) -> float:
        return self.nbytes / min(self.seconds) / MB

    @property
    def median_mb_s(self) -> float:
        return self.nbytes / statistics.median(self.seconds) / MB


@dataclass
class Row:
    link: str
    direction: str
    raw: Timing
    protocol: Timing

    def line(self) -> str:
        fraction = self.protocol.best_mb_s / self.raw.best_mb_s
        return (f"{self.link:<22} {self.direction:<9} {format_size(self.raw.nbytes):>8} "
                f"{self.raw.best_mb_s:9.2f} {self.raw.median_mb_s:9.2f}  "
                f"{self.protocol.best_mb_s:9.2f} {self.protocol.median_mb_s:9.2f}  "
                f"{fraction * 100:7.1f}%")


HEADER = (f"{'link':<22} {'direction':<9} {'size':>8} {'raw MB/s':>9} {'(median)':>9}  "
          f"{'proto MB/s':>9} {'(median)':>9}  {'fraction':>8}")


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def timed_transfer(session, kind: str, action: Callable[[], object],
                   timing: Timing) -> None:
    """Run a put_file/get_file, adding its time and the part spent in its `kind` requests
    (the chunks themselves, as opposed to hashing and stat_file) to timing."""
    spent = [0.0, 0]

    def call(request_type, body=b"", /, **fields):
        started = time.perf_counter()
        try:
            return type(session).call(session, request_type, body, **fields)
        finally:
            if request_type == kind:
                spent[0] += time.perf_counter() - started
                spent[1] += 1

    session.call = call  # the instance attribute shadows the method for this transfer only
    try:
        seconds = timed(action)
    finally:
        del session.call
    timing.add(seconds, spent[0])
    timing.requests = spent[1]


def write_blob(path: Path, nbytes: int) -> str:
    """Random bytes (nothing compresses them), written in 1 MiB pieces; returns the sha256."""
    digest = hashlib.sha256()
    with open(path, "wb") as handle:
        left = nbytes
        while left:
            piece = os.urandom(min(left, 1 << 20))
            digest.update(piece)
            handle.write(piece)
            left -= len(piece)
    return digest.hexdigest()


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for piece in iter(lambda: handle.read(1 << 20), b""):
            digest.update(piece)
    return digest.hexdigest()


def write_toml(path: Path, name: str, connection: dict) -> Path:
    def value(v):
        return f'"{v}"' if isinstance(v, str) else str(v)
    path.write_text(f'name = "{name}"\n[connection]\n'
                    + "".join(f"{k} = {value(v)}\n" for k, v in connection.items())
                    + '[hardware]\nfamily = "generic"\n')
    return path


# -- SSH ---------------------------------------------------------------------------------------
def bench_ssh(root: Path, nbytes: int, repeat: int) -> "tuple[List[Row], List[str]]":
    import paramiko

    (root / "sshd").mkdir()
    server = SshServer(root / "sshd").start()
    workdir = root / "board-ssh"
    notes: List[str] = []
    try:
        device = load_device(write_toml(root / "ssh.toml", "loopback-ssh", {
            "kind": "ssh", "host": "127.0.0.1", "port": server.port, "user": server.user,
            "key": str(server.client_key), "python": sys.executable, "workdir": str(workdir),
            "host_key_policy": "accept-new", "known_hosts": str(root / "known_hosts"),
            "ssh_config": str(root / "no_ssh_config"), "connect_timeout_s": 20}))
        local = root / "ssh-blob.bin"
        sha = write_blob(local, nbytes)
        blob = local.read_bytes()

        client = paramiko.SSHClient()
        client.set_missing_host_key_policy(paramiko.AutoAddPolicy())  # a throwaway sshd
        client.connect("127.0.0.1", port=server.port, username=server.user,
                       key_filename=str(server.client_key), look_for_keys=False,
                       allow_agent=False, timeout=20)
        transport = client.get_transport()
        notes.append(f"ssh: paramiko {paramiko.__version__} to {_openssh_version()} on "
                     f"127.0.0.1:{server.port}, cipher {transport.local_cipher}, "
                     f"mac {transport.local_mac}")

        def ready(chan, command: str) -> None:
            """Run `command` once the shell on the board says it is up: spawning a shell and
            cat (100-300 ms on a loaded machine) is not the link's cost, and the protocol's
            timings have no such start either."""
            chan.exec_command(f"echo R; read go; exec {command}")
            seen = b""
            while not seen.endswith(b"R\n"):
                data = chan.recv(16)
                if not data:
                    raise RuntimeError(f"raw link: `{command}` did not start")
                seen += data

        def raw_up() -> float:
            """From the go signal until cat has read everything and exited."""
            chan = transport.open_session()
            ready(chan, "cat > /dev/null")
            started = time.perf_counter()
            chan.sendall(b"\n")  # go
            view = memoryview(blob)
            for start in range(0, len(view), 1 << 20):
                chan.sendall(view[start:start + (1 << 20)])
            chan.shutdown_write()
            status = chan.recv_exit_status()
            seconds = time.perf_counter() - started
            chan.close()
            if status != 0:
                raise RuntimeError(f"raw upload: `cat` exited with {status}")
            return seconds

        def raw_down(path: Path) -> float:
            """From the go signal to the end of cat's output."""
            chan = transport.open_session()
            ready(chan, f"cat {path}")
            started = time.perf_counter()
            chan.sendall(b"\n")  # go
            got = 0
            while True:
                data = chan.recv(1 << 20)
                if not data:
                    break
                got += len(data)
            seconds = time.perf_counter() - started
            chan.close()
            if got != nbytes:
                raise RuntimeError(f"raw download: got {got} bytes, not {nbytes}")
            return seconds

        raw_up_t, raw_down_t = Timing(nbytes), Timing(nbytes)
        put_t, get_t = Timing(nbytes), Timing(nbytes)
        with Board(device) as board:
            board.hello()  # pushes the agent, starts the daemon: not timed
            session = board.session()
            for index in range(repeat):
                raw_up_t.add(raw_up())
                remote = f"inputs/bench-{index}.bin"
                timed_transfer(session, "put_file", lambda: session.put_file(local, remote),
                               put_t)
                on_board = workdir / remote
                if sha256_of(on_board) != sha:
                    raise RuntimeError("put_file over SSH delivered different bytes")
                raw_down_t.add(raw_down(on_board))
                back = root / f"ssh-back-{index}.bin"
                timed_transfer(session, "get_file", lambda: session.get_file(remote, back),
                               get_t)
                if sha256_of(back) != sha:
                    raise RuntimeError("get_file over SSH delivered different bytes")
                back.unlink()
                on_board.unlink()
        client.close()
        notes += [put_t.split("ssh upload"), get_t.split("ssh download")]
        return [Row("ssh (loopback)", "upload", raw_up_t, put_t),
                Row("ssh (loopback)", "download", raw_down_t, get_t)], notes
    finally:
        stop_agent(workdir)
        server.stop()


def _openssh_version() -> str:
    try:
        out = subprocess.run(["ssh", "-V"], capture_output=True, text=True, timeout=5)
        return (out.stderr or out.stdout).split(",")[0].strip() or "sshd"
    except (OSError, subprocess.SubprocessError):
        return "sshd"


# -- serial ------------------------------------------------------------------------------------
def raw_pty(sender, receiver, blob: bytes) -> float:
    """Seconds from the first byte written on one end to the last read on the other."""
    got = bytearray()
    failure: List[BaseException] = []

    def read_all() -> None:
        try:
            deadline = time.monotonic() + 60
            while len(got) < len(blob) and time.monotonic() < deadline:
                waiting = receiver.in_waiting
                got.extend(receiver.read(min(max(waiting, 1), len(blob) - len(got))))
        except BaseException as exc:  # noqa: BLE001 - reported below
            failure.append(exc)

    reader = threading.Thread(target=read_all)
    started = time.perf_counter()
    reader.start()
    sender.write(blob)
    sender.flush()
    reader.join()
    seconds = time.perf_counter() - started
    if failure:
        raise failure[0]
    if bytes(got) != blob:
        raise RuntimeError(f"raw pty: {len(got)} of {len(blob)} bytes arrived, or different")
    return seconds


def line_model(baud: int) -> str:
    """What the window makes of a real line (a model, not a measurement): a packet's round
    trip is covered when the window holds more line time than it; ACKs come back on the
    other direction of the full-duplex line."""
    data = len(encode_packet(DATA, 1, 1, os.urandom(DEFAULT_PAYLOAD))) * 10 / baud
    ack = len(encode_packet(ACK, 1, 1)) * 10 / baud
    useful = DEFAULT_PAYLOAD * 10 / baud

    def share(window: int, turnaround: float) -> float:
        return useful / max(data, (data + ack + turnaround) / window)

    shares = ", ".join(f"{share(DEFAULT_WINDOW, t) * 100:.0f}% (stop-and-wait: "
                       f"{share(1, t) * 100:.0f}%) if each ACK turnaround adds {t * 1e3:g} ms"
                       for t in (0.001, 0.016))
    return (f"model, not measured: on a real {baud}-baud line a DATA packet takes "
            f"{data * 1e3:.1f} ms and its ACK {ack * 1e3:.2f} ms, so a window of "
            f"{DEFAULT_WINDOW} packets carries {shares} (e.g. a USB-serial adapter's 16 ms "
            "latency timer)")


def bench_serial(root: Path, nbytes: int, repeat: int) -> "tuple[List[Row], List[str]]":
    import serial

    notes: List[str] = []
    (root / "pty").mkdir()
    ptys = PtyPair(root / "pty", baud=BAUD).start()
    workdir = root / "board-serial"
    agent: Optional[subprocess.Popen] = None
    try:
        local = root / "serial-blob.bin"
        sha = write_blob(local, nbytes)
        blob = local.read_bytes()

        # Raw: pyserial on both ends of the same pty pair, before the agent takes one end.
        raw_up_t, raw_down_t = Timing(nbytes), Timing(nbytes)
        host = open_serial_port(ptys.host_end, BAUD)
        board = serial.Serial(ptys.board_end, BAUD, timeout=0.05)
        try:
            for _ in range(repeat):
                raw_up_t.add(raw_pty(host, board, blob))
                raw_down_t.add(raw_pty(board, host, blob))
        finally:
            board.close()
            host.close()

        with open(root / "agent-serial.log", "wb") as log:
            agent = subprocess.Popen(agent_command() + ["serve", "--serial", ptys.board_end,
                                                        "--baud", str(BAUD),
                                                        "--workdir", str(workdir)],
                                     stdout=subprocess.DEVNULL, stderr=log)
        device = load_device(write_toml(root / "serial.toml", "pty-serial", {
            "kind": "serial", "port": ptys.host_end, "baud": BAUD, "connect_timeout_s": 20,
            "reconnect_timeout_s": 30}))
        put_t, get_t = Timing(nbytes), Timing(nbytes)
        transport = SerialTransport(device, push_agent=False)  # the agent runs from source
        with Board(device, transport=transport) as board:
            board.hello()  # opens the link session, starts the daemon: not timed
            session = board.session()
            stats = transport.link.stats
            before = stats.as_dict()
            for index in range(repeat):
                remote = f"inputs/bench-{index}.bin"
                timed_transfer(session, "put_file", lambda: session.put_file(local, remote),
                               put_t)
                on_board = workdir / remote
                if sha256_of(on_board) != sha:
                    raise RuntimeError("put_file over serial delivered different bytes")
                back = root / f"serial-back-{index}.bin"
                timed_transfer(session, "get_file", lambda: session.get_file(remote, back),
                               get_t)
                if sha256_of(back) != sha:
                    raise RuntimeError("get_file over serial delivered different bytes")
                back.unlink()
                on_board.unlink()
            after = stats.as_dict()
        sent = after["packets_sent"] - before["packets_sent"]
        resent = after["resent"] - before["resent"]
        packets = -(-nbytes // DEFAULT_PAYLOAD)
        per_packet_us = min(put_t.seconds) / packets * 1e6
        notes.append(f"serial: socat pty pair, b{BAUD} raw echo=0; link payload "
                     f"{DEFAULT_PAYLOAD} B a packet, up to {DEFAULT_WINDOW} in flight: the "
                     f"best upload spent {per_packet_us:.0f} us a DATA packet")
        notes.append(f"serial: the host sent {sent} packets ({resent} resent) for "
                     f"{packets * repeat} DATA packets up, the (cumulative) ACKs of the DATA "
                     "coming down, and the requests")
        notes.append("serial: a pty has no line rate (the kernel ignores the baud setting), "
                     "so the fraction measures the protocol's overhead, not use of the line; "
                     f"a real {BAUD}-baud 8N1 line carries at most {BAUD / 10 / MB:.4f} MB/s")
        notes.append("serial: " + line_model(BAUD))
        notes += [put_t.split("serial upload"), get_t.split("serial download")]
        return [Row(f"serial (pty {BAUD})", "upload", raw_up_t, put_t),
                Row(f"serial (pty {BAUD})", "download", raw_down_t, get_t)], notes
    finally:
        if agent is not None:
            agent.terminate()
            try:
                agent.wait(10)
            except subprocess.TimeoutExpired:
                agent.kill()
                agent.wait()
        stop_agent(workdir)
        ptys.kill()


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=positive_size, default=None,
                        help="bytes moved on each link (default: 32MiB over SSH, 1MiB serial)")
    parser.add_argument("--ssh-size", type=positive_size, default=None)
    parser.add_argument("--serial-size", type=positive_size, default=None)
    parser.add_argument("--repeat", type=positive_int, default=5, help="runs of each measurement")
    parser.add_argument("--only", choices=("ssh", "serial"), default=None)
    parser.add_argument("--tmp", type=existing_folder, default=None, help="folder for the throwaway servers and "
                        "the boards' workdirs (default: a new temp dir)")
    args = parser.parse_args()
    ssh_size = args.ssh_size or args.size or 32 << 20
    serial_size = args.serial_size or args.size or 1 << 20

    started = time.perf_counter()
    print(f"# {_cpu()}, {os.cpu_count()} CPUs, Linux {platform.release()}, "
          f"Python {platform.python_version()}; best of {args.repeat} runs; MB = 10^6 B")
    rows: List[Row] = []
    notes: List[str] = []
    root = Path(tempfile.mkdtemp(prefix="edge-remat-transport-", dir=args.tmp))
    try:
        for name, bench, size in (("ssh", bench_ssh, ssh_size),
                                  ("serial", bench_serial, serial_size)):
            if args.only and args.only != name:
                continue
            try:
                new_rows, new_notes = bench(root, size, args.repeat)
            except LinkUnavailable as exc:
                notes.append(f"{name}: skipped, {exc}")
                continue
            rows += new_rows
            notes += new_notes
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print()
    print(HEADER)
    print("-" * len(HEADER))
    for row in rows:
        print(row.line())
    print()
    print("protocol = put_file / get_file as Board uses them, sha256 checks, the stat_file "
          "request and (upload) fsync of each chunk included")
    for note in notes:
        print(f"# {note}")
    print(f"# took {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
