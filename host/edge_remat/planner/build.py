"""From user inputs (graph, profile, budget text, paging flags) to a Problem."""

from __future__ import annotations

import math

from edge_remat_agent.costs import build_costs
from edge_remat_agent.formats import Graph, Profile, Tier

from ..units import parse_budget
from .baselines import keep_all
from .evaluate import evaluate
from .problem import Problem

PAGING_CHOICES = {"none": (), "flash": ("flash",), "host": ("host",), "both": ("flash", "host")}


def plain_peak_bytes(graph: Graph, profile: Profile | None = None) -> int:
    """Peak RAM of the plain schedule: every node once, in order, nothing paged (fixed included).
    With a profile, each node's workspace is the profile's where it measured one (build_costs)."""
    p = Problem(graph, build_costs(graph, profile), budget_bytes=2**62)
    return evaluate(p, keep_all(p)).sim.peak_bytes


def resolve_budget(text: str | float, graph: Graph, reference_peak: int | None = None,
                   profile: Profile | None = None) -> int:
    kind, value = parse_budget(str(text))
    if kind == "bytes":
        return int(value)
    peak = reference_peak if reference_peak is not None else plain_peak_bytes(graph, profile)
    return math.ceil(value * peak)  # the published benchmarks' definition


def build_problem(graph: Graph, budget: str | float, profile: Profile | None = None,
                  objective: str = "time", deadline: float | None = None,
                  paging: str | None = None, tiers: dict[str, Tier] | None = None,
                  paging_time: str = "counted") -> Problem:
    costs = build_costs(graph, profile, tiers)
    if paging is None:  # default: page wherever the inputs say what paging costs
        chosen = tuple(t for t in ("flash", "host") if t in costs.tiers)
    elif paging in PAGING_CHOICES:
        chosen = PAGING_CHOICES[paging]
    else:
        raise ValueError(f"--paging must be one of {', '.join(PAGING_CHOICES)}, got {paging!r}")
    reference = graph.capture.get("reference_peak_bytes")
    return Problem(graph, costs, resolve_budget(budget, graph, reference, profile), objective,
                   deadline, chosen, paging_time, profile.name if profile else None)


def plan_dict_with_tiers(plan, tiers: dict[str, Tier]) -> dict:
    """The plan as written: with the figures of the tiers it pages to (`problem.tier_params`),
    so that it replays, and the executor checks it, without the profile it was costed with."""
    result = plan.to_dict()
    used = result["problem"].get("paging") or []
    result["problem"]["tier_params"] = {name: tier.to_dict() for name, tier in tiers.items()
                                        if name in used}
    return result
