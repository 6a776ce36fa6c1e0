"""The plan format: the contract between solvers, the simulator and the executor.

A schedule is a list of stages; each stage a list of instructions
`{"op": "compute" | "free" | "page_out" | "page_in", "node": <graph node id>, "tier": ...}`
with `tier` ("flash" | "host") only on paging instructions. `tiers` carries the figures of the
tiers the plan pages to (bandwidths, latencies, energy), so that the plan replays, and the
executor checks it, without the profile it was costed with.

`{"op": "page_in", "node": p, "tier": "home"}`, for a param node p whose parameters live on a
page tier (`attrs.io`), reads its group from that home: what computing p does, as a read that
an overlapped run issues on its IO timeline, ahead of p's first use (timeline.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .arena import ArenaLayout, arena_from_dict
from .fields import Reader, check_header, dump_json, load_json
from .graph import NodeId
from .profile import TIER_NAMES, Tier, tier_from

VERSIONS = (1,)
OPS = ("compute", "free", "page_out", "page_in")
PAGING_OPS = ("page_out", "page_in")
HOME = "home"  # a page_in's tier for a param node read from its parameters' home
STATUSES = ("optimal", "feasible", "infeasible", "timeout")


@dataclass(frozen=True)
class Instruction:
    op: str
    node: NodeId
    tier: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"op": self.op, "node": self.node}
        if self.tier is not None:
            out["tier"] = self.tier
        return out

    def __str__(self) -> str:
        return f"{self.op} {self.node}" + (f" {self.tier}" if self.tier else "")


Stages = list[list[Instruction]]


@dataclass
class Plan:
    stages: Stages
    graph_fingerprint: str
    budget_bytes: int
    objective: str = "time"
    solver: dict[str, Any] = field(default_factory=dict)  # name, status, lower_bound, gap, ...
    predicted: dict[str, Any] = field(default_factory=dict)  # the simulator's figures
    problem: dict[str, Any] = field(default_factory=dict)  # deadline, paging, profile, costs used
    fingerprint: str = ""  # hash of graph + profile + budgets
    tiers: dict[str, Tier] = field(default_factory=dict)  # figures of the tiers it pages to
    arena: ArenaLayout | None = None  # optional: each planned tensor's offset (formats/arena.py)

    def instructions(self):
        for stage in self.stages:
            yield from stage

    def tiers_used(self) -> set[str]:
        """The tiers the plan pages out to."""
        return {ins.tier for ins in self.instructions() if ins.op == "page_out"}

    def page_outs_to(self, tier: str) -> int:
        """How many page-outs the plan sends to `tier`."""
        return sum(1 for ins in self.instructions() if ins.op == "page_out" and ins.tier == tier)

    @property
    def runtime_warm_bytes(self) -> int:
        """What the ops' first calls leave to the process, as the plan counted it in its fixed
        memory (from its profile: costs.runtime_warm_bytes); 0 where it did not."""
        return int(self.problem.get("runtime_warm_bytes") or 0)

    def to_dict(self) -> dict[str, Any]:
        return {"format": "edge-remat/plan", "version": 1, "fingerprint": self.fingerprint,
                "graph_fingerprint": self.graph_fingerprint, "budget_bytes": self.budget_bytes,
                "objective": self.objective, "solver": self.solver, "predicted": self.predicted,
                "problem": self.problem,
                "tiers": {name: tier.to_dict() for name, tier in self.tiers.items()},
                "stages": [[ins.to_dict() for ins in stage] for stage in self.stages],
                **({"arena": self.arena.to_dict()} if self.arena is not None else {})}

    def save(self, path: str | Path) -> None:
        dump_json(self.to_dict(), path, finite=True)


_FIELDS = {"format", "version", "fingerprint", "graph_fingerprint", "budget_bytes", "objective",
           "solver", "predicted", "problem", "tiers", "stages", "arena"}


def plan_from_dict(obj: Any, source: str = "<plan>") -> Plan:
    r = Reader(obj, source)
    check_header(r, "plan", VERSIONS)
    r.reject_unknown(_FIELDS)
    stages: Stages = []
    for s, stage in enumerate(r.list("stages")):
        if not isinstance(stage, list):
            raise r.error(f"stages[{s}]", "a list of instructions", stage)
        stages.append([_instruction(Reader(ins, source, f"stages[{s}][{k}]"))
                       for k, ins in enumerate(stage)])
    problem = dict(r.object("problem", None) or {})
    Reader(problem, source, "problem").integer("runtime_warm_bytes", None)  # checked once here
    return Plan(stages=stages, graph_fingerprint=r.str("graph_fingerprint", ""),
                budget_bytes=r.integer("budget_bytes"),
                objective=r.str("objective", "time", ("time", "energy")),
                solver=_solver(r),
                predicted=_predicted(r),
                problem=problem, fingerprint=r.str("fingerprint", ""),
                tiers=_tiers(r, problem),
                arena=arena_from_dict(obj["arena"], source) if "arena" in obj else None)


_ABSENT = object()  # a default that tells a field left out (fine) from one set to null (refused)


def _solver(r: Reader) -> dict[str, Any]:
    """How the plan was found, as `plan`'s table, the run report and a fleet's rows print it."""
    solver = r.child("solver", {})
    for key in ("name", "status", "fallback_from", "bound_scope", "proven_optimal_by"):
        solver.str(key, _ABSENT)
    for key in ("lower_bound", "gap", "solve_time_s", "time_limit_s", "first_plan_s",
                "best_plan_s"):
        solver.number(key, None, minimum=None)
    solver.integer("workers", None, minimum=1)
    return solver.obj


# The simulator's figures that the board's summary, the run report and `plan`'s table print or
# compare: a damaged one was a TypeError mid-run ("run stopped: TypeError"), not a bad plan.
_PREDICTED_COUNTS = ("peak_bytes", "computes", "recomputed", "page_ins", "page_outs",
                     "paged_bytes")
_PREDICTED_FIGURES = ("compute_time_s", "paging_time_s", "energy_compute_j", "energy_paging_j",
                      "energy_static_j", "home_io_time_s", "home_io_energy_j", "time_s",
                      "energy_j", "objective_value", "tdi_percent")
_PREDICTED_OPTIONAL = ("step_time_s", "io_busy_s", "io_wait_s", "io_slowed_s",
                       "paging_hidden_share")  # null where the plan pages nothing


def _predicted(r: Reader) -> dict[str, Any]:
    predicted = r.child("predicted", {})
    for key in _PREDICTED_COUNTS:
        predicted.integer(key, _ABSENT)
    for key in _PREDICTED_FIGURES:
        predicted.number(key, _ABSENT, minimum=None)
    for key in _PREDICTED_OPTIONAL:
        predicted.number(key, None, minimum=None)
    peak_at = predicted.raw("peak_at", [])  # a tuple in a plan not yet written
    if not isinstance(peak_at, (list, tuple)) or \
            not all(isinstance(x, int) and not isinstance(x, bool) for x in peak_at):
        raise predicted.error("peak_at", "[stage, position] (integers)", peak_at)
    step = predicted.child("accumulated_step", None)
    if step is not None:
        step.integer("micro_batches", minimum=1)
        step.number("time_s")
        step.number("energy_j")
    return predicted.obj


def _tiers(r: Reader, problem: dict[str, Any]) -> dict[str, Tier]:
    """The plan's tier figures; plans written before they had a field of their own kept them
    in `problem.tier_params`, read here once."""
    if "tiers" in r.obj:
        tiers_r = r.child("tiers")
    else:
        tiers_r = Reader(problem.pop("tier_params", None) or {}, r.source, "problem.tier_params")
    for name in tiers_r.obj:
        if name not in TIER_NAMES:
            raise tiers_r.error(name, "a tier named " + " or ".join(TIER_NAMES))
    return {name: tier_from(tiers_r.child(name)) for name in tiers_r.obj}


def _instruction(r: Reader) -> Instruction:
    r.reject_unknown({"op", "node", "tier"})
    op = r.str("op", choices=OPS)
    node = r.raw("node")
    if isinstance(node, bool) or not isinstance(node, (int, str)):
        raise r.error("node", "a node id (integer or string)", node)
    if op in PAGING_OPS:
        tiers = TIER_NAMES + (HOME,) if op == "page_in" else TIER_NAMES
        return Instruction(op, node, r.str("tier", choices=tiers))
    if "tier" in r.obj:
        raise r.error("tier", f"no tier on a '{op}' instruction")
    return Instruction(op, node)


def load_plan(path: str | Path) -> Plan:
    return plan_from_dict(load_json(path), str(path))
