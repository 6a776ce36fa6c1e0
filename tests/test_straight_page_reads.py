"""Large flash pages read straight from the device into memory of their own: the page file lays
their payload on a block boundary, O_DIRECT reads it with no staging copy, and the CRC32 is
checked on the tensor read (pages/codec.py, pages/direct.py)."""

from __future__ import annotations

import os

import pytest
import torch

from edge_remat_agent.pages import FlashStore, PageCorrupted
from edge_remat_agent.pages.codec import (PREFIX, STRAIGHT_READ_BYTES, decode, parse_header,
                                          parse_prefix, reading_into)
from edge_remat_agent.pages.direct import ALIGN, open_direct

pytestmark = pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="no O_DIRECT here")


@pytest.fixture
def store(tmp_path):
    probe = tmp_path / "probe"
    probe.write_bytes(b"x" * ALIGN)
    reader = open_direct(str(probe))
    if reader is None:
        pytest.skip(f"{tmp_path}'s filesystem refuses O_DIRECT")
    reader.close()
    with FlashStore(tmp_path / "pages", drop_cache=True) as flash:
        yield flash


def big(dtype=torch.float32, extra: int = 3) -> torch.Tensor:
    """A tensor just over the straight-read size, whose bytes end inside a block."""
    size = torch.empty(0, dtype=dtype).element_size()
    return torch.randn(STRAIGHT_READ_BYTES // size + extra).to(dtype)


def pages_in(path: str) -> list[tuple[int, int, bytes]]:
    """(payload offset, payload bytes, the page's bytes) of each page of a page file."""
    data = open(path, "rb").read()
    out, at = [], 0
    while at < len(data):
        header_len, crc = parse_prefix(data[at:at + PREFIX.size], "?", path)
        start = at + PREFIX.size + header_len
        header = parse_header(data[at + PREFIX.size:start], crc, "?", path)
        out.append((start, header.nbytes, data[at:start + header.nbytes]))
        at = start + header.nbytes
    return out


def test_large_pages_lie_on_block_boundaries_and_come_back_in_memory_of_their_own(store):
    values = {"bias": torch.randn(1000), "weight": big(),
              "moment": big(torch.bfloat16, 5).view(-1, 1).expand(-1, 2).contiguous().t(),
              "step": torch.tensor(3.0)}
    store.put_many(list(values.items()))
    laid = pages_in(store.path_of("weight"))
    assert [nbytes for _, nbytes, _ in laid] == [v.numel() * v.element_size()
                                                 for v in values.values()]
    for (start, nbytes, page), (key, value) in zip(laid, values.items()):
        if nbytes >= STRAIGHT_READ_BYTES:
            assert start % ALIGN == 0, key
        assert torch.equal(decode(page, key, "test"), value)  # any store reads the padding
    back = store.get_many(list(values))
    for (key, value), read in zip(values.items(), back):
        assert read.dtype == value.dtype and read.stride() == value.stride(), key
        assert torch.equal(read, value), key
        if read.numel() * read.element_size() >= STRAIGHT_READ_BYTES:
            assert read.untyped_storage().nbytes() == read.numel() * read.element_size()
            assert read.data_ptr() % ALIGN == 0
    back[1].add_(1)  # its own memory: writable, and the page is untouched
    assert torch.equal(store.get("weight"), values["weight"])


def test_a_flipped_byte_deep_in_a_large_page_is_caught(store):
    value = big()
    store.put("x", value)
    path = store.path_of("x")
    (start, nbytes, _), = pages_in(path)
    with open(path, "r+b") as page:
        page.seek(start + nbytes * 3 // 4)
        byte = page.read(1)
        page.seek(start + nbytes * 3 // 4)
        page.write(bytes([byte[0] ^ 0x10]))
    with pytest.raises(PageCorrupted, match="CRC32"):
        store.get("x")


def test_a_large_page_cut_short_is_named_truncated(store):
    store.put("x", big())
    path = store.path_of("x")
    os.truncate(path, os.path.getsize(path) - STRAIGHT_READ_BYTES // 2)
    with pytest.raises(PageCorrupted, match="truncated"):
        store.get("x")


def test_reading_a_page_reads_its_payload_once(store):
    """The staging buffer that read the header holds the payload's first blocks too: they are
    copied, not read from the device again; counted by the kernel's read bytes for this
    process."""
    if not os.path.exists("/proc/self/io"):
        pytest.skip("no /proc/self/io")

    def bytes_read() -> int:
        with open("/proc/self/io") as io:
            return next(int(line.split()[1]) for line in io if line.startswith("rchar"))
    value = big()
    store.put("x", value)
    before = bytes_read()
    assert torch.equal(store.get("x"), value)
    extra = bytes_read() - before - value.numel() * 4
    assert 0 <= extra < 256 * 1024


def test_a_page_placed_by_the_caller_is_read_into_its_place(store):
    value = big()
    store.put("x", value)
    slot = torch.empty_like(value)
    with reading_into(lambda nbytes, dtype, shape, stride, key: slot):
        read = store.get("x")
    assert read.data_ptr() == slot.data_ptr() and torch.equal(read, value)


def test_a_page_read_straight_is_written_back_from_where_it_lies(store, monkeypatch):
    """Its memory is page-aligned and its payload starts on a block boundary: its whole blocks
    go to the device without the staging copy, and the file holds the same bytes."""
    from edge_remat_agent.pages import direct
    value = big()
    store.put("x", value)
    read = store.get("x")
    read.mul_(2)
    writes, real = [], direct.pwrite_all

    def seen(fd, view, offset):
        writes.append((direct._address(view), view.nbytes))
        return real(fd, view, offset)
    monkeypatch.setattr(direct, "pwrite_all", seen)
    store.put("x", read)
    nbytes = read.numel() * read.element_size()
    assert (read.data_ptr(), nbytes - nbytes % ALIGN) in writes
    copy, before = read.clone(), len(writes)
    store.put("copied", copy)  # malloc's memory: through the staging buffer
    assert all(address != copy.data_ptr() for address, _ in writes[before:])
    assert open(store.path_of("x"), "rb").read() == open(store.path_of("copied"), "rb").read()
    assert torch.equal(store.get("x"), value * 2)
