"""The page folder, made where it is missing: only its last component. A page folder on a
drive that is not mounted (`/mnt/ssd/pages`, `/mnt/ssd` absent) made with all its parents
would land on the card the system runs from, filling it with the run's pages in silence."""

from __future__ import annotations

import errno
import os


class PageDirParentMissing(FileNotFoundError):
    """The page folder's parent does not exist; `strerror` says so in words (the callers'
    messages quote an OSError's strerror and add the remedy naming the setting)."""


def make_page_dir(page_dir: "str | os.PathLike[str]") -> None:
    """Create `page_dir` unless it is a folder already; its parent must exist."""
    path = os.path.abspath(page_dir)
    if os.path.isdir(path):
        return
    parent = os.path.dirname(path)
    if not os.path.exists(parent):  # a file there is mkdir's to refuse (Not a directory)
        raise PageDirParentMissing(errno.ENOENT, f"its parent folder {parent} does not exist "
                                   "(a drive not mounted?): mount or create it", path)
    try:
        os.mkdir(path)
    except FileExistsError:
        if not os.path.isdir(path):  # a file there: said as before, by what reads it
            raise
