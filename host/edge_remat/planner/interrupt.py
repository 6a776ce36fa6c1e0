"""Ctrl-C while planning keeps the best plan found so far (the planner is anytime).

Both exceptions are KeyboardInterrupts, so that code which does not know them stops as on any
Ctrl-C: a sweep or a fleet does not go on to its next plan.
"""

from __future__ import annotations

import contextlib
import signal
import threading

_stopped_by = ["Ctrl-C"]  # what the last interrupt was, for the error line


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


def stopped_by() -> str:
    """"Ctrl-C", or "SIGTERM" where sigterm_as_ctrl_c turned one into the interrupt."""
    return _stopped_by[0]


def sigterm_interrupt() -> KeyboardInterrupt:
    """The interrupt a SIGTERM taken as Ctrl-C raises (its error line says SIGTERM)."""
    _stopped_by[0] = "SIGTERM"
    return KeyboardInterrupt()


@contextlib.contextmanager
def sigterm_as_ctrl_c():
    """Within it SIGTERM (`timeout`, a batch scheduler, systemd stopping a unit) stops
    planning as Ctrl-C does, so the best plan so far is kept. Python runs signal handlers in
    the main thread only: elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise sigterm_interrupt()

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        if previous is not None:  # None: set from C, not Python; nothing to put back
            signal.signal(signal.SIGTERM, previous)
