"""The host's capture of a run's graph, handed to the board's jobs where the board's own trace
of it would be the same (edge_remat_agent.capture.handed): a board of this machine's torch,
Python and machine (the local board, an emulated one, an SSH board on this machine) then reads
it back instead of tracing the model again in each job. Any other board, and one on a serial
link, traces as before, and is sent nothing.
"""

from __future__ import annotations

import contextlib
import json
import pickle
import platform
import tempfile
from pathlib import Path
from typing import Iterator

from edge_remat_agent.capture.handed import TRACED, TRACED_KEY


class HandedCapture:
    """`captured`: the host's capture (capture.pipeline.Captured) of the graph saved at
    `graph_path`."""

    def __init__(self, captured, graph_path: Path):
        self.captured, self.graph_path = captured, Path(graph_path)

    @contextlib.contextmanager
    def to(self, board) -> Iterator["tuple[dict, dict]"]:
        """(params, inputs) that hand the capture to a job on `board` (transport.Board), or
        ({}, {}) where the board's trace could differ; the answer's file lasts the block."""
        # a serial link moves 11-92 KB/s (115200-921600 baud): the answer (100-300 KB) costs
        # about what tracing saves
        graph_json = self.graph_path.read_text()  # the graph as the board reads it
        key = None if board.device.connection.kind == "serial" else \
            self._key_for(board.hello(), graph_json)
        if key is None:
            yield {}, {}
            return
        from edge_remat_agent.capture.program import program_of
        # the graph file's, as the board's own trace would answer
        answer = {"graph": json.loads(graph_json), "program": program_of(self.captured.trace)}
        with tempfile.TemporaryDirectory(prefix="edge-remat-traced-") as folder:
            path = Path(folder) / "traced.pickle"
            path.write_bytes(pickle.dumps(answer))
            yield {TRACED_KEY: key}, {TRACED: path}

    def _key_for(self, hello: dict, graph_json: str) -> "str | None":
        """The key the board keeps its own trace of the graph (`graph_json`, the file's text)
        under, as this host makes it
        (kept.capture_key with the board's agent build), or None where the board runs another
        torch, Python or machine, or the key cannot see the model's code (a file's, hf:)."""
        from edge_remat_agent.capture.kept import capture_key
        from edge_remat_agent.daemon.sysinfo import torch_version
        here = (torch_version(), platform.python_version(), platform.machine())
        build = hello.get("build")
        if not build or (hello.get("torch"), hello.get("python"), hello.get("machine")) != here:
            return None
        model = str((self.captured.graph.capture.get("source") or {}).get("model", ""))
        if ":" in model:  # a file's model: the board keys the pushed copy, not this file
            return None
        return capture_key(graph_json, False, build)
