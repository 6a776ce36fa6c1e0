"""Run a solver in a child process when its native library would clash with one already loaded.

OR-Tools and highspy (which PuLP imports) each bundle HiGHS; loading OR-Tools after highspy fails
with an undefined symbol (DESIGN.md). A process that has used one therefore runs the other in a
fresh interpreter (`python -m edge_remat.planner.isolated`), passing the call in and progress and
the result back as pickles over the child's stdin and stdout. A fresh interpreter rather than
multiprocessing's spawn, because spawn re-imports the caller's main script.
"""

from __future__ import annotations

import importlib
import os
import pickle
import struct
import subprocess
import sys
from typing import Any, BinaryIO, Callable

CLASHES = {"ortools": ("highspy",), "highspy": ("ortools",)}


def needs_isolation(library: str) -> bool:
    return any(other in sys.modules for other in CLASHES[library])


def call(library: str, function: Callable[..., Any], *args, progress=None, **kwargs) -> Any:
    """function(*args, **kwargs) (with progress=, if given), in this process if `library` can
    load here, else in a child process."""
    if progress is not None:
        kwargs["progress"] = progress
    if not needs_isolation(library):
        return function(*args, **kwargs)
    kwargs.pop("progress", None)
    request = (function.__module__, function.__qualname__, args, kwargs, progress is not None)
    child = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE)
    try:
        _send(child.stdin, request)
        child.stdin.close()
        while True:
            message = _receive(child.stdout)
            if message is None:
                raise RuntimeError(f"the {library} solver process died "
                                   f"(exit code {child.wait()})")
            kind, payload = message
            if kind == "progress":
                progress(*payload)
            elif kind == "result":
                return payload
            else:
                raise RuntimeError(f"the {library} solver failed: {payload}")
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()


def _send(stream: BinaryIO, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def _receive(stream: BinaryIO) -> Any:
    head = stream.read(8)
    if len(head) < 8:
        return None
    (size,) = struct.unpack("<Q", head)
    return pickle.loads(stream.read(size))


def _serve() -> None:
    # Ctrl-C reaches the whole process group: the parent handles it (and kills this child),
    # so the child must not die first with a traceback of its own.
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Anything the solver prints must not corrupt the reply stream, native libraries included
    # (HiGHS prints its banner from C++ to file descriptor 1): replies go to a copy of fd 1,
    # and fd 1 itself becomes stderr.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    module, qualname, args, kwargs, with_progress = _receive(sys.stdin.buffer)
    function = importlib.import_module(module)
    for part in qualname.split("."):
        function = getattr(function, part)
    if with_progress:
        kwargs["progress"] = lambda *values: _send(out, ("progress", values))
    try:
        _send(out, ("result", function(*args, **kwargs)))
    except Exception as exc:  # the parent raises it, with its message
        _send(out, ("error", f"{type(exc).__name__}: {exc}"))


if __name__ == "__main__":
    _serve()
