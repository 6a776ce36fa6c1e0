"""`edge-remat-agent profile-storage`: measure flash, power, memory and identity; write a profile.

Kept outside the profiler package so the agent's CLI starts without importing torch.

    edge-remat-agent profile-storage --page-dir /data/pages -o profile.json
        [--sizes 4KiB,64KiB,1MiB | --min-size 4KiB --max-size 64MiB] [--no-fsync]
        [--sensor auto|none|NAME] [--idle-s 2] [--busy-s 2] [--model mlp|module:function]
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import sys
from typing import Any, Callable

from .units import format_size, parse_size


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "profile-storage", help="measure this board's flash, power and memory; write a profile",
        description="Times FlashStore writes (fsync) and reads (page cache dropped) at sizes "
                    "from --min-size to --max-size (x4 steps), fits latency + bandwidth, measures "
                    "idle and busy power and the runtime's own memory, and writes a profile "
                    "JSON with \"source\": \"measured\". Operator costs are not measured here "
                    "(`edge-remat-agent profile --graph` measures them too).")
    p.add_argument("--page-dir", required=True, help="directory on the flash to page to")
    p.add_argument("-o", "--output", required=True, help="profile JSON to write")
    add_board_options(p)
    return p


def add_board_options(p: argparse.ArgumentParser) -> None:
    """Options of the board-wide measurements (flash, power, runtime footprint, name)."""
    p.add_argument("--sizes", type=_size_list, help="comma-separated sizes, e.g. 4KiB,1MiB,64MiB")
    p.add_argument("--min-size", type=parse_size, default=4 * 2**10, help="default 4KiB")
    p.add_argument("--max-size", type=parse_size, default=64 * 2**20, help="default 64MiB")
    p.add_argument("--window-s", type=float, default=0.01,
                   help="repeat each size until this much time is measured (default 0.01)")
    p.add_argument("--no-fsync", action="store_true", help="do not fsync page writes")
    p.add_argument("--flash-capacity", type=parse_size,
                   help="flash capacity to record (default: free space under --page-dir)")
    p.add_argument("--sensor", default="auto",
                   help="power sensor name, 'auto' (detect; else the labelled model estimate) "
                        "or 'none'")
    p.add_argument("--idle-s", type=float, default=2.0, help="idle power window (default 2)")
    p.add_argument("--busy-s", type=float, default=2.0, help="busy power window (default 2)")
    p.add_argument("--model", help="for the runtime footprint: a zoo name (mlp, resnet18, ...) "
                                   "or module:function building the model")
    p.add_argument("--no-footprint", action="store_true",
                   help="skip the runtime-footprint probe (a fresh interpreter importing torch)")
    p.add_argument("--name", help="profile name (default: the board's model)")
    p.add_argument("--host-pages", metavar="HOST:PORT",
                   help="the host's page service (what `edge-remat profile` and `run` start): "
                        "measure the link to it as the profile's `host` tier")


def _size_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(sorted({parse_size(part) for part in text.split(",") if part.strip()}))
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def model_builder(spec: str) -> Callable[[], Any]:
    """'mlp' -> the zoo's mlp; 'package.module:function' -> that function (no arguments)."""
    if ":" not in spec:
        from . import zoo
        if spec not in zoo.MODELS:
            raise ValueError(f"no zoo model {spec!r}: use one of {', '.join(zoo.MODELS)} "
                             "or module:function")
        return functools.partial(zoo.build, spec)
    module_name, _, attribute = spec.partition(":")
    target: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        target = getattr(target, part)
    return target


def measure_board(args: argparse.Namespace):
    """Flash (when args.page_dir), power, runtime footprint and identity, as a measured profile
    (no op costs: profile_command adds them). Raises what `board_errors()` names."""
    from .profiler import (board_identity, measure_flash, measure_power,
                           measure_runtime_footprint, measured_profile, sizes_between)
    flash = None
    if args.page_dir:
        sizes = args.sizes or sizes_between(args.min_size, args.max_size)
        print(f"flash: {len(sizes)} sizes, {format_size(sizes[0])} .. {format_size(sizes[-1])} "
              f"in {args.page_dir}", file=sys.stderr)
        flash = measure_flash(args.page_dir, sizes, args.window_s, fsync=not args.no_fsync,
                              capacity_bytes=args.flash_capacity)
    host = measure_host_link(args.host_pages, args.sizes or sizes_between(args.min_size,
                                                                          args.max_size),
                             args.window_s) if args.host_pages else None
    print(f"power: sensor {args.sensor}, {args.idle_s} s idle, {args.busy_s} s busy",
          file=sys.stderr)
    power = measure_power(args.sensor, idle_s=args.idle_s, busy_s=args.busy_s)
    footprint = None
    if not args.no_footprint:
        build = model_builder(args.model) if args.model else None
        footprint = measure_runtime_footprint(build)
    return measured_profile(board_identity(sensor=power.sensor), power, flash=flash, host=host,
                            footprint=footprint, name=args.name)


def measure_host_link(address: str, sizes, window_s: float):
    """The `host` tier: tensors paged to the host's page service and back through the store a
    run uses (encoding and CRC32 included, as for the flash), over the agent's link."""
    from .pages.service import connect_store
    from .profiler.tiers import measure_store
    print(f"host link: {len(sizes)} sizes to the page service at {address}", file=sys.stderr)
    with connect_store(address) as store:
        return measure_store(store, sizes, window_s,
                             method=f"ServiceStore put/get to the host's page service "
                                    f"({address})")


def board_errors() -> tuple[type[BaseException], ...]:
    """What measuring the board can raise that is the board's or the options' fault."""
    from .pages import PageStoreError
    from .profiler import ProfileIncomplete
    from .sensors import SensorError
    return (PageStoreError, SensorError, ProfileIncomplete, ValueError, RuntimeError, OSError)


def run(args: argparse.Namespace) -> int:
    from .profiler import write_profile
    try:
        profile = measure_board(args)
        write_profile(profile, args.output)
    except board_errors() as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    flash_tier = profile.tiers["flash"]
    print(json.dumps({"output": args.output, "flash": flash_tier.to_dict(),
                      "idle_w": profile.idle_w, "active_w": profile.active_w,
                      "sensor": profile.device.get("sensor"),
                      "power_estimate": profile.device.get("power_estimate"),
                      "runtime_baseline_bytes": profile.runtime_baseline_bytes,
                      "ram_total_bytes": profile.ram_total_bytes}))
    return 0
