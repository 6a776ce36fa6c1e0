"""The `flash` tier: pages as files in the board's page directory, checksummed, cleaned up.

Each store works in its own fresh subdirectory of the page directory (two runs, or two stores,
never touch each other's files) and removes it on close, on `with` exit (exception or not),
and, as a last resort, when the store is garbage collected or the interpreter exits.
"""

from __future__ import annotations

import errno
import itertools
import os
import re
import shutil
import tempfile
import threading
import weakref
from typing import Hashable

import torch

from .base import PageStore
from .codec import EncodedPage, encode, read_from
from .errors import PageCorrupted, PageMissing, PageStoreError, PageStoreFull

DISK_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
FULL_REMEDY = ("free space on that filesystem, point --page-dir at a larger one, or plan with a "
               "smaller flash capacity")


class FlashStore(PageStore):
    tier = "flash"

    def __init__(self, page_dir: str | os.PathLike, capacity_bytes: int | None = None, *,
                 fsync: bool = False, drop_cache: bool = False):
        """`fsync`: each page is on the device before put returns (what the profiler times).

        `drop_cache`: after writing (and fsync) and after reading a page, tell the kernel to
        drop its cached copy. The page cache is RAM, the very thing paging frees, and inside a
        memory cgroup it is charged to the run; it also makes reads come from the device, so
        timings are the flash's, not RAM's.
        """
        if capacity_bytes is not None and capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be >= 0, got {capacity_bytes}")
        self.page_dir = os.path.abspath(page_dir)
        self.capacity_bytes = capacity_bytes
        self.fsync = fsync
        self.drop_cache = drop_cache
        try:
            os.makedirs(self.page_dir, exist_ok=True)
            self.directory = tempfile.mkdtemp(prefix="edge-remat-pages-", dir=self.page_dir)
        except OSError as error:
            raise PageStoreError(f"cannot create a page directory under {self.page_dir}: "
                                 f"{error.strerror or error}") from error
        self._finalizer = weakref.finalize(self, shutil.rmtree, self.directory, True)
        self._pages: dict[Hashable, tuple[str, int]] = {}  # key -> (file, bytes)
        self._held = 0
        self._serial = itertools.count()
        self._lock = threading.Lock()  # guards the index; file I/O runs outside it
        self._closed = False

    @property
    def bytes_held(self) -> int:
        return self._held

    def __contains__(self, key: Hashable) -> bool:
        return key in self._pages

    def keys(self) -> list[Hashable]:
        with self._lock:
            return list(self._pages)

    def path_of(self, key: Hashable) -> str:
        try:
            return self._pages[key][0]
        except KeyError:
            raise PageMissing(key, self.directory) from None

    def free_bytes(self) -> int | None:
        try:
            stats = os.statvfs(self.page_dir)
        except OSError:
            return None
        return stats.f_bavail * stats.f_frsize

    def put(self, key: Hashable, tensor: torch.Tensor) -> int:
        if self._closed:
            raise PageStoreError(f"the page store in {self.directory} is closed")
        page = encode(tensor)
        needed = page.total_bytes
        with self._lock:
            replaced = self._pages.get(key, (None, 0))[1]
            held_after = self._held - replaced + needed
            if self.capacity_bytes is not None and held_after > self.capacity_bytes:
                raise PageStoreFull(key, self.page_dir, needed, free_bytes=self.free_bytes(),
                                    capacity_bytes=self.capacity_bytes, held_bytes=self._held,
                                    cause="over the store's capacity", remedy=FULL_REMEDY)
            self._held += needed  # reserved now, so a concurrent put sees it
            path = os.path.join(self.directory, f"{next(self._serial):06d}-{_file_safe(key)}.page")
        try:
            self._write(key, path, page)
        except BaseException:
            with self._lock:
                self._held -= needed
            raise
        with self._lock:
            old = self._pages.pop(key, None)
            self._pages[key] = (path, needed)
            if old is not None:
                self._held -= old[1]
        if old is not None:
            _unlink_quietly(old[0])
        return needed

    def _write(self, key: Hashable, path: str, page: EncodedPage) -> None:
        # Written under a temporary name and renamed: a page file is whole or absent.
        partial = path + ".partial"
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
            fd = os.open(partial, flags, 0o600)
            try:
                _write_all(fd, page.header)
                _write_all(fd, page.payload)
                if self.fsync:
                    os.fsync(fd)
                if self.drop_cache:
                    # Dirty pages cannot be dropped; without fsync this only starts writeback.
                    _drop_cached_pages(fd)
            finally:
                os.close(fd)  # can report ENOSPC too (delayed allocation, NFS)
            os.replace(partial, path)
        except BaseException as error:
            _unlink_quietly(partial)
            if isinstance(error, OSError) and error.errno in DISK_FULL_ERRNOS:
                raise PageStoreFull(key, self.page_dir, page.total_bytes,
                                    free_bytes=self.free_bytes(), capacity_bytes=self.capacity_bytes,
                                    held_bytes=self._held - page.total_bytes,
                                    cause=os.strerror(error.errno), remedy=FULL_REMEDY) from error
            raise

    def get(self, key: Hashable) -> torch.Tensor:
        with self._lock:
            path = self.path_of(key)
        try:
            with open(path, "rb", buffering=0) as stream:  # unbuffered: readinto the tensor itself
                tensor = read_from(stream, key, path)
                if self.drop_cache:
                    _drop_cached_pages(stream.fileno())
        except FileNotFoundError:
            raise PageCorrupted(key, path, "the page file has been removed") from None
        return tensor

    def discard(self, key: Hashable) -> bool:
        with self._lock:
            entry = self._pages.pop(key, None)
            if entry is None:
                return False
            self._held -= entry[1]
        _unlink_quietly(entry[0])
        return True

    def clear(self) -> None:
        with self._lock:
            self._pages.clear()
            self._held = 0
        # Every file in our own directory, so a stray partial page goes too.
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return
        for name in names:
            _unlink_quietly(os.path.join(self.directory, name))

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.clear()
            self._finalizer()  # removes the directory

    def __repr__(self) -> str:
        return (f"FlashStore({self.directory!r}, pages={len(self._pages)}, "
                f"bytes_held={self._held}, capacity_bytes={self.capacity_bytes})")


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data).cast("B")
    while view.nbytes:
        written = os.write(fd, view)
        view = view[written:]


def _drop_cached_pages(fd: int) -> None:
    if hasattr(os, "posix_fadvise"):  # Linux and most Unixes; not macOS or Windows
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _file_safe(key: Hashable) -> str:
    """The key, readable in a file name; the serial number in front keeps names unique."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", str(key))[:48] or "_"
