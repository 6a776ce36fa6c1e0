"""What can go wrong with a page store, in words an operator can act on."""

from __future__ import annotations

import os
from typing import Hashable

# What to do about a page folder that cannot hold pages (flash.py; the run job checks it
# before the capture, executor/jobs.py, without torch).
# Where a user sets the page folder: deploy and run take it from the device config only.
PAGE_DIR_SETTING = "[hardware] page_dir in the device config, or the agent's --page-dir"
PAGE_DIR_REMEDY = (f"point page_dir at a writable folder on the board ({PAGE_DIR_SETTING}); "
                   "`edge-remat devices NAME --check` checks it")


# A plan holds its page-outs, with the parameters homed on flash, to the profile's flash
# capacity (tiers.flash.capacity_bytes: the free space in the page folder when it was measured,
# or the profile job's flash_capacity), which no plan or run option sets (QA: the remedy was
# "plan with a smaller flash capacity"). Here, not in flash.py: the planner says it too, and
# imports no torch.
FLASH_CAPACITY_REMEDY = (
    "plan for the room there is: plans hold their page-outs and the parameters homed on flash "
    "to the profile's flash capacity (tiers.flash.capacity_bytes), the free space when it was "
    "measured, so measure it again (`edge-remat run --reprofile`), or measure a profile for "
    "less (`edge-remat profile --device NAME --param flash_capacity=SIZE --out DIR`) and plan "
    "with it (`--profile DIR/profile.json`)")


def page_dir_not_made(page_dir: str, error: OSError) -> str:
    """A page folder that cannot be made (or a store's folder in it), and what to do."""
    if os.path.exists(page_dir) and not os.path.isdir(page_dir):  # QA: "File exists"
        return f"page_dir {page_dir} is a file, not a folder. Remedy: {PAGE_DIR_REMEDY}"
    return (f"cannot create a page directory under {page_dir}: {error.strerror or error}. "
            f"Remedy: {PAGE_DIR_REMEDY}")


def full_remedy(last_resort: str) -> str:
    """What to do about a page folder too small for the pages."""
    return (f"free space on that filesystem, point page_dir at a larger one ({PAGE_DIR_SETTING}), "
            f"or {last_resort}")


class PageStoreError(RuntimeError):
    """Base class of every page-store failure."""


class PageMissing(PageStoreError, KeyError):
    """`get` of a key that was never put, or was already discarded."""

    def __init__(self, key: Hashable, where: str):
        self.key = key
        self.where = where
        super().__init__(f"no page for node {key!r} in {where}")

    def __str__(self) -> str:  # KeyError would otherwise print the repr of the message
        return self.args[0]


class PageCorrupted(PageStoreError):
    """A page whose bytes do not match what was written: checksum, length or header."""

    def __init__(self, key: Hashable, where: str, reason: str):
        self.key = key
        self.where = where
        self.reason = reason
        super().__init__(f"page of node {key!r} is corrupted ({where}): {reason}")


class PageStoreFull(PageStoreError):
    """A page that does not fit: the store's capacity, or the disk itself (ENOSPC)."""

    def __init__(self, key: Hashable, where: str, needed_bytes: int, *,
                 free_bytes: int | None = None, capacity_bytes: int | None = None,
                 held_bytes: int | None = None, cause: str = "", remedy: str = ""):
        self.key = key
        self.where = where
        self.needed_bytes = needed_bytes
        self.free_bytes = free_bytes
        self.capacity_bytes = capacity_bytes
        self.held_bytes = held_bytes
        parts = [f"cannot page out node {key!r} to {where}: it needs {needed_bytes} bytes"]
        if capacity_bytes is not None:
            parts.append(f"the store holds {held_bytes} of its {capacity_bytes}-byte capacity")
        if free_bytes is not None:
            parts.append(f"{free_bytes} bytes are free on that filesystem")
        message = ", ".join(parts)
        if cause:
            message += f" ({cause})"
        if remedy:
            message += f". Remedy: {remedy}"
        super().__init__(message)
