"""The planner's status line on a terminal, redrawn in place: the best plan so far and its bound
as the planner improves it (CP-SAT's solutions, the window LNS's), and in between, every
TICK_S, the time and the phase, since a large graph's first plan may take many seconds (2000
nodes: 16 s) and a line that stays blank until then reads as a hang. Off a terminal there is
no status line (a log gets the table only): the caller passes live=False."""

from __future__ import annotations

import contextlib
import sys
import threading
import time as clock
from typing import Iterator, TextIO

TICK_S = 1.0


class StatusLine:
    """A Progress callback (seconds, objective, bound) that also knows the phase (`phase`) and
    redraws itself every `tick_s` between callbacks, on its own thread, until closed."""

    def __init__(self, stream: TextIO, tick_s: float = TICK_S):
        self.stream, self.tick_s = stream, tick_s
        self.began = clock.perf_counter()
        self.doing = "starting"
        self.best: tuple[float, float] | None = None  # (objective, bound)
        self.width = 0  # of the line drawn last: a shorter one is padded over it
        self.shown = False  # the line is on the terminal, the cursor at its end
        self.held = False  # another writer's line is unfinished: no redraw over it
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.ticker = threading.Thread(target=self._tick, name="status line", daemon=True)

    def __call__(self, seconds: float, objective: float, bound: float) -> None:
        self.best = (objective, bound)
        self.draw()

    def phase(self, doing: str) -> None:
        self.doing = doing
        self.draw()

    def text(self) -> str:
        line = f"  plan {clock.perf_counter() - self.began:7.1f} s   {self.doing}"
        if self.best is not None:
            objective, bound = self.best
            gap = 0.0 if objective <= 0 else max(0.0, (objective - bound) / abs(objective))
            line += f"   best {objective:.6g}   bound {bound:.6g}   gap {100 * gap:6.2f}%"
        return line

    def draw(self) -> None:
        with self.lock:
            if not self.stopped.is_set():
                self._draw()

    def _draw(self) -> None:  # under the lock
        if self.held:
            return
        line = self.text()
        self.stream.write("\r" + line + " " * max(0, self.width - len(line)))
        self.stream.flush()
        self.width, self.shown = len(line), True

    def write_between(self, text: str) -> int:
        """Write another line of stderr's (a warning): the status line is cleared first, so
        that the text does not run on after it, and redrawn below once the text's line ends."""
        if not text:  # b"" too: click asks whether stderr is binary by writing it
            return self.stream.write(text)
        with self.lock:
            if self.shown:
                self.stream.write("\r" + " " * self.width + "\r")
                self.width, self.shown = 0, False
            written = self.stream.write(text)
            self.held = not text.endswith("\n")
            if not self.stopped.is_set():
                self._draw()
            self.stream.flush()
        return written

    def start(self) -> None:
        self.draw()
        self.ticker.start()

    def close(self) -> None:
        """Stop redrawing and end the line, so that what is printed next starts on its own."""
        with self.lock:
            self.stopped.set()
            if self.shown:
                self.stream.write("\n")
                self.stream.flush()
                self.shown = False
        if self.ticker.is_alive():
            self.ticker.join()

    def _tick(self) -> None:
        while not self.stopped.wait(self.tick_s):
            self.draw()


@contextlib.contextmanager
def status_line(live: bool, stream: TextIO | None = None,
                tick_s: float = TICK_S) -> Iterator[StatusLine | None]:
    """A StatusLine on `stream` (stderr) while the block runs where `live`, else None. Meanwhile
    sys.stderr is one that clears the line before each write (warnings, `error:` lines) and
    redraws it after: the text would otherwise run on after the status line's."""
    if not live:
        yield None
        return
    others = sys.stderr
    line = StatusLine(stream or others, tick_s)
    if line.stream is others:
        sys.stderr = _WritingBetween(line, others)
    line.start()
    try:
        yield line
    finally:
        line.close()
        sys.stderr = others


class _WritingBetween:
    """sys.stderr while a status line is drawn: its writes go through `write_between`."""

    def __init__(self, line: StatusLine, stream: TextIO):
        self.line, self.stream = line, stream

    def write(self, text: str) -> int:
        return self.line.write_between(text)

    def __getattr__(self, name: str):  # flush, fileno, isatty, encoding: the stream's own
        return getattr(self.stream, name)


def announce(progress: object, doing: str) -> None:
    """Tell `progress` what the planner does now, where it is a status line (any other
    callback is told only new bests)."""
    if isinstance(progress, StatusLine):
        progress.phase(doing)
