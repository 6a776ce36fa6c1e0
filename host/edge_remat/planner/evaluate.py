"""One validation path for every solver: lower the decisions, replay them in the simulator."""

from __future__ import annotations

import math
from dataclasses import dataclass

from edge_remat_agent.formats import Stages
from edge_remat_agent.simulate import SimResult, simulate

from .problem import Problem
from .stages import StageDecision, lower


@dataclass
class Evaluation:
    stages: Stages
    sim: SimResult
    fits_budget: bool
    meets_deadline: bool
    value: float  # the objective (seconds or joules), whether or not it is feasible

    @property
    def feasible(self) -> bool:
        return self.fits_budget and self.meets_deadline

    @property
    def objective(self) -> float:
        return self.value if self.feasible else math.inf

    @property
    def rank(self) -> tuple[float, float, int]:
        """The objective, then, among plans it ties, the less IO: where IO hides wholly behind
        compute, plans that page gigabytes and plans that page nothing cost the same, and
        the board then pays for the bytes (1.1B LoRA under 2 GiB: a plan writing 2.85 GB a
        step to flash took 16.7 s a step where one reading its weights again took 9.3 s)."""
        return self.objective, self.sim.io_busy_s or 0.0, self.sim.paged_bytes

    def replaces(self, known: "Evaluation") -> bool:
        """Whether an exact solver's plan with this evaluation is taken over `known`, one found
        before it: a better objective, or one that ties it (within the solvers' relative
        tolerance, which a rounded objective may miss by) with no more IO, as `rank` orders."""
        if not self.feasible:
            return False
        if self.objective > known.objective * (1 + OBJECTIVE_TIE):
            return False
        if self.objective < known.objective * (1 - OBJECTIVE_TIE):
            return True
        return self.rank[1:] <= known.rank[1:]


OBJECTIVE_TIE = 1e-9  # objectives within this relative distance tie


def evaluate(p: Problem, decisions: list[StageDecision]) -> Evaluation:
    stages, _ = lower(p, decisions)
    if p.overlapped:  # page-ins hoisted, page-outs issued early, scored on the IO timeline
        from .overlap import schedule_io
        stages = schedule_io(p, stages)
    return _replayed(p, stages)


def with_page_outs_delayed(p: Problem, evaluation: Evaluation) -> Evaluation:
    """The evaluated schedule with its page-outs issued later where that shortens the step
    (overlap.delay_page_outs, too slow to run on every candidate), where that is feasible and
    lowers the objective; else the evaluation given."""
    if not (p.overlapped and evaluation.feasible):
        return evaluation
    from .overlap import delay_page_outs
    stages = delay_page_outs(p, evaluation.stages)
    if stages is evaluation.stages:
        return evaluation
    delayed = _replayed(p, stages)
    return delayed if delayed.feasible and delayed.value < evaluation.value else evaluation


def _replayed(p: Problem, stages: Stages) -> Evaluation:
    # a heuristic's page-outs past a tier's capacity (the room in a board's page folder) make
    # a plan that does not fit, as RAM past the budget does: it used to stop planning there
    sim = simulate(p.graph, p.costs, stages, p.budget_bytes, io="overlap" if p.overlapped
                   else "sync", tier_capacity="count")
    deadline = p.deadline_s()
    used = p.deadline_time_of(sim)
    meets = deadline is None or used <= deadline * (1 + 1e-9)
    return Evaluation(stages, sim, bool(sim.fits_budget), meets,
                      p.objective_value(sim.time_s, sim.energy_j))
