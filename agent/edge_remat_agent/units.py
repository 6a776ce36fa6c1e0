"""Sizes at the command line (4KiB, 64MiB, 600M, 1e6); bytes inside. Standard library only.
The one size table of both packages: the host's budgets and rates read sizes with it too."""

from __future__ import annotations

import re

# Case does not matter; k, M, G, T are the decimal units (600M = 600 MB).
SIZE_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9,
              "gb": 10**9, "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30,
              "tib": 2**40}
KNOWN_UNITS = "B, kB, MB, GB, TB, KiB, MiB, GiB, TiB"


def split_quantity(text: str) -> tuple[float, str] | None:
    """'64 MiB' -> (64.0, 'mib'); '80%' -> (80.0, '%'); None when it is no number and unit.
    Underscores between digits are allowed (1_000_000)."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z%]*)\s*",
                         str(text).replace("_", ""))
    return (float(match.group(1)), match.group(2).lower()) if match else None


def parse_size(text: str) -> int:
    """'64MiB' -> 67108864; '4096' -> 4096; '1.5GB' or '1.5G' -> 1500000000."""
    quantity = split_quantity(text)
    if quantity is None or quantity[1] not in SIZE_UNITS:
        raise ValueError(f"cannot read size {text!r}: use bytes or a unit "
                         f"({KNOWN_UNITS}), e.g. 64MiB")
    return int(quantity[0] * SIZE_UNITS[quantity[1]])


def counted(count, noun: str) -> str:
    """'1 step', '5 steps', '1 page-out': a count and its noun, plural unless the count is 1."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def format_size(nbytes: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(nbytes) >= size:
            value = nbytes / size
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.2f} {unit}"
    return f"{int(nbytes)} B"
