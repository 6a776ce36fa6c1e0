"""The files the host pushed (inputs/: plans, graphs, starting weights, the user's model files,
handed traces) stay while a job the board still records names one, or for INPUTS_KEPT_S after
it was last pushed or asked after (a push that found it already there); the rest are removed
as the daemon starts, after its old job records (store.JobStore.load). The folder is a cache:
the next job that needs a removed file has it pushed again (transport/session.put_file).
Before, it only grew: every plan, graph and starting-weights file any run ever sent stayed on
the board's flash for good."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Iterable, Iterator

from .layout import Layout

_log = logging.getLogger(__name__)

# Longer than any push takes to be followed by its job's submission (or a cut upload's
# resumption), so that a file pushed for a job about to be submitted is never removed.
INPUTS_KEPT_S = 24 * 3600.0


def _strings(value: object) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _strings(item)


def named_inputs(records: Iterable[dict]) -> set[str]:
    """The names of inputs/ files that the jobs' parameters name (as the host pushed them:
    `inputs/<sha>-<name>`, board.push_input)."""
    return {Path(text).name for record in records for text in _strings(record.get("params"))
            if Path(text).parent.name == "inputs"}


def prune_inputs(layout: Layout, records: Iterable[dict],
                 now: "float | None" = None) -> list[Path]:
    """Remove the inputs/ files (and cut uploads' part files) that no job of `records` names
    and that were last written or asked after more than INPUTS_KEPT_S ago; returns them."""
    now = time.time() if now is None else now
    named = named_inputs(records)
    removed = []
    try:
        entries = list(os.scandir(layout.root / "inputs"))
    except OSError:
        return removed
    for entry in entries:
        try:
            if not entry.is_file(follow_symlinks=False) or entry.name in named or \
                    now - entry.stat(follow_symlinks=False).st_mtime < INPUTS_KEPT_S:
                continue
            os.unlink(entry.path)
        except OSError as exc:  # a file another process removed or holds: the next start
            _log.warning("could not remove the old input %s: %s", entry.path, exc)
            continue
        removed.append(Path(entry.path))
    if removed:
        _log.info("removed %d input file(s) no kept job names, unused for %.0f h",
                  len(removed), INPUTS_KEPT_S / 3600)
    return removed


def note_asked_after(layout: Layout, path: Path) -> None:
    """A push found `path` already on the board (stat_file): its job follows, so the file
    counts as new for INPUTS_KEPT_S."""
    if path.parent == layout.root / "inputs":
        try:
            os.utime(path)
        except OSError:
            pass  # read-only or gone: the push sends it again if it is
