"""Writing a page to flash and reading it back leave no copy of it in the page cache, not even
for a moment.

Inside a memory cgroup the cache is charged to the board: a buffered read held the whole page
there until the store dropped it after the read, so a page was paid twice at its page-in (and a
buffered write until fsync and the drop, at its page-out). A
Llama's 31 MiB embedding homed on flash, loaded at the plan's peak, put the kernel's peak
31 MiB above the plan (hf:llama, --allocator arena, memory.stat sampled during the run).
"""

from __future__ import annotations

import ctypes
import mmap
import os

import pytest
import torch

from edge_remat_agent.pages import flash as flash_module
from edge_remat_agent.pages.direct import open_direct
from edge_remat_agent.pages.flash import FlashStore

MiB = 2**20


def cached_bytes(path: str) -> int:
    """Bytes of `path` the page cache holds now (mincore over a mapping, which reads nothing)."""
    size = os.path.getsize(path)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    with open(path, "rb") as file:
        # private and writable only so that ctypes can take its address; never touched
        mapping = mmap.mmap(file.fileno(), size, flags=mmap.MAP_PRIVATE,
                            prot=mmap.PROT_READ | mmap.PROT_WRITE)
    try:
        start = ctypes.c_char.from_buffer(mapping)
        resident = ctypes.create_string_buffer(-(-size // mmap.PAGESIZE))
        status = libc.mincore(ctypes.addressof(start), size, resident)
        del start  # the mapping cannot close while a ctypes view holds it
        if status != 0:
            pytest.skip(f"mincore: {os.strerror(ctypes.get_errno())}")
        return sum(byte & 1 for byte in resident.raw) * mmap.PAGESIZE
    finally:
        mapping.close()


def test_a_page_read_back_never_sits_in_the_page_cache(tmp_path, monkeypatch):
    page = torch.arange(8 * MiB, dtype=torch.float32)  # 32 MiB
    with FlashStore(tmp_path, fsync=True, drop_cache=True) as store:
        store.put("embedding", page)
        path = store.path_of("embedding")
        if cached_bytes(path) > MiB:
            pytest.skip("this filesystem keeps written pages cached (tmpfs?): nothing to drop")
        # What the cache holds the moment the page's bytes are all read, before any drop.
        at_end_of_read = []
        read_from = flash_module.read_from

        def read_and_look(stream, key, where, **options):
            tensor = read_from(stream, key, where, **options)
            at_end_of_read.append(cached_bytes(path))
            return tensor

        monkeypatch.setattr(flash_module, "read_from", read_and_look)
        assert torch.equal(store.get("embedding"), page)
        assert at_end_of_read[0] <= MiB, \
            f"{at_end_of_read[0] / MiB:.1f} MiB of the page cached while it was read"
        assert cached_bytes(path) == 0


def test_a_page_written_never_sits_in_the_page_cache(tmp_path, monkeypatch):
    (tmp_path / "probe").write_bytes(b"x")
    reader = open_direct(str(tmp_path / "probe"))
    if reader is None:
        pytest.skip("this filesystem refuses O_DIRECT (tmpfs?): writes stay buffered")
    reader.close()
    page = torch.arange(8 * MiB, dtype=torch.float32)  # 32 MiB
    # What the cache holds of the file once it is written and synced, before the drop.
    before_drop = []
    drop = flash_module._drop_cached_pages

    def look_and_drop(fd):
        before_drop.append(cached_bytes(os.readlink(f"/proc/self/fd/{fd}")))
        drop(fd)

    monkeypatch.setattr(flash_module, "_drop_cached_pages", look_and_drop)
    with FlashStore(tmp_path, fsync=True, drop_cache=True) as store:
        for step in range(2):  # a new file, then the same file written over in place
            store.put("activation", page + step)
            assert before_drop[-1] <= MiB, \
                f"{before_drop[-1] / MiB:.1f} MiB of the page cached after writing it"
            store.clear()
        store.put("activation", page[:1000])  # a shorter page over a longer one's file
        assert torch.equal(store.get("activation"), page[:1000])
