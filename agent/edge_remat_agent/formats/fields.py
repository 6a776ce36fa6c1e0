"""Typed field access for JSON objects, so every format reports bad input the same way."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from .errors import FormatError, unreadable_file

_MISSING = object()
MAX_SIZE = 2**63 - 1  # what a size in any format may be: the solvers' and torch's int64
# What the figures planned with may be, so that every one planned from them stays exact and
# finite (QA: a graph of 2**60-byte tensors, whose plain peak passed the planner's 2**62 "no
# budget", and one of 1e308-second nodes, whose step time was inf and TDI NaN, were internal
# errors or plans of Infinity and NaN; a profile's op of 1e300 s planned a step of 2e300 s):
# - bytes: a graph's fixed_bytes, every node's out_bytes and workspace_bytes, and the optimizer
#   state of groups homed on a page tier (plain training holds it in RAM), all together at most
#   2**53 (8 PiB, hundreds of times the RAM of the largest servers), and a size given at the
#   command line (a budget, a memory limit) and each size in a profile (Reader.size: its RAM,
#   runtime memory, a tier's capacity, an op's sizes) as well. Any step's memory is a part of
#   that total, and below 2**53 every byte count is exact as a float too, as the planner takes
#   them through floats (a fractional budget, CP-SAT's scaling, the reports): at 2**60 a node,
#   --budget 100% came out 46 bytes under the plain peak and CP-SAT's plan failed its replay.
MAX_GRAPH_BYTES = 2**53
# - seconds and joules: a graph node's time_s and energy_j (and a tier's per-node page costs), a
#   profile's op times and energies, latencies, watts and joules a byte, at most 1e18 (32
#   billion years; published graphs' unit-free costs, Checkmate's FLOP counts, reach 1e12). A
#   schedule runs a node at most once per stage, so even a million-node graph's step sums to
#   under 1e30, far inside a float's range (1.8e308), and what is derived from it (TDI, energy
#   at a profile's watts, the bounds) stays finite. A node's attrs.flops too, at most 1e18
#   (a board's roofline divides it by the board's rate, at least 1 a second: costs.py).
MAX_FIGURE = 1e18
# - rates, bytes (or FLOPs) a second: from 1 (a page of MAX_GRAPH_BYTES then takes under 1e16
#   s; QA: a flash of 1e-300 B/s was "cannot convert float infinity to integer", naming no
#   file) to 2**60 (faster than any flash, link or memory bus).
MIN_RATE, MAX_RATE = 1, 2**60


def check_figure(source: str, where: str, value: float | None, unit: str,
                 per: str = "") -> None:
    """A figure of seconds or joules (`unit`, e.g. "s", "J", "W") within MAX_FIGURE: else a
    FormatError naming the file and the field. `per`: what it is a figure of (" a node")."""
    if value is not None and value > MAX_FIGURE:
        raise FormatError(source, where, f"at most 1e18 {unit}{per} (so that a step's sums "
                          "stay finite numbers)", value)


def _an_object(source: str) -> str:
    """What a nested object is called in the source's own format (a device config, a fleet
    manifest: TOML; QA: `connection = "local"` was told "expected a JSON object")."""
    return "a table ([name] or name = {...})" if str(source).endswith(".toml") \
        else "a JSON object"


def _finite(value: int | float) -> bool:
    """A JSON integer too large for a float (10**400) is not a finite number either
    (math.isfinite raised OverflowError, an error that named no file)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


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
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not _finite(value):
            raise self.error(key, "a finite number", value)
        if minimum is not None and value < minimum:
            raise self.error(key, f"a number >= {minimum:g}", value)
        return value

    def figure(self, key: str, unit: str, default: Any = _MISSING) -> Any:
        """A number >= 0 of seconds or joules (`unit`) within MAX_FIGURE (check_figure)."""
        value = self.number(key, default)
        check_figure(self.source, self._path(key), value, unit)
        return value

    def rate(self, key: str, what: str = "a bandwidth", unit: str = "bytes/s") -> Any:
        """A rate (`unit`) from MIN_RATE to MAX_RATE."""
        value = self.number(key)
        if not MIN_RATE <= value <= MAX_RATE:
            raise self.error(key, f"{what} from {MIN_RATE} to 2**60 {unit}", value)
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

    def size(self, key: str, default: Any = _MISSING) -> Any:
        """A size in bytes (an integer >= 0) within MAX_GRAPH_BYTES, the bound of a graph's
        sizes (see there why): a profile's RAM, runtime memory, a tier's capacity and an op's
        sizes (QA: capped only at 2**63-1 each, a workspace of 2**60 was taken and planned)."""
        value = self.integer(key, default)
        if value is not default and value > MAX_GRAPH_BYTES:
            raise self.error(key, "a size of at most 2**53 bytes (8 PiB, far more than any "
                                  "board's memory; byte counts stay exact as floats below it)",
                             value)
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
    except ValueError:  # an integer longer than Python converts (sys.get_int_max_str_digits,
        # 4300 digits): bad input too (QA: exit 70 in every command that reads JSON)
        raise _too_many_digits(text, str(path)) from None


