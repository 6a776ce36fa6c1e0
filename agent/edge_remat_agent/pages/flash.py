"""The `flash` tier: pages as files in the board's page directory, checksummed, cleaned up.

Each store works in its own fresh subdirectory of the page directory (two runs, or two stores,
never touch each other's files) and removes it on close, on `with` exit (exception or not),
and, as a last resort, when the store is garbage collected or the interpreter exits.

A killed run (SIGKILL, the OOM killer, a power cut) removes nothing, so each store holds an
exclusive flock on its own subdirectory for its whole life, and a new store opened on the same
page directory removes the subdirectories named like a store's (`edge-remat-pages-PID-XXXXXXXX`)
whose lock it can take: the kernel drops a process's locks when it dies, so their owner is gone.
A live store's directory (another run, or another store in this process) stays locked and is
left alone, and so is everything not named like a store's directory: the rest is the user's.
Where the filesystem cannot lock (e.g. some network mounts), nothing is locked and nothing
removed. `FlashStore.cleaned_stale` says what was removed.

`put_many` writes several pages into one file, back to back, with one fsync, and `get_many`
reads them with one open and sequential reads (small pages share the device's reads): a
parameter group and its optimizer state, written by each update and read by each param node,
had a file per tensor, and its open, write, fsync and close each time (BERT-mini's layer, 16
tensors, 3.2 MB: 29.2 ms written and read back one by one, 8.9 ms as one page, here). A file
stays while any of its pages does.

Files are kept for rewriting: a discarded or cleared page's file becomes a spare, and the next
page of about its size (the same 4 KiB blocks) is written over it in place. A training step
pages the same tensors every step, so from the second step on no page file is created,
allocated or unlinked: on this machine's ext4 a 5 MiB page took 4.1 ms rewritten in place
against 7.5 ms created (write, fsync, rename) plus 3.5 ms to unlink it at the step's end, on
the step's critical path. A spare no put has taken since the clear before last is removed at
the next clear; spares count against the capacity (dropped first when a page needs the room)
and go when a write finds the disk full.
"""

from __future__ import annotations

import errno
import itertools
import os
import re
import shutil
import weakref
from typing import Hashable

import torch

from .base import IndexedPageStore, encoded_items
from .codec import laid_out, read_from
from .direct import open_direct, write_direct
from .errors import (FLASH_CAPACITY_REMEDY, PageCorrupted, PageMissing, PageStoreError,
                     PageStoreFull, full_remedy, page_dir_not_made)
from .folder import make_page_dir

try:
    import fcntl
except ImportError:  # not POSIX (Windows): nothing is locked, so nothing is ever removed
    fcntl = None

DISK_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
FULL_REMEDY = full_remedy(FLASH_CAPACITY_REMEDY)
STORE_PREFIX = "edge-remat-pages-"
# The only names a store gives its directory, and the only ones a store ever removes.
STORE_DIRECTORY = re.compile(re.escape(STORE_PREFIX) + r"[0-9]+-[0-9a-f]{8}")

# The one remedy for a page folder the board cannot use (the run job checks it before the
# capture too, with these words).

