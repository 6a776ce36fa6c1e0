"""Ctrl-C while planning keeps the best plan found so far (the planner is anytime).

Both exceptions are KeyboardInterrupts, so that code which does not know them stops as on any
Ctrl-C: a sweep or a fleet does not go on to its next plan.
"""

from __future__ import annotations


class SearchInterrupted(KeyboardInterrupt):
    """Ctrl-C inside a search that held a schedule within the budget: `found` is its stage
    decisions (for the problem the search was given), `by` names the search, `found_at` is
    when it found them (perf_counter; None: not known)."""

    def __init__(self, found, by: str, found_at: float | None = None):
        super().__init__()
        self.found, self.by, self.found_at = found, by, found_at


class PlanInterrupted(KeyboardInterrupt):
    """Ctrl-C once a plan within the budget existed: `report` is the best plan found so far
    (a SolveReport whose plan's solver status is "interrupted")."""

    def __init__(self, report):
        super().__init__()
        self.report = report
