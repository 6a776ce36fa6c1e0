"""Node times measured in a planned run, made a profile's ops.

A board without room for a plain step cannot time its nodes in the profile job (profile_fit.py),
so its profile has none, and a plan costs them from the capture's estimates at the board's
rates. A planned run fits there, and its run job times each node's first compute (agent:
executor/node_timing.py). Two commands feed those times back: `run` into its cached profile
(run/timed_in_run.py), `profile --graph` into the profile it fetched, from a short run made for
that (profile_under_plan.py). Keyed as the profiler keys ops (nodes of one signature share the
mean), with what the run's first step left to the process for good (each op's
`persistent_bytes`, which the next plan counts as fixed memory); the rest of the profile stays
as measured.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Optional

from edge_remat_agent.costs import build_costs
from edge_remat_agent.formats import Graph, Profile, load_profile
from edge_remat_agent.formats.profile import OpCost
from edge_remat_agent.units import counted

from .units import fmt_bytes

FIGURES_KEY = "nodes_timed_in_run"  # in the profile's `measurements`


def with_node_times(profile_path: Path, graph: Graph, node_times: dict,
                    planned_with: Profile, write_to: list[Path]) -> Optional[dict]:
    """The profile at `profile_path` with the run's `node_times` (its report's) as its ops,
    written to each of `write_to`; the figures (what the nodes took against what
    `planned_with` estimated for them), or None when the run timed none of the graph's."""
    times = node_times.get("time_s") or []
    left = node_times.get("persistent_bytes") or [None] * len(times)
    if len(times) != len(graph.nodes) or len(left) != len(times):
        return None
    by_key: dict[str, list[float]] = {}
    kept: dict[str, int] = {}  # what the first step left, summed over the key's nodes
    estimated = measured = 0.0
    for node, seconds, share, estimate in zip(graph.nodes, times, left,
                                              build_costs(graph, planned_with).time_s):
        if seconds is None:
            continue
        key = node.signature or node.op
        by_key.setdefault(key, []).append(float(seconds))
        if share is not None:
            kept[key] = kept.get(key, 0) + int(share)
        measured += seconds
        estimated += estimate
    if not by_key:
        return None
    profile = load_profile(profile_path)
    profile.ops = {key: OpCost(time_s=statistics.fmean(runs), persistent_bytes=kept.get(key))
                   for key, runs in by_key.items()}
    figures = {"steps": int(node_times.get("steps") or 0),
               "nodes": sum(len(runs) for runs in by_key.values()),
               "graph_nodes": len(graph.nodes), "measured_s": measured,
               "estimated_s": estimated,
               "runtime_warm_bytes": sum(kept.values()) if kept else None}
    profile.measurements = {**profile.measurements, FIGURES_KEY: figures}
    for path in write_to:
        profile.save(path)
    return figures


def described(board_name: str, figures: dict) -> str:
    """The figures in words: '{board}: N of M nodes timed as the plan ran them ...'."""
    measured, estimated = figures["measured_s"], figures["estimated_s"]
    ratio = f" ({measured / estimated:.2f}x)" if estimated > 0 else ""
    warm = figures.get("runtime_warm_bytes")
    kept = "" if warm is None else \
        f"; the first step left {fmt_bytes(warm)} to the process for good (fixed from now on)"
    return (f"{board_name}: {figures['nodes']} of {figures['graph_nodes']} nodes timed as the "
            f"plan ran them (median of {counted(figures['steps'], 'step')}): {measured:.3g} s "
            f"a step, where the profile's estimates said {estimated:.3g} s{ratio}{kept}")
