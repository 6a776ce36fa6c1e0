"""`profile --graph` on a board without room for a plain step: its nodes timed under a plan.

The profile job cannot time such a board's nodes (profile_fit.py) and measures the rest. Then
this plans the graph at what the board has free (less the runtime and the run's headroom, as
`run` budgets a memory limit), on that node-less profile, and runs the plan there for a few
steps, timing each node's first compute in the steps after the first (node_times.py). The
times become the fetched profile's ops, so `plan --profile` costs the nodes as measured. Where
no plan fits, or the run fails, the profile stays as the job measured it and a warning says why.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Callable, Optional

from edge_remat_agent.executor.node_timing import DEFAULT_TIMED_STEPS
from edge_remat_agent.formats import Graph, load_profile
from edge_remat_agent.formats.fields import dump_json

from .node_times import described, with_node_times
from .units import Budget, fmt_bytes

PLAN_TIME_LIMIT_S = 20.0  # any plan that fits will do: the nodes' first computes are timed


def time_nodes_under_plan(board, graph: Graph, graph_path: str, profile_path: Path,
                          page_dir: Optional[str], say: Callable[[str], None],
                          on_update=None, device: Optional[str] = None) -> Optional[dict]:
    """Time `graph`'s nodes on `board` in a short planned run and write them into the profile
    at `profile_path`; the figures, or None (said why) where that cannot be done. `device`:
    the torch device to run on, as the profile job's op timings were (None: the job's own)."""
    from .planner.plan_file import make_plan
    from .planner.problem import ProblemError
    from .planner.solve import NoPlan
    from .remote import full_result
    from .run.orchestrate import limit_overheads
    from .transport import JobFailed
    untimed = "warning: the nodes stay untimed in the profile"
    profile = load_profile(profile_path)
    free = board.sysinfo().get("ram_free_bytes") or 0
    # what the board has free counts as a memory limit: less the run's overheads, as `run` has
    taken, what = limit_overheads(profile)
    budget = free - taken
    if budget <= 0:
        say(f"{untimed}: {board.name} has {fmt_bytes(free)} free, no more than {what}")
        return None
    say(f"{board.name}: timing the nodes in a planned run at {fmt_bytes(budget)} (what it has "
        f"free, less the runtime and the run's headroom)")
    try:
        plan, _ = make_plan(graph, Budget(bytes=budget), profile,
                            paging="flash" if page_dir else "none",
                            time_limit=PLAN_TIME_LIMIT_S, arena="none")
    except (ProblemError, NoPlan) as error:
        say(f"{untimed}: no plan fits there ({error})")
        return None
    params = {"steps": 1 + DEFAULT_TIMED_STEPS, "time_nodes": DEFAULT_TIMED_STEPS,
              "check_gradients": False, "save": "none", "seed": 0,
              **({"page_dir": page_dir} if page_dir else {}),
              **({"device": device} if device else {})}
    with tempfile.TemporaryDirectory(prefix="edge-remat-timing-") as scratch:
        plan_path = Path(scratch) / "plan.json"
        dump_json(plan, plan_path)
        try:
            record = board.run_job("run", params, {"plan": plan_path, "graph": graph_path},
                                   Path(scratch) / "run", on_update=on_update)
        except JobFailed as error:
            say(f"{untimed}: the planned run failed ({error})")
            return None
        result = full_result(record)
    figures = with_node_times(profile_path, graph, result.get("node_times") or {}, profile,
                              [profile_path])
    if figures is None:
        say(f"{untimed}: the planned run timed none of them")
        return None
    say(f"{described(board.name, figures)}; {profile_path} holds them")
    return figures
