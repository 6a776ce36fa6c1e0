"""Typed field access for JSON objects, so every format reports bad input the same way."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from .errors import FormatError, unreadable_file

_MISSING = object()
MAX_SIZE = 2**63 - 1  # what a size in any format may be: the solvers' and torch's int64


def _an_object(source: str) -> str:
    """What a nested object is called in the source's own format (a device config, a fleet
    manifest: TOML; QA: `connection = "local"` was told "expected a JSON object")."""
    return "a table ([name] or name = {...})" if str(source).endswith(".toml") \
        else "a JSON object"


class Reader:
    """Reads fields of one JSON object; errors name the file and the dotted field path."""

    def __init__(self, obj: Any, source: str, where: str = ""):
        if not isinstance(obj, dict):
            given = obj if isinstance(obj, (str, int, float, bool)) else type(obj).__name__
            raise FormatError(source, where or "<root>", _an_object(source), given)
        self.obj = obj
        self.source = source
        self.where = where

    def _path(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def error(self, key: str, expected: str, got: object = None) -> FormatError:
        return FormatError(self.source, self._path(key), expected, got)

    def raw(self, key: str, default: Any = _MISSING) -> Any:
        if key in self.obj:
            return self.obj[key]
        if default is _MISSING:
            raise self.error(key, "a value (the field is missing)")
        return default

    def str(self, key: str, default: Any = _MISSING, choices: tuple[str, ...] | None = None) -> Any:
        value = self.raw(key, default)
        if value is default and default is not _MISSING:
            return value
        if not isinstance(value, str):
            raise self.error(key, "a string", value)
        if choices is not None and value not in choices:
            raise self.error(key, "one of " + ", ".join(repr(c) for c in choices), value)
        return value

    def number(self, key: str, default: Any = _MISSING, minimum: float | None = 0.0) -> Any:
        value = self.raw(key, default)
        if value is default and default is not _MISSING:
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.error(key, "a finite number", value)
        if minimum is not None and value < minimum:
            raise self.error(key, f"a number >= {minimum:g}", value)
        return value

    def integer(self, key: str, default: Any = _MISSING, minimum: int | None = 0) -> Any:
        value = self.raw(key, default)
        if value is default and default is not _MISSING:
            return value
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(key, "an integer", value)
        if minimum is not None and value < minimum:
            raise self.error(key, f"an integer >= {minimum}", value)
        if key.endswith("_bytes") and value > MAX_SIZE:  # every format's sizes (QA: a plan's
            # budget_bytes of 1.5e300 trained); 2**62 stays, an unlimited budget in our plans
            raise self.error(key, "a size in bytes that fits in 64 bits, not one larger than "
                                  "any board's memory could be", value)
        return value

    def boolean(self, key: str, default: Any = _MISSING) -> Any:
        value = self.raw(key, default)
        if value is default and default is not _MISSING:
            return value
        if not isinstance(value, bool):
            raise self.error(key, "true or false", value)
        return value

    def object(self, key: str, default: Any = _MISSING) -> Any:
        value = self.raw(key, default)
        if value is default and default is not _MISSING:
            return value
        if not isinstance(value, dict):
            raise self.error(key, _an_object(self.source), value)
        return value

    def list(self, key: str, default: Any = _MISSING) -> Any:
        value = self.raw(key, default)
        if value is default and default is not _MISSING:
            return value
        if not isinstance(value, list):
            raise self.error(key, "a list", value)
        return value

    def child(self, key: str, default: Any = _MISSING) -> "Reader | None":
        value = self.raw(key, default)
        if value is None and default is not _MISSING:
            if default is None:
                return None
            value = default  # null where the field may be left out: as if it were
        return Reader(value, self.source, self._path(key))

    def item(self, key: str, index: int) -> "Reader":
        return Reader(self.obj[key][index], self.source, f"{self._path(key)}[{index}]")

    def reject_unknown(self, known: set[str]) -> None:
        unknown = sorted(set(self.obj) - known)
        if unknown:
            raise self.error(unknown[0], "no such field (known: " + ", ".join(sorted(known)) + ")")


def check_header(reader: Reader, kind: str, supported: tuple[int, ...]) -> int:
    fmt = reader.str("format")
    if fmt != f"edge-remat/{kind}":
        raise reader.error("format", f"'edge-remat/{kind}'", fmt)
    version = reader.integer("version", minimum=1)
    if version not in supported:
        raise reader.error("version", "one of " + ", ".join(map(str, supported)), version)
    return version


def load_json(path: str | Path) -> Any:
    """Parse a JSON file; a missing, unreadable or truncated file is a FormatError naming it."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise unreadable_file(path, exc) from None
    except UnicodeDecodeError as exc:
        raise FormatError(str(path), f"<byte {exc.start}>", "UTF-8 text (the file is cut short "
                          "or not JSON)", exc.reason) from None
    if not text.strip():  # QA: "expected valid JSON, got 'Expecting value'"
        raise FormatError(str(path), "<file>", "a JSON document", "an empty file")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise FormatError(str(path), f"<json line {exc.lineno} col {exc.colno}>",
                          "valid JSON", exc.msg) from None
    except RecursionError:  # `[[[[...` deeper than the parser's stack, which no file we
        # read needs: bad input like any JSON that does not parse, not an internal error
        raise FormatError(str(path), "<json>", "valid JSON",
                          "arrays or objects nested too deeply to read") from None


def dump_json(obj: Any, path: str | Path) -> None:
    dump_text(json.dumps(obj, indent=1) + "\n", path)


def dump_text(text: str, path: str | Path) -> None:
    dump_bytes(text.encode("utf-8"), path)


def dump_bytes(data: bytes, path: str | Path) -> None:
    """Write atomically: a temporary file beside the target (same filesystem) renamed over it,
    so a crash mid-write never leaves a truncated file; on failure the temporary file goes.
    A symbolic link is written through, as a shell's > does: the file it names is replaced
    and the link stays (the rename once replaced the link itself)."""
    import os
    import tempfile
    path = Path(path)
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # as an ordinary write would make it, not mkstemp's 0600
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
