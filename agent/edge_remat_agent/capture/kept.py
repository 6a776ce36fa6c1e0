"""Captures kept on the board, so that a job running or profiling a graph this board has
already traced skips tracing it again.

    folder = kept_folder()                        # None: nothing is kept in this process
    answer = kept_answer(folder, graph_json, in_ram)   # the child's pickled answer, or None
    keep_answer(folder, graph_json, in_ram, answer)

Each run job and each profile job traces its graph in a child process (isolated.py): torch
imported a second time, the model built, AOTAutograd's trace: ResNet-18 9 s, gpt-mini 16 s on
a 2-core x86 host (a throwaway script calling trace_in_child), minutes on the emulated arm64
board, paid again by every job of the same graph (profile,
then run, then a resumed run, then a fleet's next round). The answer (the captured graph and
its `Program`, plain data) depends only on what the key below holds, so a later job reads it
back instead.

The key is everything that decides the answer: the graph file's text (model, batch, dtype,
seed and options, as captured), the in-RAM flag, the agent's own code down to its bytes
(`identity.code_digest`: the zoo's models and the tracer), the versions of torch and Python,
and the machine's architecture; for a model in a user's file, that file and the .py files
beside it. A model named as an importable module, or a Hugging Face model (its code and any
local checkpoint live outside what the key sees), is traced every time. Only a capture that
succeeded is kept, after its sha256, which is checked as it is read back (a damaged file is
removed, and the graph traced again).

The folder is the daemon's workdir's `captures/` (set for its job processes through
`EDGE_REMAT_CAPTURE_KEPT`), at most `KEEP` answers, the least recently used removed first.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
from pathlib import Path

from ..formats.fields import dump_bytes
from ..user_code import spec_file

FOLDER_VARIABLE = "EDGE_REMAT_CAPTURE_KEPT"  # the folder; unset or empty: nothing is kept
DIGEST_BYTES = 32  # each file: the answer's sha256, then the answer
TIMES = ("trace_s", "capture_s")  # how long the capture took: not what it made
# answers; gpt-mini's is 255 KB, ResNet-18's 157 KB (a throwaway script calling trace_in_child)
KEEP = 16


def kept_folder() -> Path | None:
    chosen = os.environ.get(FOLDER_VARIABLE)
    return Path(chosen) if chosen else None


def capture_key(graph_json: str, in_ram: bool, code: str | None = None) -> str | None:
    """The answer's key, or None where the model's code lies outside what a key can see.
    `code`: the agent build the key is made for (default: this code's, identity.code_digest),
    for a host that hands its own trace to a board running that build (handed.py)."""
    try:
        graph = json.loads(graph_json)
        source = (graph.get("capture") or {}).get("source") or {}
    except (ValueError, AttributeError):
        return None  # the child says what is wrong with it
    model = source.get("model")
    if not isinstance(model, str) or model.startswith("hf:"):
        return None
    digest = hashlib.sha256()
    if ":" in model:
        path = spec_file(model)
        if path is None or not os.path.isabs(path):  # a module name, or a relative file
            return None
        user_files = _user_files(Path(path))
        if user_files is None:
            return None
        digest.update(user_files.encode())
    from ..daemon.identity import code_digest
    from ..daemon.sysinfo import torch_version  # without importing torch: the job has not yet
    # its file's text and the host's dict of it (a profile job's graph) key alike, and so do
    # two captures of one model that took another time
    timed = {**graph, "capture": {k: v for k, v in graph["capture"].items() if k not in TIMES}}
    canonical = json.dumps(timed, sort_keys=True, separators=(",", ":"))
    for part in (canonical, str(bool(in_ram)), code or code_digest(), str(torch_version()),
                 sys.version, platform.machine()):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()


def kept_answer(folder: Path | None, graph_json: str, in_ram: bool) -> bytes | None:
    key = capture_key(graph_json, in_ram) if folder is not None else None
    return None if key is None else answer_under(folder, key)


def answer_under(folder: Path, key: str) -> bytes | None:
    """The answer kept under `key` (capture_key's), or None."""
    path = folder / f"{key}.pickle"
    try:
        kept = path.read_bytes()
        os.utime(path)  # recently used
    except OSError:
        return None
    answer = kept[DIGEST_BYTES:]
    if kept[:DIGEST_BYTES] != hashlib.sha256(answer).digest():  # damaged on the board's disk
        path.unlink(missing_ok=True)
        return None
    return answer


def keep_answer(folder: Path | None, graph_json: str, in_ram: bool, answer: bytes) -> None:
    """Keep a successful answer (written whole or not at all); a full disk keeps nothing."""
    key = capture_key(graph_json, in_ram) if folder is not None else None
    if key is not None:
        keep_under(folder, key, answer)


def keep_under(folder: Path, key: str, answer: bytes) -> None:
    """keep_answer's, under `key` (capture_key's)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        dump_bytes(hashlib.sha256(answer).digest() + answer, folder / f"{key}.pickle")
    except OSError:
        return
    _forget_the_oldest(folder)


def _forget_the_oldest(folder: Path) -> None:
    kept = []
    for path in folder.glob("*.pickle"):
        try:
            kept.append((path.stat().st_mtime, path))
        except OSError:  # removed by another job meanwhile
            pass
    for _, path in sorted(kept, reverse=True)[KEEP:]:
        path.unlink(missing_ok=True)


def _user_files(model_file: Path) -> str | None:
    """The model file's and its sibling .py files' contents, hashed (what it may import)."""
    try:
        files = sorted(model_file.parent.glob("*.py"))
        digest = hashlib.sha256()
        for path in files:
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    except OSError:
        return None
    return digest.hexdigest() if model_file in files else None

