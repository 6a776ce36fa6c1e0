"""The user's own files that the host pushes with a job, for a board that does not share the
host's files: a model's or data's Python file, an hf: spec's config or adapter file. A spec
names them by their paths on the host; the job reads each from its copy where that path is
not on the board (user_code.on_this_board).

    params["pushed_copies"] = {"/home/me/proj/my_model.py": "inputs/3f0c...-my_model.py"}

The job process takes the param before the job function sees its params, for every kind."""

from __future__ import annotations

from ..user_code import use_pushed_copies
from .registry import BadParam, JobContext

PARAM = "pushed_copies"


def use_pushed_copies_param(ctx: JobContext, value) -> None:
    """Make the copies the param names (host path -> a file the host pushed) the ones this
    job's user code reads; a param that is not such a mapping is bad input."""
    if value is None:
        return
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                              for k, v in value.items()):
        raise BadParam(f"param {PARAM!r} is {value!r}: give an object of host paths to files "
                       "the host pushed")
    copies = {}
    for host_path, relative in value.items():
        try:
            path = ctx.input_path(relative)
        except ValueError as error:
            raise BadParam(f"param {PARAM!r}: {error}") from None
        if not path.is_file():
            raise BadParam(f"param {PARAM!r}: {relative} (the copy of {host_path}) is no file "
                           f"in the agent's workdir {ctx.workdir}")
        copies[host_path] = str(path)
    use_pushed_copies(copies)
