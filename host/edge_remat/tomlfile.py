"""Reading the host's TOML files (device configs, fleet manifests): one clear error each for a
file that cannot be read and for text that is not TOML."""

from __future__ import annotations

from pathlib import Path

from edge_remat_agent.formats import FormatError
from edge_remat_agent.formats.errors import unreadable_file


def read_toml(path: Path, what: str) -> dict:
    """The table in `path`; `what` names the file in the error ("device config")."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except OSError as exc:
        raise unreadable_file(path, exc, what) from None
    except tomllib.TOMLDecodeError as exc:
        raise _not_toml(path, str(exc)) from None
    except UnicodeDecodeError as exc:  # TOML is UTF-8 (QA: a Latin-1 file was exit 70)
        raise FormatError(str(path), "<toml>", "UTF-8 text (TOML files are UTF-8)",
                          f"byte 0x{exc.object[exc.start]:02x} at offset {exc.start}") from None


def _not_toml(path: Path, message: str) -> FormatError:
    """tomllib's error with its place as the field, as JSON's are: in the value it was cut
    short past 60 characters, the line and column lost (QA: "... (at line ...")."""
    import re
    place = re.search(r"\s*\(at line (\d+), column (\d+)\)$", message)
    if place is None:
        return FormatError(str(path), "<toml>", "valid TOML", message)
    return FormatError(str(path), f"<toml line {place[1]} col {place[2]}>", "valid TOML",
                       message[:place.start()])
