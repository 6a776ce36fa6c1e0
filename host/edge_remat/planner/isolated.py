"""Run a call in a child process: a solver whose native library would clash with one already
loaded, or a search that runs beside this process on another core.

OR-Tools and highspy (which PuLP imports) each bundle HiGHS; loading OR-Tools after highspy fails
with an undefined symbol (DESIGN.md). A process that has used one therefore runs the other in a
fresh interpreter (`python -m edge_remat.planner.isolated`), passing the call in and progress and
the result back as pickles over the child's stdin and stdout. A fresh interpreter rather than
multiprocessing's spawn, because spawn re-imports the caller's main script. `Child` starts such
a call without waiting for it (order_portfolio.py tries other orders that way).
"""

from __future__ import annotations

import importlib
import os
import pickle
import select
import struct
import subprocess
import sys
from typing import Any, BinaryIO, Callable

CLASHES = {"ortools": ("highspy",), "highspy": ("ortools",)}


def spare_cores(workers: int | None, most: int) -> int:
    """How many children may run beside this process with `workers` cores (None: the cores
    this process may use), at most `most`."""
    if workers is None:
        workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
            else os.cpu_count() or 1
    return max(0, min(most, workers - 1))


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
    child = Child(function, args, kwargs, progress, what=f"the {library} solver")
    try:
        return child.result()
    finally:
        child.cancel()


class Child:
    """function(*args, **kwargs) started in a fresh interpreter; `result` waits for it."""

    def __init__(self, function: Callable[..., Any], args: tuple = (), kwargs: dict | None = None,
                 progress=None, what: str = "the child process"):
        self.what, self.progress = what, progress
        request = (function.__module__, function.__qualname__, args, kwargs or {},
                   progress is not None)
        # unbuffered, so that select() sees every byte not yet read
        self.process = subprocess.Popen([sys.executable, "-m", __name__], bufsize=0,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        _send(self.process.stdin, request)
        self.process.stdin.close()

    def result(self, timeout: float | None = None) -> Any:
        """The call's return value (its exception, as a RuntimeError with its message). With
        `timeout` (s), TimeoutError when no reply has come by then."""
        stream = self.process.stdout
        while True:
            if timeout is not None and not select.select([stream], [], [], timeout)[0]:
                raise TimeoutError(f"{self.what} gave no result in {timeout:g} s")
            message = _receive(stream)
            if message is None:
                raise RuntimeError(f"{self.what} died (exit code {self.process.wait()})")
            kind, payload = message
            if kind == "progress":
                self.progress(*payload)
            elif kind == "result":
                return payload
            else:
                raise RuntimeError(f"{self.what} failed: {payload}")

    def cancel(self) -> None:
        """Stop the child if it still runs (and reap it)."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self.process.stdout.close()


def _send(stream: BinaryIO, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    message = memoryview(struct.pack("<Q", len(data)) + data)
    while message:  # an unbuffered stream (a Child's stdin) may take part of it a write
        message = message[stream.write(message):]
    stream.flush()


def _receive(stream: BinaryIO) -> Any:
    head = _read_exactly(stream, 8)
    if head is None:
        return None
    (size,) = struct.unpack("<Q", head)
    data = _read_exactly(stream, size)
    return None if data is None else pickle.loads(data)


def _read_exactly(stream: BinaryIO, size: int) -> bytes | None:
    """`size` bytes (an unbuffered stream may return fewer per read), or None at the end."""
    chunks, left = [], size
    while left:
        chunk = stream.read(left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _serve() -> None:
    # Ctrl-C reaches the whole process group (as `timeout`'s SIGTERM does): the parent
    # handles it (and kills this child), so the child must not die first with a traceback of
    # its own.
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
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
