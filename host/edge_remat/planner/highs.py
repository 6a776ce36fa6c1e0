"""highspy, imported without HiGHS's banner.

HiGHS prints a copyright banner from C++ to file descriptor 1 the first time a process makes a
solver, whatever its options say; on `edge-remat plan` it landed among the command's own lines.
The first solver is made here with that descriptor pointed at /dev/null; later ones (PuLP's
included) print nothing. Import highspy through this module only.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager

from ..errors import import_extension

_quiet = False


def quiet_highspy():
    """The highspy module, its banner already spent."""
    global _quiet
    highspy = import_extension("highspy")
    if not _quiet:
        with _descriptor_silenced(1):
            highspy.Highs()
        _quiet = True
    return highspy


@contextmanager
def _descriptor_silenced(fd: int):
    sys.stdout.flush()
    saved = os.dup(fd)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), fd)
        yield
    finally:
        os.dup2(saved, fd)
        os.close(saved)
