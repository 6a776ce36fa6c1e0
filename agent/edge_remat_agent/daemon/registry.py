"""The job registry: what a job kind runs, and the context a running job gets.

A job function takes (ctx, params) and returns a JSON-able dict, its result:

    def profile_job(ctx: JobContext, params: dict) -> dict:
        read = JobParams(params, ctx, "profile")
        graph = read.input_path("graph")               # a file the host pushed
        seconds = read.number("idle_s", 1.0, minimum=0, maximum=3600)
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

Read params through JobParams: a param that is missing or wrong (not a number, a number outside
the minimum and maximum its job gives, a path outside the workdir) raises BadParam, which the
job's record marks `bad_input` and the host answers with exit 2 (bad input), in one line that
names the param, not with a failed job's exit 1.

A kind's params that are wrong whatever the board (a number out of its bounds, a missing one)
are read by one function of its own, given to register_job as `params=` ("module:function",
taking a JobParams), which the job calls first: refuse_bad_params runs the same function where
the job is submitted (the host, before `job --detach` sends it), so that a job that would be
refused is refused there, in the board's words, and not only later in its record.
"""

from __future__ import annotations

import importlib
import json
import math
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


class InputRefused(Exception):
    """A job's input that is wrong (a param, or what a param names: a plan for another graph,
    a batch the model cannot take): nothing ran. The job process records its line as it is
    (no class name before it) with `bad_input`, which the host exits 2 for."""


class BadParam(ValueError, InputRefused):
    """A job's param that is missing or wrong: bad input (InputRefused)."""


class JobParams:
    """A job's params read by type; each refusal is a BadParam that names the param. A param
    given as null is one not given. Without a ctx (read where the job is submitted, not on
    the board) the files params name are not looked at: input_path gives None."""

    def __init__(self, params: dict, ctx: "Optional[JobContext]", kind: str):
        self.params, self.ctx, self.kind = params, ctx, kind

    def required(self, name: str, what: str) -> Any:
        """The param's value; missing (or empty) is refused, saying it is `what`."""
        value = self.params.get(name)
        if value is None or value == "":
            raise BadParam(f"the {self.kind} job needs {what} (param {name!r})")
        return value

    def number(self, name: str, default: Optional[float] = None, *,
               minimum: Optional[float] = None,
               maximum: Optional[float] = None) -> Optional[float]:
        """A finite number (JSON's, or text that reads as one), within [minimum, maximum]
        where given (a sleep of -5 s or 1e300 s is refused here, not left to fail the job)."""
        value = self.params.get(name)
        if value is None:
            return default
        try:
            number = float(value) if isinstance(value, (int, float, str)) \
                and not isinstance(value, bool) else None
        except (ValueError, OverflowError):
            number = None
        if number is None or not math.isfinite(number):
            raise BadParam(f"param {name!r} is {value!r}: give a finite number"
                           + _range_words(minimum, maximum))
        self._check_range(name, value, number, "a number", minimum, maximum)
        return number

    def integer(self, name: str, default: Optional[int] = None, *,
                minimum: Optional[int] = None,
                maximum: Optional[int] = None) -> Optional[int]:
        """A whole number (JSON's, 3.0, or text that reads as one), within [minimum, maximum]
        where given."""
        value = self.params.get(name)
        if value is None:
            return default
        whole = None
        if isinstance(value, int) and not isinstance(value, bool):
            whole = value
        elif isinstance(value, float) and value.is_integer():
            whole = int(value)
        elif isinstance(value, str):
            try:
                whole = int(value.strip())
            except ValueError:
                pass
        if whole is None:
            raise BadParam(f"param {name!r} is {value!r}: give a whole number"
                           + _range_words(minimum, maximum))
        self._check_range(name, value, whole, "a whole number", minimum, maximum)
        return whole

    def _check_range(self, name: str, value: Any, number: float, what: str,
                     minimum: Optional[float], maximum: Optional[float]) -> None:
        if (minimum is not None and number < minimum) or \
                (maximum is not None and number > maximum):
            raise BadParam(f"param {name!r} is {value!r}: give {what}"
                           + _range_words(minimum, maximum))

    def input_path(self, name: str, what: Optional[str] = None) -> Optional[Path]:
        """The file the param names in the agent's workdir (one the host pushed, or an earlier
        job's output); with `what` it is required, else None where not given."""
        if what is not None:
            self.required(name, what)
        elif not self.params.get(name):  # null or empty: not given
            return None
        if self.ctx is None:  # the file is the board's to check
            return None
        relative = self.params[name]
        push = f"give a file the host pushed (edge-remat job ... --input {name}=PATH)"
        try:
            path = self.ctx.input_path(relative)  # refuses a path outside the workdir
        except ValueError as error:
            raise BadParam(f"param {name!r}: {error}; {push}") from None
        if not path.is_file():
            raise BadParam(f"param {name!r}: {relative} is no file in the agent's workdir "
                           f"{self.ctx.workdir}; {push}")
        return path


def _range_words(minimum: Optional[float], maximum: Optional[float]) -> str:
    """' from 0 to 604800', ' of at least 1', ' of at most 9', or '' (no bounds)."""
    def text(bound: float) -> str:
        return f"{bound:g}" if isinstance(bound, float) and not bound.is_integer() \
            else str(int(bound))
    if minimum is not None and maximum is not None:
        return f" from {text(minimum)} to {text(maximum)}"
    if minimum is not None:
        return f" of at least {text(minimum)}"
    if maximum is not None:
        return f" of at most {text(maximum)}"
    return ""


@dataclass
class JobKind:
    kind: str
    target: Union[str, JobFunction]
    needs_torch: bool = False
    description: str = ""
    # reads the params that are wrong whatever the board (module docstring); None: no such
    params: Union[str, Callable[[JobParams], Any], None] = None

    def function(self) -> JobFunction:
        return _imported(self.target)


def _imported(target: Union[str, Callable]) -> Callable:
    """A "module:function" target, imported (only when a job or a check needs it)."""
    if callable(target):
        return target
    module_name, _, attr = target.partition(":")
    return getattr(importlib.import_module(module_name), attr)


_KINDS: Dict[str, JobKind] = {}
_BROKEN: Dict[str, str] = {}
_loaded = False


def register_job(kind: str, target: Union[str, JobFunction], *, needs_torch: bool = False,
                 description: str = "",
                 params: Union[str, Callable[[JobParams], Any], None] = None) -> None:
    if not kind or not all(c.isalnum() or c in "-_." for c in kind):
        raise ValueError(f"bad job kind {kind!r}")
    _KINDS[kind] = JobKind(kind, target, needs_torch, description, params)


def refuse_bad_params(kind: str, params: dict) -> None:
    """Read a job's params as its job first reads them, where the job is submitted: a param
    that is wrong whatever the board raises the BadParam the board's job would raise, in the
    same words (the files they name are the board's to check). A kind this build lacks, or
    one without such a reader, is left to the board."""
    found = get_kind(kind)
    if found is not None and found.params is not None:
        _imported(found.params)(JobParams(params, None, kind))


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
