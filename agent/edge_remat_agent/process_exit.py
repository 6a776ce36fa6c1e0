"""A process that imported torch ends without the interpreter's last garbage collections.

At exit CPython collects garbage as it tears the modules down; with torch (and torch._dynamo,
which making an optimizer imports) loaded those collections walk millions of objects: 0.8-0.95 s
of every such exit on this repository's 2-core machine, between a job's outcome and the daemon
seeing the job end, and between a capture child's answer and its job going on. gc.freeze()
moves every object into the permanent generation, which those collections skip (measured:
0.95 s -> 0.15 s). atexit handlers, stdio flushing and objects freed by their reference counts
run as before; only objects in reference cycles are left to the operating system, whose
finalizers Python never promises to run at exit.

Called only where the process itself is about to end (`python -m edge_remat_agent`, the agent's
archive, the `edge-remat` command, the capture child, the footprint probe): never in a process that goes on, where
every later collection would skip what was frozen.
"""

from __future__ import annotations

import gc


def skip_exit_collections() -> None:
    gc.freeze()
