"""Reading and writing page files around the page cache (O_DIRECT).

A buffered read of a page fills the page cache with the whole file before the store can drop
it, and inside a memory cgroup that cache is charged to the run: for a moment the page is held
twice, once in the tensor and once in the cache. A 31 MiB Llama embedding homed on flash,
loaded at the plan's peak, put the kernel's peak 31 MiB above the plan. Here the bytes go from
the device into a 1 MiB aligned staging buffer (O_DIRECT wants aligned offsets, lengths and
memory) and are copied where the caller asks, so the cache never holds the page. Writes
likewise: a buffered write held the page dirty in the cache until fsync and the drop after it.
"""

from __future__ import annotations

import mmap
import os

ALIGN = 4096
STAGING = 1 << 20  # the most a read holds beyond its tensor; as fast as larger ones here


def open_direct(path: str) -> "DirectReader | None":
    """A reader of `path` that bypasses the page cache, or None where O_DIRECT is refused
    (tmpfs, some network filesystems, a system without it)."""
    if not hasattr(os, "O_DIRECT"):
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    return DirectReader(fd)


def write_direct(fd: int, parts: list, total: int) -> bool:
    """Write `parts` (bytes-like, `total` bytes in all) from offset 0 of `fd` around the page
    cache; False, with nothing written, where the file cannot be switched to O_DIRECT."""
    import fcntl
    if not hasattr(os, "O_DIRECT"):
        return False
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_DIRECT)
    except OSError:
        return False
    staging = mmap.mmap(-1, STAGING)
    try:
        filled = offset = 0
        for part in parts:
            view = memoryview(part).cast("B")
            while view.nbytes:
                take = min(view.nbytes, STAGING - filled)
                staging[filled:filled + take] = view[:take]
                filled, view = filled + take, view[take:]
                if filled == STAGING:
                    offset += _write_block(fd, staging, filled, offset)
                    filled = 0
        if filled:  # the tail, padded to whole blocks, then the file cut to its length
            _write_block(fd, staging, filled, offset)
        os.ftruncate(fd, total)
    finally:
        staging.close()
    return True


def _write_block(fd: int, staging: mmap.mmap, nbytes: int, offset: int) -> int:
    padded = -(-nbytes // ALIGN) * ALIGN
    # Released on the way out, an error too: a view the traceback kept would make closing
    # the staging buffer raise BufferError in place of the error (ENOSPC: a full flash).
    with memoryview(staging) as whole, whole[:padded] as view:
        done = 0
        while done < padded:
            done += os.pwrite(fd, view[done:], offset + done)
    return nbytes


class DirectReader:
    """A read-only stream over an O_DIRECT descriptor: read(n), readinto(view), seek(n),
    close()."""

    def __init__(self, fd: int):
        self.fd = fd
        self.position = 0
        self._staging = mmap.mmap(-1, STAGING)  # anonymous: page-aligned
        self._start = self._end = 0  # file range the staging buffer holds

    def readinto(self, view) -> int:
        view = memoryview(view).cast("B")
        done = 0
        while done < view.nbytes:
            if not self._start <= self.position < self._end and not self._fill():
                break  # end of file
            offset = self.position - self._start
            take = min(view.nbytes - done, self._end - self.position)
            view[done:done + take] = memoryview(self._staging)[offset:offset + take]
            done += take
            self.position += take
        return done

    def tell(self) -> int:
        return self.position

    def seek(self, position: int) -> int:
        """Move to `position`; the staging buffer keeps what it holds (a later page of the
        same blocks is read from it, not from the device again)."""
        self.position = position
        return position

    def read(self, n: int) -> bytes:
        buffer = bytearray(n)
        return bytes(buffer[:self.readinto(buffer)])

    def fileno(self) -> int:
        return self.fd

    def _fill(self) -> bool:
        """Read the aligned block range at the position into the staging buffer."""
        start = self.position - self.position % ALIGN
        count = os.preadv(self.fd, [self._staging], start)
        self._start, self._end = start, start + count
        return self.position < self._end

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
            self._staging.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