def _too_many_digits(text: str, source: str) -> FormatError:
    """The error for a JSON integer longer than Python converts, naming its field: the text is
    parsed again with such integers kept as their digit counts (nothing else raises so)."""
    limit = _int_digits_limit()

    class Digits(int):
        pass

    def parse_int(digits: str) -> int:
        return Digits(len(digits.lstrip("-"))) if len(digits) > limit else int(digits)

    try:
        where, digits = _first(json.loads(text, parse_int=parse_int), Digits) or ("<json>", 0)
    except (ValueError, RecursionError):
        where, digits = "<json>", 0
    got = f"an integer of {digits} digits" if digits else "an integer too long to read"
    return FormatError(source, where, f"a number of at most {limit} digits (sizes fit in 64 "
                       "bits: 19 digits)", got)


def _int_digits_limit() -> int:
    import sys
    return getattr(sys, "get_int_max_str_digits", lambda: 4300)() or 4300


def _first(value: Any, wanted: type, where: str = "") -> tuple[str, Any] | None:
    """The dotted path and value of the first item in `value` of type `wanted` (or failing
    `wanted` where it is a predicate), depth first in the document's order; None if none."""
    if isinstance(value, dict):
        items = ((f"{where}.{key}" if where else str(key), item) for key, item in value.items())
    elif isinstance(value, (list, tuple)):
        items = ((f"{where}[{i}]", item) for i, item in enumerate(value))
    else:
        hit = wanted(value) if not isinstance(wanted, type) else isinstance(value, wanted)
        return (where or "<root>", value) if hit else None
    for path, item in items:
        found = _first(item, wanted, path)
        if found is not None:
            return found
    return None


class NotFiniteJSON(ValueError):
    """A value that strict JSON cannot hold (NaN, inf) reached a writer of a format that its
    reader refuses it in: a defect upstream (inputs are bounded on load so that figures stay
    finite), said with the file and the field rather than as json's bare ValueError."""


def dump_json(obj: Any, path: str | Path, finite: bool = False) -> None:
    """`finite`: refuse NaN and infinities (NotFiniteJSON, nothing written), as every format
    the tool reads back strictly must (graph, plan, profile: Reader.number refuses them; QA:
    a plan with Infinity and NaN was written, then refused by simulate). Reports keep them:
    a run's diverged loss is a measurement, written as JSON's common Infinity/NaN and read
    back by run --resume."""
    try:
        text = json.dumps(obj, indent=1, allow_nan=not finite)
    except ValueError:
        if not finite:
            raise
        where, value = _first(obj, lambda v: isinstance(v, float) and not math.isfinite(v)) \
            or ("<json>", None)
        raise NotFiniteJSON(f"cannot write {path}: field '{where}' is {value}, not a finite "
                            "number, which JSON cannot hold (nothing was written)") from None
    dump_text(text + "\n", path)


def dump_text(text: str, path: str | Path) -> None:
    dump_bytes(text.encode("utf-8"), path)


def dump_bytes(data: bytes, path: str | Path) -> None:
    """Write atomically: a temporary file beside the target (same filesystem) renamed over it,
    so a crash mid-write never leaves a truncated file; on failure the temporary file goes.
    A symbolic link is written through, as a shell's > does: the file it names is replaced
    and the link stays (the rename once replaced the link itself).
    An OSError names `path` as given (a failed write or close names no file: QA, a full disk
    said only 'No space left on device'; mkstemp's names the temporary file), and one of a
    full disk (ENOSPC, EDQUOT) or of a file too large (EFBIG) carries `needed_bytes`, the size
    it could not write."""
    import errno
    import os
    import tempfile
    shown = str(path)
    path = Path(path)
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    tmp = None
    try:
        handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # as an ordinary write would make it, not mkstemp's 0600
        os.replace(tmp, path)
    except BaseException as exc:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        if not isinstance(exc, OSError) or exc.errno is None:
            raise
        named = OSError(exc.errno, exc.strerror or str(exc), shown)  # FileNotFoundError, ...
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            named.needed_bytes = len(data)
        raise named from exc
