"""A line every QUIET_S while something long says nothing of its own.

A phase that prints nothing for minutes reads as a hang (profile on the emulated arm64 board
left the terminal silent for 9+ minutes while it captured, measured flash, built the board).
Board.wait repeats a quiet job's line on this period; `still_saying` does it for work on the
host side (building the arm64 board's root filesystem, downloading its wheels, starting it)."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Callable, Iterator, Optional

from .units import fmt_duration

QUIET_S = 30.0


@contextlib.contextmanager
def still_saying(say: Callable[[str], None], doing: str,
                 measure: Optional[Callable[[], str]] = None,
                 every_s: Optional[float] = None) -> Iterator[None]:
    """While the block runs, every `every_s` (QUIET_S): "{doing}: still at it, 1m30s" and,
    where given, what `measure()` says of how far it got ("1.2 GB so far")."""
    period = QUIET_S if every_s is None else every_s
    began = time.monotonic()
    done = threading.Event()

    def beat() -> None:
        while not done.wait(period):
            line = f"{doing}: still at it, {fmt_duration(time.monotonic() - began)}"
            try:
                extra = measure() if measure is not None else ""
            except OSError:  # a folder that is being renamed or removed
                extra = ""
            say(f"{line} ({extra})" if extra else line)

    thread = threading.Thread(target=beat, name="still saying", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
