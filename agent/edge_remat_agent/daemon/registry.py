"""The job registry: what a job kind runs, and the context a running job gets.

A job function takes (ctx, params) and returns a JSON-able dict, its result:

    def profile_job(ctx: JobContext, params: dict) -> dict:
        graph = ctx.input_path(params["graph"])        # a file the host pushed
        for i, node in enumerate(nodes):
            if ctx.cancelled: raise JobCancelled()
            ctx.progress(i / len(nodes), f"node {node}")
        ctx.write_json("profile.json", profile)        # fetched by the host afterwards
        return {"files": ["profile.json"]}

Register it by "module:function" string in job_table.py, one line per kind. The daemon reads
only that table (it must not import torch: seconds and hundreds of MB on a small board); the
job process imports the function when the job runs:

    register_job("profile", "edge_remat_agent.profiler.jobs:profile_job", needs_torch=True)

A kind whose module is missing from this agent build fails its jobs with a clear error.
"""

from __future__ import annotations

import importlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Union

# Light modules that only call register_job (importing them must stay cheap).
PLUGIN_MODULES = ("edge_remat_agent.daemon.job_table",)

JobFunction = Callable[["JobContext", dict], dict]


class JobCancelled(Exception):
    """Raised by a job that noticed ctx.cancelled."""


@dataclass
class JobKind:
    kind: str
    target: Union[str, JobFunction]
    needs_torch: bool = False
    description: str = ""

    def function(self) -> JobFunction:
        if callable(self.target):
            return self.target
        module_name, _, attr = self.target.partition(":")
        return getattr(importlib.import_module(module_name), attr)


_KINDS: Dict[str, JobKind] = {}
_BROKEN: Dict[str, str] = {}
_loaded = False


def register_job(kind: str, target: Union[str, JobFunction], *, needs_torch: bool = False,
                 description: str = "") -> None:
    if not kind or not all(c.isalnum() or c in "-_." for c in kind):
        raise ValueError(f"bad job kind {kind!r}")
    _KINDS[kind] = JobKind(kind, target, needs_torch, description)


def load_plugins() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for module in PLUGIN_MODULES:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name is not None and module.startswith(exc.name):
                continue  # this agent build has no such module
            _BROKEN[module] = f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # noqa: BLE001 - report it, keep the other kinds usable
            _BROKEN[module] = f"{type(exc).__name__}: {exc}"


def job_kinds() -> Dict[str, JobKind]:
    load_plugins()
    return dict(_KINDS)


def broken_plugins() -> Dict[str, str]:
    load_plugins()
    return dict(_BROKEN)


def get_kind(kind: str) -> Optional[JobKind]:
    return job_kinds().get(kind)


class JobContext:
    """What a job sees: where to read inputs, write outputs and checkpoints, how to report."""

    def __init__(self, job_id: str, job_dir: Path, workdir: Path,
                 progress_sink: Optional[Callable[[dict], None]] = None):
        self.job_id = job_id
        self.workdir = workdir
        self.job_dir = job_dir
        self.files_dir = job_dir / "files"
        self.state_dir = job_dir / "state"
        self.cancelled = False
        self._sink = progress_sink
        self._seq = 0
        self._last_write = 0.0
        self._pending: Optional[dict] = None
        self.files_dir.mkdir(parents=True, exist_ok=True)
        self.state_dir.mkdir(parents=True, exist_ok=True)

    def input_path(self, relative: str) -> Path:
        """A file the host pushed (a path relative to the workdir, e.g. "inputs/plan.json")."""
        from .layout import Layout
        layout = Layout(self.workdir)
        return layout.resolve(relative)

    def progress(self, fraction: Optional[float] = None, message: str = "",
                 **data: Any) -> None:
        """Report progress; cheap to call often (written at most every 0.2 s, plus the last)."""
        self._seq += 1
        record = {"seq": self._seq, "fraction": fraction, "message": message, "data": data,
                  "time_s": time.time()}
        self._pending = record
        if time.monotonic() - self._last_write >= 0.2 or fraction == 1.0:
            self.flush()

    def flush(self) -> None:
        """Write the newest progress now (the job process calls this when the job ends)."""
        if self._sink is not None and self._pending is not None:
            self._last_write = time.monotonic()
            self._sink(self._pending)
            self._pending = None

    def write_json(self, name: str, obj: Any) -> Path:
        path = self.files_dir / name
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(obj, indent=1))
        os.replace(tmp, path)
        return path

    def check_cancelled(self) -> None:
        if self.cancelled:
            raise JobCancelled()
