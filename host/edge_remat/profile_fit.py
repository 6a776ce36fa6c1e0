"""Whether a board can time a graph's nodes: its profile job runs them inside plain steps.

    why = plain_step_out_of_reach(board, graph)   # None: it can; else why not, in words

The profile job runs one plain step first (for what the ops' first calls leave) and then
every node on real inputs in a plain step's context, so it holds a whole plain step at once.
A model the board can only train with a plan (what edge-remat is for) would get the job
killed by the out-of-memory killer. Asked first, the board measures what it can (flash,
power, runtime memory, its compute rates) and the planner costs the nodes from the capture's
estimates rescaled to the board's rates (costs.board_roofline).
"""

from __future__ import annotations

import os

from edge_remat_agent.formats import Graph, load_graph

from .planner.build import plain_peak_bytes
from .units import fmt_bytes

# What the profile job holds beside the plain step: the interpreter, torch, the model traced
# again, the runner's bookkeeping. Measured in a memory cgroup (2026-12-03): resnet18 b8 64x64,
# whose plain peak the planner puts at 274 MiB, peaked at 582 MiB (page cache included).
PROFILE_JOB_OVERHEAD_BYTES = 300 * 2**20


def plain_step_out_of_reach(board, graph: Graph | str | os.PathLike) -> str | None:
    """Why `board` cannot time the nodes of `graph` (a Graph, or its file: read only when the
    board says what it has free), a plain step and the job's runtime needing more than a new
    process can get there; None where it can or does not say."""
    free = board.sysinfo().get("ram_free_bytes")
    if not free:
        return None
    if not isinstance(graph, Graph):
        graph = load_graph(graph)
    peak = plain_peak_bytes(graph)
    need = peak + PROFILE_JOB_OVERHEAD_BYTES
    if need <= free:
        return None
    return (f"a plain step of '{graph.name}' needs about {fmt_bytes(need)} on {board.name} "
            f"(its plain peak {fmt_bytes(peak)} and the profile job's runtime, about "
            f"{fmt_bytes(PROFILE_JOB_OVERHEAD_BYTES)}), more than the {fmt_bytes(free)} it has "
            "free: its nodes are not timed there (the job would be killed); the board's flash, "
            "power, memory and compute rates are, and the planner costs the nodes from the "
            "capture's estimates at those rates")
