"""Users' own Python, named MODULE:NAME: a model's factory (capture/models.py) or a data
function (data/). MODULE is an importable module (`my_pkg.models`) or a Python file
(`examples/my_model.py`): one that ends in .py or holds a path separator."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback
from pathlib import Path
from types import ModuleType


class UserCodeError(Exception):
    """MODULE cannot be imported: the message says why, in the user's terms."""


def spec_file(spec: str) -> str | None:
    """The Python file a MODULE:NAME spec names (as written), or None where MODULE is a module
    name (or the spec has no MODULE at all)."""
    module_part, colon, _ = spec.rpartition(":")
    return module_part if colon and names_file(module_part) else None


def with_absolute_file(spec: str) -> str:
    """`dir/mine.py:NAME` -> `/cwd/dir/mine.py:NAME`: whatever reads the spec later (a board,
    a graph file's reader) works in another folder. Other specs are returned as they are."""
    path = spec_file(spec)
    if path is None or os.path.isabs(path):
        return spec
    return os.path.abspath(path) + spec[len(path):]


def names_file(module_part: str) -> bool:
    return module_part.endswith(".py") or os.sep in module_part or "/" in module_part


def import_user_module(module_part: str, prefix: str) -> ModuleType:
    """The module, from its file (registered as `prefix` + the file's stem) or by name, the
    current folder importable as under `python -m`."""
    if names_file(module_part):
        path = Path(module_part)
        if not path.is_file():
            raise UserCodeError(f"no such file: {module_part}")
        name = prefix + path.stem
        loader = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(loader)
        sys.modules[name] = module  # dataclasses and pickling look modules up by name
        try:
            loader.loader.exec_module(module)
        except Exception as exc:  # noqa: BLE001 - a SyntaxError or a raise in the user's file
            raise UserCodeError(f"importing {module_part} raised {raised(exc)}") from exc
        return module
    sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(module_part)
    except ImportError as exc:
        raise UserCodeError(f"cannot import {module_part}: {exc}") from exc
    except Exception as exc:  # noqa: BLE001 - the module raised while it was imported
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
