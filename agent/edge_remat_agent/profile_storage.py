"""`edge-remat-agent profile-storage`: measure flash, power, memory and identity; write a profile.

Kept outside the profiler package so the agent's CLI starts without importing torch.

    edge-remat-agent profile-storage --page-dir /data/pages -o profile.json
        [--sizes 4KiB,64KiB,1MiB | --min-size 4KiB --max-size 64MiB] [--no-fsync]
        [--sensor auto|NAME] [--idle-s 2] [--busy-s 2] [--model mlp|module:function]
        [--dtype fp32|bf16|fp16 [--trainable-dtype fp32]]
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .output_names import empty_name
from .units import parse_size


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "profile-storage", help="measure this board's flash, power and memory; write a profile",
        description="Times FlashStore writes (fsync) and reads (page cache dropped) at sizes "
                    "from --min-size to --max-size (x4 steps), fits latency + bandwidth, measures "
                    "idle and busy power and the runtime's own memory, and writes a profile "
                    "JSON with \"source\": \"measured\". Operator costs are not measured here "
                    "(`edge-remat-agent profile --graph` measures them too).",
        argument_default=argparse.SUPPRESS)  # unset options: ProfileOptions' defaults
    p.add_argument("--page-dir", required=True, help="directory on the flash to page to")
    p.add_argument("-o", "--output", required=True, help="profile JSON to write")
    add_board_options(p)
    return p


def add_board_options(p: argparse.ArgumentParser) -> None:
    """Options of the board-wide measurements (flash, power, runtime footprint, name)."""
    p.add_argument("--sizes", type=_size_list, help="comma-separated sizes, e.g. 4KiB,1MiB,64MiB")
    p.add_argument("--min-size", type=parse_size, help="default 4KiB")
    p.add_argument("--max-size", type=parse_size, help="default 64MiB")
    p.add_argument("--window-s", type=float,
                   help="repeat each size until this much time is measured (default 0.01)")
    p.add_argument("--share-s", type=float,
                   help="seconds at most on each tier's compute share: what its IO costs "
                        "compute beside it (default 4; 0: not measured, taken as 0)")
    p.add_argument("--no-fsync", action="store_true", help="do not fsync page writes")
    p.add_argument("--flash-capacity", type=parse_size,
                   help="flash capacity to record (default: free space under --page-dir)")
    p.add_argument("--sensor",
                   help="power sensor name or 'auto' (detect; else the labelled model estimate); "
                        "a profile needs power figures, so 'none' is refused")
    p.add_argument("--idle-s", type=float, help="idle power window (default 2)")
    p.add_argument("--busy-s", type=float, help="busy power window (default 2)")
    p.add_argument("--model", help="for the runtime footprint: a zoo name (mlp, resnet18, ...) "
                                   "or module:function building the model")
    p.add_argument("--dtype", help="fp32 | bf16 | fp16: the footprint's --model built in this "
                                   "dtype, as the run will train it (with --graph: the graph's)")
    p.add_argument("--trainable-dtype",
                   help="fp32: that model's trained parameters in float32 (mixed precision)")
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


def profile_options(args: argparse.Namespace):
    """The parsed options as what profiler.measure measures (unset ones keep its defaults)."""
    from .profiler.measure import ProfileOptions
    known = {field for field in ProfileOptions.__dataclass_fields__}
    return ProfileOptions(**{key: value for key, value in vars(args).items() if key in known})


def run(args: argparse.Namespace) -> int:
    from .profiler import write_profile
    from .profiler.measure import board_errors, check_power_sensor, measure_board
    if (empty := empty_name(args.output, "-o", "a file name")) is not None:
        print(f"error: {empty}", file=sys.stderr)  # before the work, not when writing after it
        return 2
    try:
        options = profile_options(args)
        check_power_sensor(options)  # before the flash's minutes (measure_profile checks too)
        profile = measure_board(options)
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
