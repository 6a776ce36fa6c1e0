"""`tools/arm-board build | start | stop | status | ssh`: the ARM64 board's command line.

Every failure is one `error:` line (exit status 1; 2 for bad arguments; 130 interrupted)."""

from __future__ import annotations

import argparse
import os
import sys
import time

from edge_remat_agent.units import format_size, parse_size

from .arm_board import ArmBoard, ArmBoardError
from .errors import EXIT_INTERRUPTED
from .outputs import print_json


def _say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="arm-board", description=__doc__.splitlines()[0])
    parser.add_argument("--dir", help="the board's cache folder (default: "
                        "/var/cache/edge-remat/arm-board, or $EDGE_REMAT_ARM_BOARD)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="build the root filesystem (kept between runs)")
    start = sub.add_parser("start", help="run the board's sshd (builds first if needed)")
    start.add_argument("--memory-limit", help="the board's RAM, e.g. 2GiB (a memory cgroup); "
                       "a command with --device emulated-arm64 sets it to that config's "
                       "[emulator] memory_limit_bytes again")
    sub.add_parser("stop", help="stop the board: every process of it")
    status = sub.add_parser("status", help="built? running? on which port?")
    status.add_argument("--json", action="store_true")
    ssh = sub.add_parser("ssh", help="log in to the running board (or run COMMAND there)")
    ssh.add_argument("remote", nargs=argparse.REMAINDER)
    return parser


def main(argv: "list[str] | None" = None) -> int:
    args = _parser().parse_args(argv)
    board = ArmBoard(args.dir)
    try:
        if args.command == "build":
            board.build(_say)
        elif args.command == "start":
            limit = None
            if args.memory_limit:
                try:
                    limit = parse_size(args.memory_limit)
                except ValueError as exc:
                    print(f"error: --memory-limit: {exc}", file=sys.stderr)
                    return 2
            state = board.start(_say, limit)
            print(f"arm64 board running: ssh -i {state['key']} -p {state['port']} "
                  f"{state['user']}@127.0.0.1")
        elif args.command == "stop":
            if not board.stop(_say):
                print("arm64 board: not running")
        elif args.command == "status":
            _print_status(board.status(), args.json)
        elif args.command == "ssh":
            return _ssh(board, args.remote)
    except ArmBoardError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"error: {exc.strerror}: {exc.filename} (--dir or $EDGE_REMAT_ARM_BOARD: a "
              "writable folder)", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted (run the same command again: finished stages are kept)",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    return 0


def _print_status(status: dict, as_json: bool) -> None:
    if as_json:
        print_json(status, indent=1)
        return
    built = status["built"]
    print(f"folder:  {status['dir']}")
    print("built:   " + (f"yes ({built['suite']}, {built['python']}, {built['torch']}, "
                         f"{built['build_s']:.0f} s)" if built else "no"))
    state = status["state"]
    if not state:
        print("running: no")
        return
    limit = status.get("memory_limit_bytes")
    print(f"running: sshd pid {state['pid']} on 127.0.0.1:{state['port']} since "
          f"{state['started']}, {status.get('processes')} processes")
    print(f"memory:  {format_size(status.get('memory_usage_bytes') or 0)} in use, peak "
          f"{format_size(status.get('memory_peak_bytes') or 0)}, limit "
          f"{format_size(limit) if limit else 'none'}")


def _ssh(board: ArmBoard, remote: "list[str]") -> int:
    state = board.state()
    if state is None:
        print("error: the arm64 board is not running (tools/arm-board start)", file=sys.stderr)
        return 1
    argv = ["ssh", "-i", state["key"], "-p", str(state["port"]), "-o",
            f"UserKnownHostsFile={state['known_hosts']}", "-o", "StrictHostKeyChecking=yes",
            "-F", "/dev/null", f"{state['user']}@127.0.0.1", *remote]
    os.execvp("ssh", argv)
    return 1  # not reached
