"""Each node's time as a planned run computes it, for boards that cannot time nodes otherwise.

The profiler times nodes inside plain steps (profiler/ops.py), so a board without room for a
plain step gets a profile without node times, and its plans cost nodes from the capture's
estimates at the board's measured rates (costs.board_roofline: 0.14x the timed nodes for
digits-cnn b32 on this host). A planned run fits where a plain step does not, and it computes
every node at least once a step: timed there, on the step's real inputs, in the order the
executor runs them, its nodes give the host what the profile lacks (the host's node_times.py
makes them the profile's ops; the next plan costs them as measured).

Timed steps are the run's steps after its first (the first pays the ops' warm-up and, on the
board, the gradient check), interpreted rather than replayed compiled, each compute waiting for
the device. A node's figure in a step is its first compute's time, averaged over the step's
passes when it accumulates micro-batches (the plan runs once a pass, and a fused update steps in
the last pass only), and its figure for the run the median over the timed steps.

The run's first step is also where the ops' first calls keep memory for good (oneDNN's
primitives, kernel caches): measured there as the profiler measures it in a plain step
(profiler/first_step.py), when no eager reference step ran before it (the board's gradient
check; a board without room checks on the host), each node's share becomes its op's
`persistent_bytes`, and the next plan counts the whole as fixed memory (runtime_warm_bytes).
"""

from __future__ import annotations

import statistics
from typing import Any

from ..formats import Graph

DEFAULT_TIMED_STEPS = 3  # what `run` asks for when its profile timed no nodes


class NodeTimes:
    """The timed steps of a run: node id -> seconds of its first compute, one dict a step."""

    def __init__(self, steps: int = 0):
        self.steps = steps  # how many steps after the first to time
        self.by_step: list[dict[Any, float]] = []
        self._passes = 0  # of the step being timed
        # node id -> its share of what the run's first step left (profiler/first_step.py)
        self.first_step_left: dict[Any, int] | None = None

    def wanted(self, step_of_this_start: int) -> bool:
        """Whether to time the step `step_of_this_start` (0: the start's first step); a step
        that is starts a new record."""
        wanted = 0 < step_of_this_start <= self.steps
        if wanted:
            self._flush()
            self.by_step.append({})
        return wanted

    def add(self, times: dict[Any, float]) -> None:
        """One pass of the step being timed (accumulating steps have several)."""
        step = self.by_step[-1]
        for node_id, seconds in times.items():
            step[node_id] = step.get(node_id, 0.0) + seconds
        self._passes += 1

    def _flush(self) -> None:
        """The step just timed: each node's mean over its passes."""
        if self._passes > 1:
            self.by_step[-1] = {k: v / self._passes for k, v in self.by_step[-1].items()}
        self._passes = 0

    def report(self, graph: Graph) -> dict[str, Any] | None:
        """{"steps": N, "time_s": [median seconds or None, in the graph's node order],
        "persistent_bytes": [its share of what the first step left, or None]} (the last where
        it was measured); None when nothing was timed."""
        self._flush()
        steps = [step for step in self.by_step if step]
        if not steps:
            return None
        medians = []
        for node in graph.nodes:
            runs = [step[node.id] for step in steps if node.id in step]
            medians.append(statistics.median(runs) if runs else None)
        out: dict[str, Any] = {"steps": len(steps), "time_s": medians}
        if self.first_step_left is not None:
            out["persistent_bytes"] = [self.first_step_left.get(node.id) for node in graph.nodes]
        return out
