"""A cached profile without node times gets them from the planned run that used it.

A board without room for a plain step cannot time its nodes in the profile job (profile_fit.py),
so its profile has none, and the plan costs them from the capture's estimates at the board's
rates. The run then times every node as the plan computes it, in the steps after its first
(agent: executor/node_timing.py); here those times become the cached profile's ops, keyed as
the profiler keys them (nodes of one signature share the mean), so the next plan on that board
costs the nodes as measured. Only a profile in the cache is completed: a given or shipped file
is the user's, and a graph with parameters homed on flash plans with another graph's profile.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Callable, Optional

from edge_remat_agent.costs import build_costs
from edge_remat_agent.executor.node_timing import DEFAULT_TIMED_STEPS
from edge_remat_agent.formats import Graph, load_profile
from edge_remat_agent.formats.profile import OpCost
from edge_remat_agent.units import counted

from .profiles import ChosenProfile

TIMED_FILE = "profile-timed.json"  # the completed profile, beside the run's report


def steps_to_time(chosen: ChosenProfile, steps: int) -> int:
    """How many steps the run should time node by node: none when the profile has node times
    or is not the cache's; else up to DEFAULT_TIMED_STEPS after the first."""
    if chosen.profile is None or chosen.profile.ops or chosen.cached_at is None:
        return 0
    return max(0, min(DEFAULT_TIMED_STEPS, steps - 1))


def keep_run_times(result: dict, chosen: ChosenProfile, graph: Graph, out: Path,
                   board_name: str, say: Callable[[str], None]) -> Optional[dict]:
    """Write the run's node times into the cached profile (and a copy into `out`); what was
    recorded, for the report, or None when the run timed nothing usable."""
    timed = result.get("node_times") or {}
    times = timed.get("time_s") or []
    if chosen.cached_at is None or chosen.profile is None or chosen.profile.ops or \
            len(times) != len(graph.nodes):
        return None
    by_key: dict[str, list[float]] = {}
    estimated = measured = 0.0
    estimates = build_costs(graph, chosen.profile).time_s
    for node, seconds, estimate in zip(graph.nodes, times, estimates):
        if seconds is None:
            continue
        by_key.setdefault(node.signature or node.op, []).append(float(seconds))
        measured += seconds
        estimated += estimate
    if not by_key:
        return None
    profile = load_profile(chosen.cached_at)  # as measured: no run's emulated limit on it
    profile.ops = {key: OpCost(time_s=statistics.fmean(runs)) for key, runs in by_key.items()}
    nodes = sum(len(runs) for runs in by_key.values())
    figures = {"steps": int(timed.get("steps") or 0), "nodes": nodes,
               "graph_nodes": len(graph.nodes), "measured_s": measured,
               "estimated_s": estimated}
    profile.measurements = {**profile.measurements, "nodes_timed_in_run": figures}
    copy = out / TIMED_FILE
    profile.save(copy)
    profile.save(chosen.cached_at)
    ratio = f" ({measured / estimated:.2f}x)" if estimated > 0 else ""
    say(f"{board_name}: {nodes} of {len(graph.nodes)} nodes timed as the plan ran them "
        f"(median of {counted(figures['steps'], 'step')}): {measured:.3g} s a step, where the profile's "
        f"estimates said {estimated:.3g} s{ratio}; the cached profile holds them now, so the "
        f"next plan costs them as measured (a copy: {copy})")
    return {**figures, "file": str(copy)}
