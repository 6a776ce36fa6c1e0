"""Capture a graph's model again in a child process, and run it here without tracing.

    captured = capture_isolated(graph)   # a Captured, like recapture(graph)

The child runs `recapture(graph)` (which refuses a graph that differs from what this machine
captures) and sends back the captured graph and its `Program` (program.py). This process then
builds the model itself (same factory, same seed: same weights) and rebuilds the FX graph
from the program, so it never imports AOTAutograd: what tracing costs in resident memory stays
in the child, which has exited before training starts.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import tempfile

from ..formats import Graph, graph_from_dict
from .errors import CaptureError, GraphMismatch


def capture_isolated(graph: Graph, timeout_s: float = 1800.0, traced: bytes | None = None,
                     in_ram: bool = False):
    """`recapture(graph)` (`in_ram`: `recapture_in_ram(graph)`), traced in a child process;
    raises what it raises. `traced`: what `trace_in_child` already returned for this graph."""
    from .models import load_source_model
    from .pipeline import Captured
    if traced is None:
        traced = trace_in_child(json.dumps(graph.to_dict()), graph.name, timeout_s, in_ram)
    answer = pickle.loads(traced)
    if "error" in answer:
        error = answer["error"]
        cls = GraphMismatch if error.pop("mismatch") else CaptureError
        raise cls(**error)
    again = graph_from_dict(answer["graph"], "the graph captured on this machine")
    source = graph.capture["source"]
    from ..weights.deferred import deferred_weights
    with deferred_weights():  # the executor fills it: weights/, executor/stores.py
        module, args = load_source_model(source)
    return Captured(again, answer["program"].trace(), [], module, args)


def trace_in_child(graph_json: str, name: str, timeout_s: float = 1800.0,
                   in_ram: bool = False) -> bytes:
    """Run the child on a graph file's text; return its answer, still pickled. Needs no torch
    in this process: a job that calls it before importing torch keeps the child's peak (torch,
    the tracer and the model) from stacking on its own torch (measured: 224 MiB).
    A job of the agent's daemon reads back an answer its board kept (kept.py) instead."""
    from .kept import kept_answer, kept_folder
    kept = kept_answer(kept_folder(), graph_json, in_ram)
    if kept is not None:
        return kept
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    with tempfile.TemporaryDirectory(prefix="edge-remat-capture-") as folder:
        answer_file = os.path.join(folder, "answer.pickle")  # not stdout: libraries print
        try:
            done = subprocess.run([sys.executable, "-m", __name__, answer_file,
                                   *([IN_RAM] if in_ram else [])],
                                  input=graph_json.encode(), capture_output=True, env=env,
                                  timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"capturing '{name}' in a child process took more than "
                               f"{timeout_s:g} s") from None
        if done.returncode == -signal.SIGKILL:  # what the out-of-memory killer sends
            raise RuntimeError(f"capturing '{name}' in a child process was killed by SIGKILL "
                               "(the out-of-memory killer?): tracing the model needs more "
                               "memory than the board has left; give it more, or capture a "
                               "smaller batch")
        if done.returncode != 0 or not os.path.exists(answer_file):
            lines = done.stderr.decode(errors="replace").strip().splitlines() or ["no message"]
            raise RuntimeError(f"capturing '{name}' in a child process failed (exit "
                               f"status {done.returncode}): {lines[-1]}")
        with open(answer_file, "rb") as handle:
            return handle.read()


IN_RAM = "--in-ram"  # the child's flag: recapture_in_ram


def _child(answer_file: str, in_ram: bool = False) -> int:
    from .pipeline import recapture, recapture_in_ram
    from .program import program_of
    from .kept import keep_answer, kept_folder
    graph_json = sys.stdin.buffer.read().decode()
    graph = graph_from_dict(json.loads(graph_json), "the graph given")
    try:
        captured = recapture_in_ram(graph) if in_ram else recapture(graph)
        answer = {"graph": captured.graph.to_dict(), "program": program_of(captured.trace)}
    except CaptureError as error:
        answer = {"error": {"mismatch": isinstance(error, GraphMismatch), "model": error.model,
                            "problem": error.problem, "op": error.op, "module": error.module}}
    pickled = pickle.dumps(answer)
    with open(answer_file, "wb") as handle:
        handle.write(pickled)
    if "error" not in answer:  # an error is met again by tracing again, and said
        keep_answer(kept_folder(), graph_json, in_ram, pickled)
    return 0


if __name__ == "__main__":
    status = _child(sys.argv[1], IN_RAM in sys.argv[2:])
    from ..process_exit import skip_exit_collections  # its job waits for it to end
    skip_exit_collections()
    sys.exit(status)
