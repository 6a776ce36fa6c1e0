"""The fleet's progress on the terminal: tasks done / running / infeasible / failed, and the
slowest.

On a terminal one status line is redrawn in place; elsewhere (a log, CI) each finished task is
one line. Either way the summary names the slowest tasks."""

from __future__ import annotations

import sys
import time
from typing import Callable, Optional


class Progress:
    def __init__(self, total: int, resumed: int, say: Callable[[str], None],
                 live: Optional[bool] = None):
        self.total, self.resumed, self.say = total, resumed, say
        self.live = sys.stderr.isatty() if live is None else live
        self.done = self.infeasible = self.failed = 0
        self.running: dict[str, float] = {}  # label -> when it started
        self.finished: list[tuple[float, str]] = []  # (seconds, label)
        self._drawn = False

    def started(self, label: str) -> None:
        self.running[label] = time.perf_counter()
        self.redraw()

    def stopped(self, label: str) -> None:
        """A task that is not counted (a model's capture) is no longer running."""
        self.running.pop(label, None)

    def finished_task(self, label: str, seconds: float, error: Optional[str] = None,
                      infeasible: Optional[str] = None) -> None:
        """A task done: planned, `infeasible` (what is feasible instead) or failed (`error`)."""
        self.running.pop(label, None)
        self.finished.append((seconds, label))
        if error is not None:
            self.failed += 1
        elif infeasible is not None:
            self.infeasible += 1
        else:
            self.done += 1
        self._clear()
        if error is not None:
            self.say(f"failed: {label}: {error}")
        elif infeasible is not None:
            self.say(f"infeasible: {label}: {infeasible}")
        elif not self.live:
            self.say(f"done: {label} ({seconds:.1f} s) [{self.counts()}]")
        self.redraw()

    def counts(self) -> str:
        done = self.done + self.resumed
        return (f"{done}/{self.total} done" + (f" ({self.resumed} resumed)" if self.resumed
                                               else "")
                + f", {len(self.running)} running"
                + (f", {self.infeasible} infeasible" if self.infeasible else "")
                + f", {self.failed} failed")

    def line(self) -> str:
        text = "fleet: " + self.counts()
        if self.running:
            label, since = min(self.running.items(), key=lambda item: item[1])
            text += f"; slowest running: {label} ({time.perf_counter() - since:.0f} s)"
        return text

    def redraw(self) -> None:
        if self.live:
            sys.stderr.write("\r\x1b[2K" + self.line())
            sys.stderr.flush()
            self._drawn = True

    def _clear(self) -> None:
        if self._drawn:
            sys.stderr.write("\r\x1b[2K")
            sys.stderr.flush()
            self._drawn = False

    def close(self) -> None:
        self._clear()

    def slowest(self, count: int = 3) -> list[tuple[float, str]]:
        return sorted(self.finished, reverse=True)[:count]
