"""The one check of an output name given on a command line, made by the host's commands and
the board's own alike (the host imports it; the agent imports nothing of the host's)."""

from __future__ import annotations

import os


def empty_name(path: "str | os.PathLike[str] | None", option: str, what: str) -> str | None:
    """The error where `path` is given but empty: `-o ''` asks for a file and names none
    (Path('') is the current folder, and an empty option reads as no option where callers test
    its truth); None where it names something or is not given."""
    if path is None or os.fspath(path).strip():
        return None
    return f"{option} is empty: give {what}"
