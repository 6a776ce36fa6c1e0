"""Sizes at the agent's command line (4KiB, 64MiB, 1e6); bytes inside. Standard library only."""

from __future__ import annotations

import re

SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10,
              "mib": 2**20, "gib": 2**30}


def parse_size(text: str) -> int:
    """'64MiB' -> 67108864; '4096' -> 4096; '1.5GB' -> 1500000000."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", str(text))
    unit = match.group(2).lower() if match else ""
    if not match or unit not in SIZE_UNITS:
        raise ValueError(f"cannot read size {text!r}: use bytes or a unit "
                         "(B, kB, MB, GB, KiB, MiB, GiB), e.g. 64MiB")
    return int(float(match.group(1)) * SIZE_UNITS[unit])


def format_size(nbytes: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(nbytes) >= size:
            value = nbytes / size
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.2f} {unit}"
    return f"{int(nbytes)} B"
