"""`edge-remat-agent profile --graph G -o profile.json`: a board's whole measured profile.

Every node of the graph timed on real inputs (profiler/ops.py), plus what `profile-storage`
measures: flash (with --page-dir), idle and busy power, the runtime's footprint, the board's
identity. Feed it back with `edge-remat plan --profile profile.json`: the planner then costs
each node with this board's figures (`cost_source: "profile"`). The daemon's "profile" job
(`edge-remat profile --device NAME [--graph G] [--param K=V]`) runs the same code, its params
being these options by their long names (page_dir, sensor, idle_s, ...).

Kept outside the profiler package so the agent's CLI starts without importing torch.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from . import profile_storage


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "profile", help="measure every graph node, the flash, power and memory; write a profile",
        description="Captures the graph again here, times each planner node's forward or "
                    "backward (repeated until 10 ms or more are measured), records its output "
                    "and workspace bytes, and adds the board's flash (with --page-dir), power, "
                    "runtime footprint and identity: a profile JSON with \"source\": "
                    "\"measured\" that `edge-remat plan --profile` takes.")
    _options(p)
    return p


def _options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--graph", help="graph JSON whose nodes to time (without it: no op costs)")
    p.add_argument("-o", "--output", required=True, help="profile JSON to write")
    p.add_argument("--page-dir", help="directory on the flash to measure (without it: no "
                                      "flash tier in the profile)")
    p.add_argument("--op-window-s", type=float, default=0.01,
                   help="time each node until this much is measured (default 0.01, at least "
                        "10 sensor periods with a sensor)")
    p.add_argument("--device", default="cpu", help="torch device for the op timings")
    profile_storage.add_board_options(p)


def options_from_params(params: dict[str, Any]) -> argparse.Namespace:
    """A job's params as this command's options (same names, same defaults, same checks)."""
    parser = argparse.ArgumentParser(prog="profile job", add_help=False)
    _options(parser)
    argv: list[str] = []
    for key, value in params.items():
        flag = "--" + key.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            argv.append(flag)
        elif isinstance(value, (list, tuple)):
            argv += [flag, ",".join(str(v) for v in value)]
        else:
            argv += [flag, str(value)]
    try:
        return parser.parse_args(argv)
    except SystemExit:
        raise ValueError(f"bad profile params {params}: they are the options of "
                         "`edge-remat-agent profile` (page_dir, sensor, idle_s, ...)") from None


def measure(args: argparse.Namespace, progress=None):
    """The measured profile (not yet written). progress(index, total, node measurement)."""
    graph = captured = None
    if args.graph:
        from .executor.run import capture_here
        from .formats import load_graph
        graph = load_graph(args.graph)
        captured = capture_here(graph)
        if not args.model and ":" not in str(graph.capture.get("source", {}).get("model", ":")):
            args.model = graph.capture["source"]["model"]  # the footprint with this zoo model
    profile = profile_storage.measure_board(args)
    if captured is None:
        return profile
    from .profiler.ops import measure_nodes, ops_from, window_s
    from .sensors import open_sensor
    sensor_name = profile.device.get("sensor")
    sensor = None if not sensor_name or profile.device.get("power_estimate") \
        else open_sensor(sensor_name)
    print(f"ops: {len(graph)} nodes of '{graph.name}', each timed for at least "
          f"{window_s(args.op_window_s, sensor):g} s", file=sys.stderr)
    nodes = measure_nodes(captured, args.op_window_s, sensor,
                          profile.idle_w if sensor is not None else None, args.device, progress)
    profile.ops = ops_from(nodes)
    profile.measurements["ops"] = {
        "graph": graph.name, "graph_fingerprint": graph.fingerprint(),
        "method": "time_s: each planner node's median over plain steps run node by node "
                  "(StepRunner, the executor's engine); isolated_time_s: the node re-run on "
                  "real inputs until the window is measured (best of 3 windows); energy from "
                  "the isolated windows; bytes from the real tensors",
        "context_steps": nodes[0].context_runs if nodes else 0,
        "window_s": window_s(args.op_window_s, sensor), "device": args.device,
        "energy": "above idle, from sensor " + sensor_name if sensor is not None else
                  "not measured (no sensor): the planner uses time x (active - idle) power",
        "nodes": [m.to_dict() for m in nodes]}
    return profile


def run(args: argparse.Namespace) -> int:
    from .executor import ExecutorError
    from .formats import FormatError
    from .profiler import write_profile
    try:
        profile = measure(args)
        write_profile(profile, args.output)
    except (ExecutorError, FormatError) + profile_storage.board_errors() as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(json.dumps(summary(profile, args.output)))
    return 0


def summary(profile, output: str) -> dict[str, Any]:
    ops = profile.measurements.get("ops", {})
    return {"output": output, "source": profile.source, "name": profile.name,
            "ops": len(profile.ops), "nodes": len(ops.get("nodes", [])),
            "graph": ops.get("graph"), "tiers": sorted(profile.tiers),
            "idle_w": profile.idle_w, "active_w": profile.active_w,
            "sensor": profile.device.get("sensor"),
            "power_estimate": profile.device.get("power_estimate"),
            "runtime_baseline_bytes": profile.runtime_baseline_bytes}
