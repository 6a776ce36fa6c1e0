"""The user's own files that a job's specs name (a model's or data's Python file, an hf:
spec's config or adapter file), pushed with the job to a board that does not share this
machine's files: the board reads each from its copy where the path the spec names is not
there (edge_remat_agent.daemon.pushed_copies). Folders (an hf: checkpoint or adapter folder)
are not pushed: the board needs them at the same path."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from edge_remat_agent.capture.hf_spec import files_named

SPEC_PARAMS = ("model", "data")


def user_files(params: dict, inputs: dict) -> list[str]:
    """The files on this machine that the job's model and data specs name, and the graph's
    own model spec (the one the board captures again) where the job is given a graph."""
    specs = [params.get(name) for name in SPEC_PARAMS]
    if inputs.get("graph") is not None:
        specs.append(_graph_model(inputs["graph"]))
    files: list[str] = []
    for spec in specs:
        if isinstance(spec, str):
            files += [path for path in files_named(spec) if path not in files]
    return files


def _graph_model(graph: "str | Path") -> Optional[str]:
    """The model spec a graph file was captured from; None for a file that does not say (the
    board's job refuses a graph that does not read, in its own words)."""
    try:
        capture = json.loads(Path(graph).read_text()).get("capture") or {}
        return (capture.get("source") or {}).get("model")
    except (OSError, ValueError, AttributeError):
        return None
