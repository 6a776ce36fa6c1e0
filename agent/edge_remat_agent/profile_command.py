"""`edge-remat-agent profile --graph G -o profile.json`: a board's whole measured profile.

Every node of the graph timed on real inputs (profiler/ops.py), plus what `profile-storage`
measures: flash (with --page-dir), idle and busy power, the runtime's footprint, the board's
identity. Feed it back with `edge-remat plan --profile profile.json`: the planner then costs
each node with this board's figures (`cost_source: "profile"`). Both this command and the
daemon's "profile" job (`edge-remat profile --device NAME [--graph G] [--param K=V]`, its params
being these options by their long names) call profiler.measure.measure_profile.

Kept outside the profiler package so the agent's CLI starts without importing torch.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from . import profile_storage
from .output_names import empty_name
from .profile_storage import profile_options


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "profile", help="measure every graph node, the flash, power and memory; write a profile",
        description="Captures the graph again here, times each planner node's forward or "
                    "backward (repeated until 10 ms or more are measured), records its output "
                    "and workspace bytes, and adds the board's flash (with --page-dir), power, "
                    "runtime footprint and identity: a profile JSON with \"source\": "
                    "\"measured\" that `edge-remat plan --profile` takes.",
        argument_default=argparse.SUPPRESS)  # unset options: ProfileOptions' defaults
    p.add_argument("--graph", help="graph JSON whose nodes to time (without it: no op costs)")
    p.add_argument("-o", "--output", required=True, help="profile JSON to write")
    p.add_argument("--page-dir", help="directory on the flash to measure (without it: no "
                                      "flash tier in the profile)")
    p.add_argument("--op-window-s", type=float,
                   help="time each node until this much is measured (default 0.01, at least "
                        "10 sensor periods with a sensor)")
    p.add_argument("--device", help="torch device for the op timings")
    profile_storage.add_board_options(p)
    return p


def run(args: argparse.Namespace) -> int:
    from .executor import ExecutorError
    from .formats import FormatError
    from .profiler import write_profile
    from .profiler.measure import board_errors, measure_profile, profile_summary
    if (empty := empty_name(args.output, "-o", "a file name")) is not None:
        print(f"error: {empty}", file=sys.stderr)  # before the work, not when writing after it
        return 2
    try:
        profile = measure_profile(profile_options(args))
        write_profile(profile, args.output)
    except (ExecutorError, FormatError) + board_errors() as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(json.dumps(profile_summary(profile, args.output)))
    return 0
