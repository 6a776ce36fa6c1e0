"""Old agent archives in WORKDIR/agents: each agent version the host pushed leaves one, and they
piled up. A daemon starting removes those that nothing can still need: not its own, not the one
agent.current names, none a live process runs (a job adopted from an earlier daemon, a relay,
that daemon itself), none pushed in the last PUSH_GRACE_S (a host may be writing agent.current
for it). Where it cannot tell which archives run (no /proc), it removes none."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import List, Optional, Set

from .identity import CONTENT_NAME
from .layout import Layout

_log = logging.getLogger(__name__)
PUSH_GRACE_S = 600.0


def archives_in_use(agents: Path, proc: Path = Path("/proc")) -> Optional[Set[Path]]:
    """The archives under `agents` that a live process names on its command line (as
    `python agents/X.pyz ...` runs one); None where there is no /proc to read."""
    if not proc.is_dir():
        return None
    used = set()
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = [os.fsdecode(a) for a in (entry / "cmdline").read_bytes().split(b"\0")
                    if a.endswith(b".pyz")]
        except OSError:  # gone meanwhile
            continue
        for arg in args:
            try:  # a relative argument is the process's cwd's
                path = Path(os.readlink(entry / "cwd")) / arg
            except OSError:  # another user's process: its name alone, to be safe
                path = agents / Path(arg).name
            if path.parent.resolve() == agents.resolve():
                used.add(path.resolve())
    return used


def prune_archives(layout: Layout, own: Optional[Path]) -> List[Path]:
    """Remove the archives nothing can still need (see the module's docstring); the removed."""
    agents = layout.root / "agents"
    in_use = archives_in_use(agents)
    if in_use is None:
        return []
    keep = {p.resolve() for p in (own, layout.current_archive()) if p is not None} | in_use
    recent = time.time() - PUSH_GRACE_S
    removed = []
    for path in agents.glob("*.pyz"):
        try:
            if (not CONTENT_NAME.match(path.name) or path.resolve() in keep
                    or path.stat().st_mtime > recent):
                continue
            path.unlink()
        except OSError:
            continue
        removed.append(path)
    if removed:
        _log.info("removed %d old agent archive(s): %s", len(removed),
                  ", ".join(p.name for p in sorted(removed)))
    return removed