class FlashStore(IndexedPageStore):
    tier = "flash"

    def __init__(self, page_dir: str | os.PathLike, capacity_bytes: int | None = None, *,
                 fsync: bool = False, drop_cache: bool = False):
        """`fsync`: each page is on the device before put returns (what the profiler times).

        `drop_cache`: write and read pages around the page cache (O_DIRECT, direct.py; where
        the filesystem refuses it, drop the cached copy after writing, with fsync, and after
        reading). The page cache is RAM, the very thing paging frees,
        and inside a memory cgroup it is charged to the run; it also makes reads come from the
        device, so timings are the flash's, not RAM's.

        Opening a store removes what dead runs left in `page_dir` (see the module's docstring);
        `cleaned_stale` is {"directories", "files", "bytes"} removed.
        """
        if capacity_bytes is not None and capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be >= 0, got {capacity_bytes}")
        self.page_dir = os.path.abspath(page_dir)
        self.capacity_bytes = capacity_bytes
        self.fsync = fsync
        self.drop_cache = drop_cache
        try:
            make_page_dir(self.page_dir)
            self.directory, lock = _new_locked_directory(self.page_dir)
        except OSError as error:
            raise PageStoreError(page_dir_not_made(self.page_dir, error)) from error
        self._finalizer = weakref.finalize(self, _remove_directory, self.directory, lock,
                                           os.getpid())
        self.cleaned_stale = remove_dead_stores(self.page_dir, keep=self.directory)
        self._init_index()  # key -> (file, bytes, offset); the lock guards it, I/O runs outside
        self._files: dict[str, list[int]] = {}  # file -> [its bytes, pages still in it]
        self._spares: dict[int, list[tuple[str, int]]] = {}  # 4 KiB blocks -> (file, bytes)
        self._spare_bytes = 0
        self._aged: set[str] = set()  # spares already spare at the last clear
        self._serial = itertools.count()
        self._closed = False

    @staticmethod
    def _entry_bytes(entry: tuple[str, int, int]) -> int:
        return entry[1]

    def path_of(self, key: Hashable) -> str:
        try:
            return self._index[key][0]
        except KeyError:
            raise PageMissing(key, self.directory) from None

    def free_bytes(self) -> int | None:
        try:
            stats = os.statvfs(self.page_dir)
        except OSError:
            return None
        return stats.f_bavail * stats.f_frsize

    def put(self, key: Hashable, tensor: torch.Tensor) -> int:
        return self.put_many([(key, tensor)])

    def put_many(self, items: list[tuple[Hashable, torch.Tensor]]) -> int:
        """Every (key, tensor) as a page, all in one file written at once: whole or absent.
        Returns the bytes they occupy."""
        if self._closed:
            raise PageStoreError(f"the page store in {self.directory} is closed")
        keys, pages, needed, named = encoded_items(items)
        if not keys:
            return 0
        if self.drop_cache:  # read with O_DIRECT: large payloads on block boundaries
            pages = laid_out(pages)
            needed = sum(page.total_bytes for page in pages)
        with self._lock:
            replaced = sum(self._replaced_bytes(key) for key in keys)
            held_after = self._held - replaced + needed
            if self.capacity_bytes is not None and held_after > self.capacity_bytes:
                raise PageStoreFull(named, self.page_dir, needed, free_bytes=self.free_bytes(),
                                    capacity_bytes=self.capacity_bytes, held_bytes=self._held,
                                    cause="over the store's capacity", remedy=FULL_REMEDY)
            self._held += needed  # reserved now, so a concurrent put sees it
            spare = self._take_spare(needed)
            if self.capacity_bytes is not None:  # the disk the spares hold is the store's too
                while self._spares and held_after + self._spare_bytes > self.capacity_bytes:
                    self._drop_spare()
            path = spare[0] if spare else os.path.join(
                self.directory, f"{next(self._serial):06d}-{_file_safe(keys[0])}.page")
        parts = [part for page in pages for part in (page.header, page.payload)]
        try:
            try:
                self._write(named, path, parts, needed, spare)
            except PageStoreFull:
                if spare or not self._spares:
                    raise
                with self._lock:  # the disk is full: the spares' room first, then once more
                    while self._spares:
                        self._drop_spare()
                self._write(named, path, parts, needed, None)
        except BaseException:
            with self._lock:
                self._held -= needed
            raise
        emptied = []
        with self._lock:
            offset = 0
            for key, page in zip(keys, pages):
                old = self._index.pop(key, None)
                self._index[key] = (path, page.total_bytes, offset)
                offset += page.total_bytes
                if old is not None:
                    self._held -= old[1]
                    if self._page_gone(old[0]):
                        emptied.append(old[0])
            self._files[path] = [needed, len(keys)]
        for old_path in emptied:
            _unlink_quietly(old_path)
        return needed

    def _page_gone(self, path: str) -> bool:
        """One page of `path` forgotten (with the lock held): True when it was the file's last,
        and the file is no longer counted."""
        entry = self._files[path]
        entry[1] -= 1
        if entry[1]:
            return False
        del self._files[path]
        return True

    def _write(self, key: Hashable, path: str, parts: list, total: int,
               spare: tuple[str, int] | None) -> None:
        # A new file is written under a temporary name and renamed: whole or absent. A spare
        # is written over in place (no reader knows it until put indexes it); one a write
        # fails in is removed, not kept.
        partial = path if spare else path + ".partial"
        try:
            flags = os.O_WRONLY | getattr(os, "O_CLOEXEC", 0)
            fd = os.open(partial, flags if spare else flags | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                # Around the page cache where it is to be dropped (see get).
                if not (self.drop_cache and write_direct(fd, parts, total)):
                    for part in parts:
                        _write_all(fd, part)
                    if spare and spare[1] != total:
                        os.ftruncate(fd, total)  # a header longer or shorter
                if self.fsync:
                    _sync_data(fd)  # the data and the file's size: nothing else is needed back
                if self.drop_cache:
                    # Dirty pages cannot be dropped; without fsync this only starts writeback.
                    _drop_cached_pages(fd)
            finally:
                os.close(fd)  # can report ENOSPC too (delayed allocation, NFS)
            if not spare:
                os.replace(partial, path)
        except BaseException as error:
            _unlink_quietly(partial)
            if isinstance(error, OSError) and error.errno in DISK_FULL_ERRNOS:
                raise PageStoreFull(key, self.page_dir, total,
                                    free_bytes=self.free_bytes(), capacity_bytes=self.capacity_bytes,
                                    held_bytes=self._held - total,
                                    cause=os.strerror(error.errno), remedy=FULL_REMEDY) from error
            raise

    def get(self, key: Hashable) -> torch.Tensor:
        return self.get_many([key])[0]

    def get_many(self, keys: list[Hashable]) -> list[torch.Tensor]:
        """The pages under `keys`, in that order; each file opened once, its pages read in
        the order they lie in it."""
        with self._lock:
            entries = [(self.path_of(key),) + self._index[key][1:] for key in keys]
            file_bytes = {path: self._files[path][0] for path, _, _ in entries}
        by_file: dict[str, list[int]] = {}
        for k, (path, _, _) in enumerate(entries):
            by_file.setdefault(path, []).append(k)
        out: list[torch.Tensor | None] = [None] * len(keys)
        for path, wanted in by_file.items():
            wanted.sort(key=lambda k: entries[k][2])
            try:
                # Read around the page cache where it is to be dropped: a buffered read held
                # the whole page in the cache, charged to the run, until the drop after it.
                direct = open_direct(path) if self.drop_cache else None
                with direct or open(path, "rb", buffering=0) as stream:  # readinto the tensor
                    for k in wanted:
                        _, nbytes, offset = entries[k]
                        if stream.tell() != offset:
                            stream.seek(offset)
                        out[k] = read_from(stream, keys[k], path,
                                           to_end=offset + nbytes == file_bytes[path])
                    if self.drop_cache and direct is None:
                        _drop_cached_pages(stream.fileno())
            except FileNotFoundError:
                raise PageCorrupted(keys[wanted[0]], path,
                                    "the page file has been removed") from None
        return out

    def discard(self, key: Hashable) -> bool:
        with self._lock:
            entry = self._forget(key)
            if entry is None:
                return False
            bundle_bytes = self._files[entry[0]][0]
            if self._page_gone(entry[0]):  # its file's last page: the file is a spare
                self._keep_spare(entry[0], bundle_bytes)
        return True

    def clear(self) -> None:
        """Every page forgotten; their files kept as spares, and the spares no put took since
        the clear before removed."""
        with self._lock:
            for spares in list(self._spares.values()):
                for path, _ in [spare for spare in spares if spare[0] in self._aged]:
                    self._drop_spare(path)
            for path, (nbytes, _) in self._files.items():
                self._keep_spare(path, nbytes)
            self._files.clear()
            self._forget_all()
            self._aged = {path for spares in self._spares.values() for path, _ in spares}
            kept = {os.path.basename(path) for path in self._aged}
        # Any other file in our own directory (a stray partial page) goes.
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return
        for name in names:
            if name not in kept:
                _unlink_quietly(os.path.join(self.directory, name))

    @property
    def spare_bytes(self) -> int:
        """Bytes of the files kept for rewriting, which hold no page."""
        return self._spare_bytes

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.clear()
            with self._lock:
                while self._spares:
                    self._drop_spare()
            self._finalizer()  # removes the directory

    # The spares (with the lock held).

    def _keep_spare(self, path: str, nbytes: int) -> None:
        self._spares.setdefault(_blocks(nbytes), []).append((path, nbytes))
        self._spare_bytes += nbytes

    def _take_spare(self, nbytes: int) -> tuple[str, int] | None:
        spares = self._spares.get(_blocks(nbytes))
        if not spares:
            return None
        spare = spares.pop()
        if not spares:
            del self._spares[_blocks(nbytes)]
        self._spare_bytes -= spare[1]
        self._aged.discard(spare[0])
        return spare

    def _drop_spare(self, path: str | None = None) -> None:
        """Remove spare `path` (None: any one)."""
        for blocks, spares in self._spares.items():
            for k, (spare, nbytes) in enumerate(spares):
                if path is None or spare == path:
                    del spares[k]
                    if not spares:
                        del self._spares[blocks]
                    self._spare_bytes -= nbytes
                    self._aged.discard(spare)
                    _unlink_quietly(spare)
                    return

    def __repr__(self) -> str:
        return (f"FlashStore({self.directory!r}, pages={len(self._index)}, "
                f"bytes_held={self._held}, capacity_bytes={self.capacity_bytes})")


def remove_dead_stores(page_dir: str | os.PathLike, keep: str | None = None) -> dict[str, int]:
    """Remove the store directories in `page_dir` whose owner is dead (their lock can be taken)
    other than `keep`; return {"directories", "files", "bytes"} removed."""
    cleaned = {"directories": 0, "files": 0, "bytes": 0}
    try:
        entries = list(os.scandir(page_dir))
    except OSError:
        return cleaned
    for entry in entries:
        if (entry.path == keep or not STORE_DIRECTORY.fullmatch(entry.name)
                or not entry.is_dir(follow_symlinks=False)):
            continue
        lock = _lock(entry.path, blocking=False)
        if lock is None:
            continue  # alive, or no lock can be had here: not ours to remove
        try:
            files, size = _files_and_bytes(entry.path)
            shutil.rmtree(entry.path, ignore_errors=True)
            if not os.path.lexists(entry.path):
                cleaned["directories"] += 1
                cleaned["files"] += files
                cleaned["bytes"] += size
        finally:
            os.close(lock)
    return cleaned


def _new_locked_directory(page_dir: str) -> tuple[str, int | None]:
    """A fresh store directory and the descriptor that holds its lock (None where this
    filesystem cannot lock)."""
    while True:
        path = os.path.join(page_dir, f"{STORE_PREFIX}{os.getpid()}-{os.urandom(4).hex()}")
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue
        # Another store may take the lock first, in the instant before ours, and remove the
        # directory as a dead run's: it then holds the lock until the directory is gone, so
        # waiting for the lock and checking that the directory is still there is enough.
        lock = _lock(path, blocking=True)
        if lock is None:
            if os.path.isdir(path):
                return path, None  # no locks on this filesystem: run unlocked
            continue
        try:
            if os.path.samestat(os.fstat(lock), os.stat(path)):
                return path, lock
        except FileNotFoundError:
            pass
        os.close(lock)


def _lock(path: str, blocking: bool) -> int | None:
    """A descriptor of directory `path` holding an exclusive flock on it, or None."""
    if fcntl is None:
        return None
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
    except OSError:
        os.close(fd)
        return None
    return fd


def _remove_directory(path: str, lock: int | None, owner_pid: int) -> None:
    """The directory first, then its lock: no other store takes it while files remain. A
    process forked from the owner inherits the finalizer at exit, but not the store."""
    if os.getpid() != owner_pid:
        return
    shutil.rmtree(path, ignore_errors=True)
    if lock is not None:
        os.close(lock)


def _files_and_bytes(path: str) -> tuple[int, int]:
    files = size = 0
    for folder, _, names in os.walk(path):
        for name in names:
            try:
                size += os.lstat(os.path.join(folder, name)).st_size
                files += 1
            except OSError:
                pass
    return files, size


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data).cast("B")
    while view.nbytes:
        written = os.write(fd, view)
        view = view[written:]


def _blocks(nbytes: int) -> int:
    return -(-nbytes // 4096)


_sync_data = getattr(os, "fdatasync", os.fsync)  # fdatasync: Linux and most Unixes


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
