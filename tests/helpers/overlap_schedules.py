"""Paging schedules on small training chains and random layered graphs, planned stop-the-world
and placed for overlap: what the overlap tests (test_overlap.py, test_timeline.py,
test_home_reads.py) compare."""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from edge_remat.planner.build import keep_all_peak_bytes
from edge_remat.planner.overlap import schedule_io
from edge_remat.planner.problem import Problem
from edge_remat.planner.solve import SolveReport, solve
from edge_remat.planner.stages import lower
from edge_remat.synthetic import random_layered
from edge_remat_agent.costs import CostModel, build_costs
from edge_remat_agent.formats import Graph, Node, Stages, Tier
from edge_remat_agent.simulate import SimResult, simulate

from .small_graphs import training_chain


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


def random_paging_problem(seed: int, homed: bool = False) -> tuple[Problem, Problem]:
    """A small training chain or random layered graph, with a flash tier drawn for `seed`: slow
    or fast, sharing compute or not; planned stop-the-world and overlapped. `homed`: about a
    third of its nodes given a param node of their own (_with_param_nodes)."""
    rng = random.Random(seed)
    graph = (training_chain(rng.randint(6, 30), seed) if rng.random() < 0.5 else
             random_layered(rng.choice([60, 120, 250]), seed=seed, w=0.31))
    bandwidth = rng.choice([4.0, 40.0, 1e3, 1e5, 1e7, 1e9])
    tier = Tier(read_bytes_per_s=bandwidth, write_bytes_per_s=bandwidth * rng.choice([0.25, 1, 4]),
                latency_s=rng.choice([0, 0.01, 0.1]), compute_share=rng.choice([0, 0, 0.3, 1]))
    fraction = rng.uniform(0.3, 0.9)
    if homed:
        graph = _with_param_nodes(graph, random.Random(-seed - 1))  # draws of its own
    _, sync_p, p = paging_problems(graph, costs=build_costs(graph, None, {"flash": tier}),
                                   fraction=fraction)
    return sync_p, p


def _with_param_nodes(graph: Graph, rng: random.Random) -> Graph:
    """`graph` with a param node (its group on flash, as a capture with --params-home flash
    makes it) read by about a third of its nodes, each just before its reader; a third of
    them with a workspace (a capture's have none), which a read from home leaves out."""
    nodes = []
    for node in graph.nodes:
        if rng.random() < 0.33:
            param = Node(id=f"w{node.id}", name=f"w{node.id}", kind="param", op="param",
                         inputs=[], out_bytes=max(1, node.out_bytes // 2), time_s=0.0,
                         workspace_bytes=rng.choice([0, 0, node.out_bytes]),
                         attrs={"io": {"tier": "flash", "read_bytes": node.out_bytes,
                                       "write_bytes": 0}})
            nodes.append(param)
            node = replace(node, inputs=[*node.inputs, param.id])
        nodes.append(node)
    return Graph(nodes, name=f"{graph.name}-homed")


def random_paging_schedule(seed: int, homed: bool = False):
    """random_paging_problem's overlapped problem, and Belady's stop-the-world plan for it
    lowered (before the post-pass)."""
    sync_p, p = random_paging_problem(seed, homed)
    return p, lower(p, solve(sync_p, "heuristic:paging", time_limit=5).decisions)[0]
