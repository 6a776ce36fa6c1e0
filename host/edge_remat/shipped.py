"""The data files the host ships: the modelled board profiles (`profiles/`) and the device
configs (`device_configs/`). A wheel carries them inside the package (`edge_remat/shipped/`,
copied there at build time by setup.py); a checkout or an editable install reads the
repository's own folders, where they are kept and edited."""

from __future__ import annotations

from pathlib import Path

NAMES = ("profiles", "device_configs")
_PACKAGE = Path(__file__).resolve().parent


def shipped_dir(name: str) -> Path:
    """The folder of shipped `name` files (one of NAMES): the wheel's, else the repository's."""
    if name not in NAMES:
        raise ValueError(f"no shipped data named {name!r} (known: {', '.join(NAMES)})")
    installed = _PACKAGE / "shipped" / name
    return installed if installed.is_dir() else _PACKAGE.parents[1] / name
