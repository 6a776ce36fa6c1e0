"""Users' own Python, named MODULE:NAME: a model's factory (capture/models.py) or a data
function (data/). MODULE is an importable module (`my_pkg.models`) or a Python file
(`examples/my_model.py`): one that ends in .py or holds a path separator."""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import json
import os
import sys
import traceback
from pathlib import Path
from types import ModuleType


# The user's files that the host pushed to a board where they are not at the paths their
# specs name: JSON {host path: the copy's path on this board}, in the environment so that a
# capture's child process reads them too (use_pushed_copies, on_this_board).
PUSHED_COPIES = "EDGE_REMAT_PUSHED_COPIES"


class UserCodeError(Exception):
    """MODULE cannot be imported: the message says why, in the user's terms."""


def spec_file(spec: str) -> str | None:
    """The Python file a MODULE:NAME spec names (as written), or None where MODULE is a module
    name (or the spec has no MODULE at all)."""
    module_part, colon, _ = spec.rpartition(":")
    return module_part if colon and names_file(module_part) else None


def source_digest(spec: str) -> str | None:
    """sha256 of the source file a MODULE:NAME spec's MODULE is: the file it names, or a
    top-level module's file as `python -m` would find it from the current folder (found, not
    imported: a package's own code would run). None where there is none (a zoo name, a dotted
    module name, a module not found). What the file imports is not included."""
    module_part, colon, _ = spec.rpartition(":")
    if not colon or spec.startswith("hf:"):
        return None
    path = module_part if names_file(module_part) else _top_level_module_file(module_part)
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest() if path else None
    except OSError:
        return None


def _top_level_module_file(name: str) -> str | None:
    if not name.isidentifier():  # dotted: finding it imports its packages
        return None
    sys.path.insert(0, os.getcwd())
    try:
        found = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    finally:
        sys.path.remove(os.getcwd())
    return found.origin if found is not None and found.has_location else None


def with_absolute_file(spec: str) -> str:
    """`dir/mine.py:NAME` -> `/cwd/dir/mine.py:NAME`: whatever reads the spec later (a board,
    a graph file's reader) works in another folder. Other specs are returned as they are."""
    path = spec_file(spec)
    if path is None or os.path.isabs(path):
        return spec
    return os.path.abspath(path) + spec[len(path):]


def module_file_spec(spec: str) -> str:
    """`my_data:NAME`, where my_data is a module file in the current folder (found there as
    under `python -m`), -> `/cwd/my_data.py:NAME`: a reader in another folder (a local board's
    agent) finds it there too. Other specs (a file, a package, an installed module, a module
    not found) are returned as they are."""
    module_part, colon, name = spec.rpartition(":")
    if not colon or spec.startswith("hf:") or names_file(module_part) or \
            not module_part.isidentifier():
        return spec
    path = _top_level_module_file(module_part)
    here = Path.cwd() / f"{module_part}.py"
    if path is None or Path(path) != here:
        return spec
    return f"{here}:{name}"


# What the user's code may raise where we call it: sys.exit() too, which is no Exception, and
# which passed through as the process's own exit (QA: `graph` with a factory calling
# sys.exit(0) wrote nothing and exited 0; `fleet plan --no-ray` ended silently, the models
# after it never planned).
USER_CODE_FAILURES = (Exception, SystemExit)


@contextlib.contextmanager
def prints_to_stderr():
    """The user's print()s, while their code runs in this process, go to stderr: stdout is the
    command's own (one JSON object with --json; QA: a model that printed in its factory and
    forward put three lines before `graph --json`'s object, and json.load failed)."""
    with contextlib.redirect_stdout(sys.stderr):
        yield


def names_file(module_part: str) -> bool:
    return module_part.endswith(".py") or os.sep in module_part or "/" in module_part


def use_pushed_copies(copies: dict[str, str]) -> None:
    """Read the user's files that are missing here from these copies (host path -> path here),
    in this process and the processes it starts."""
    os.environ[PUSHED_COPIES] = json.dumps(copies)


def on_this_board(path: str) -> str:
    """The file a spec names, as this machine reads it: the path itself where it is here,
    else the copy the host pushed of it, where it pushed one (a board that does not share
    the host's files)."""
    if os.path.exists(path):
        return path
    copies = json.loads(os.environ.get(PUSHED_COPIES) or "{}")
    return copies.get(path, path)


def import_user_module(module_part: str, prefix: str) -> ModuleType:
    """The module, from its file (registered as `prefix` + the file's stem) or by name, the
    current folder importable as under `python -m`."""
    if names_file(module_part):
        path = Path(on_this_board(module_part))
        if not path.is_file():
            raise UserCodeError(f"no such file: {module_part}")
        name = prefix + Path(module_part).stem  # the same name from a pushed copy
        loader = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(loader)
        sys.modules[name] = module  # dataclasses and pickling look modules up by name
        try:
            loader.loader.exec_module(module)
        except USER_CODE_FAILURES as exc:  # a SyntaxError, a raise or sys.exit in the file
            raise UserCodeError(f"importing {module_part} raised {raised(exc)}") from exc
        return module
    sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(module_part)
    except ImportError as exc:
        raise UserCodeError(f"cannot import {module_part}: {exc}") from exc
    except USER_CODE_FAILURES as exc:  # the module raised (or exited) while it was imported
        raise UserCodeError(f"importing {module_part} raised {raised(exc)}") from exc
    finally:
        sys.path.remove(os.getcwd())


def raised(exc: BaseException) -> str:
    """`ValueError: message (my_model.py line 12)`: the user's own line, where it was (not
    ours: a call that failed before any of the user's code ran names no line)."""
    if isinstance(exc, SyntaxError):  # its message names the file and line already
        return f"{type(exc).__name__}: {exc}"
    frame = users_frame(exc)
    where = f" ({Path(frame.filename).name} line {frame.lineno})" if frame else ""
    if isinstance(exc, SystemExit):  # str() is only the code: 0, or the message given
        return f"SystemExit: it called sys.exit({exc.code!r}){where}"
    return f"{type(exc).__name__}: {exc}{where}"


def _nobodys(filename: str) -> bool:
    """Python's own frozen modules (`<frozen importlib._bootstrap>`): no one's file to open."""
    return filename.startswith("<frozen ")


def users_frame(exc: BaseException):
    """The innermost frame of the traceback outside this package, or None."""
    ours = Path(__file__).resolve().parent
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if ours not in Path(f.filename).resolve().parents and not _nobodys(f.filename)]
    return frames[-1] if frames else None
