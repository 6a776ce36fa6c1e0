"""A cached profile without node times gets them from the planned run that used it.

The run times every node as the plan computes it, in the steps after its first
(node_times.py); here those times become the cached profile's ops, so the next plan on that
board costs the nodes as measured. Only a profile in the cache is completed: a given or shipped
file is the user's, and a graph with parameters homed on flash plans with another graph's
profile.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from edge_remat_agent.executor.node_timing import DEFAULT_TIMED_STEPS
from edge_remat_agent.formats import Graph

from ..node_times import described, with_node_times
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
    if chosen.cached_at is None or chosen.profile is None or chosen.profile.ops or \
            not result.get("node_times"):
        return None
    copy = out / TIMED_FILE
    # from the cache's file, as measured: no run's emulated limit on it
    figures = with_node_times(chosen.cached_at, graph, result["node_times"], chosen.profile,
                              [copy, chosen.cached_at])
    if figures is None:
        return None
    say(f"{described(board_name, figures)}; the cached profile holds them now, so the next "
        f"plan costs them as measured (a copy: {copy})")
    return {**figures, "file": str(copy)}
