"""The fleet's two kinds of task, as plain functions: Ray runs them in its workers, `--no-ray`
in this process. They take and return plain values (a Graph, a Profile, dicts), write nothing,
and never raise: a failure comes back as its one-line error, so one bad task never stops the
others. The driver writes what they return (on a cluster the workers do not share its disk)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Optional

from edge_remat_agent.formats import Graph, Profile, plan_from_dict

from .manifest import PlanSettings, slug


@dataclass(frozen=True)
class PlanTask:
    """One (model, board, budget, deadline) of the manifest."""
    model: str
    board: str
    budget: str
    deadline: Optional[float] = None

    @property
    def relpath(self) -> str:
        """Where its plan goes in the output tree."""
        name = "plan-" + slug(self.budget.replace("%", "pct"))
        if self.deadline is not None:
            name += f"-deadline-{self.deadline:g}x"
        return f"{self.model}/{self.board}/{name}.json"

    @property
    def label(self) -> str:
        return f"{self.model} on {self.board} at {self.budget}" + (
            f", deadline {self.deadline:g}x" if self.deadline is not None else "")


def failure(exc: BaseException) -> dict[str, Any]:
    """A failed task's outcome: the CLI's one line for the same error, its status and, for an
    infeasible budget or deadline, the floor or the smallest deadline (results.SMALLEST)."""
    from ..errors import classify
    from .results import SMALLEST
    _, line, extra = classify(exc)
    return {"ok": False, "status": extra.get("status", "failed"), "error": line,
            **{key: extra[key] for key in SMALLEST if key in extra}}


def capture_outcome(spec: str, capture: dict[str, Any]) -> dict[str, Any]:
    """Capture one model, as `edge-remat graph` does: {"ok", "graph" | "error", "seconds"}."""
    started = time.perf_counter()
    try:
        from edge_remat_agent.capture import capture_model
        graph = capture_model(spec, **capture).graph
        outcome = {"ok": True, "graph": graph}
    except Exception as exc:  # noqa: BLE001 - recorded, the fleet goes on
        outcome = failure(exc)
    outcome["seconds"] = time.perf_counter() - started
    return outcome


def plan_outcome(graph: Graph, profile: Optional[Profile], budget: str,
                 deadline: Optional[float], settings: PlanSettings,
                 workers: int) -> dict[str, Any]:
    """Plan one budget with the board's profile, as `edge-remat plan` does, and replay the plan
    in the simulator: {"ok", "plan" | "error", "status", "budget_bytes", "seconds"}."""
    started = time.perf_counter()
    try:
        from ..checks import replay
        from ..planner.plan_file import make_plan
        plan, _ = make_plan(graph, budget, profile, settings.objective, deadline,
                            settings.paging, None, settings.paging_time, settings.solver,
                            settings.time_limit, settings.backend, workers)
        result = replay(plan_from_dict(plan), graph, "the plan", graph.name or "graph", profile)
        if not result.fits_budget:  # the solvers never return such a plan: a bug if so
            raise RuntimeError(f"the plan peaks at {result.peak_bytes} bytes, over its budget "
                               f"of {plan['budget_bytes']}")
        outcome = {"ok": True, "plan": plan, "status": plan["solver"]["status"],
                   "budget_bytes": plan["budget_bytes"]}
    except Exception as exc:  # noqa: BLE001 - recorded, the fleet goes on
        outcome = failure(exc)
        outcome["budget_bytes"] = _budget_bytes(graph, budget, profile)
    outcome["seconds"] = time.perf_counter() - started
    return outcome


def _budget_bytes(graph: Graph, budget: str, profile: Optional[Profile]) -> Optional[int]:
    from ..planner.build import resolve_budget
    try:
        return resolve_budget(budget, graph, graph.capture.get("reference_peak_bytes"), profile)
    except Exception:  # noqa: BLE001 - only for the table; the error line says what failed
        return None
