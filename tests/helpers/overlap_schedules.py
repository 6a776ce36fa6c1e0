"""A paging schedule on a small training chain, planned stop-the-world and placed for overlap:
what the overlap tests (test_overlap.py, test_timeline.py) compare."""

from __future__ import annotations

import random
from dataclasses import dataclass

from edge_remat.planner.build import keep_all_peak_bytes
from edge_remat.planner.overlap import schedule_io
from edge_remat.planner.problem import Problem
from edge_remat.planner.solve import SolveReport, solve
from edge_remat.planner.stages import lower
from edge_remat_agent.costs import CostModel
from edge_remat_agent.formats import Graph, Stages
from edge_remat_agent.simulate import SimResult, simulate


@dataclass
class Placed:
    budget: int
    over_p: Problem  # the overlapped problem
    sync: SolveReport  # the stop-the-world paging heuristic's plan
    stages: Stages  # its instructions lowered, in plan order
    placed: Stages  # the same, page-ins and page-outs placed by the overlap post-pass
    before: SimResult  # the lowered schedule, overlapped
    after: SimResult  # the placed one, overlapped


def paging_problems(graph: Graph, costs: CostModel,
                    fraction: float) -> tuple[int, Problem, Problem]:
    """The budget at `fraction` of the plain peak (the floor where that is below it), and the
    problem at it with paging to flash, stop-the-world and overlapped."""
    peak = keep_all_peak_bytes(graph)
    floor = Problem(graph, costs, peak).smallest_budget()[0]
    budget = max(floor, int(peak * fraction))
    sync_p, over_p = (Problem(graph, costs, budget, "time", None, ("flash",), "counted", None,
                              io) for io in ("sync", "overlap"))
    return budget, sync_p, over_p


def placed_for_overlap(graph: Graph, costs: CostModel, seed: int) -> Placed:
    """At a budget drawn for `seed` between the floor and 0.55-0.8 of the plain peak."""
    budget, sync_p, over_p = paging_problems(graph, costs,
                                             random.Random(seed).uniform(0.55, 0.8))
    sync = solve(sync_p, "heuristic:paging", time_limit=5)
    stages, _ = lower(over_p, sync.decisions)
    placed = schedule_io(over_p, stages)
    return Placed(budget, over_p, sync, stages, placed,
                  simulate(graph, costs, stages, budget, io="overlap"),
                  simulate(graph, costs, placed, budget, io="overlap"))
