"""Tensor <-> page bytes: one small header, the tensor's raw memory, a CRC32 of that memory.

Layout of a page (little endian):

    b"ERPG" | u8 version | 3 reserved | u32 header length | u32 header CRC32 | header | payload

The header (JSON) holds dtype, shape, stride, device, payload length and the payload's CRC32;
it has its own CRC32, so a damaged length or shape is caught before anything is allocated. The
payload is the tensor's memory as it lies: no pickle, no copy when the tensor is dense (a
transposed or channels-last tensor is dense too, and comes back with the same strides). A
tensor with gaps (a slice) is made contiguous first and comes back contiguous, same shape.

FlashStore streams pages to and from files; MemoryStore and LinkStore keep them as bytes. All
three go through this module, so a page written by one can be read by any other.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import math
import threading
import struct
import zlib
from dataclasses import dataclass
from typing import BinaryIO, Hashable

import torch

from .direct import ALIGN
from .errors import PageCorrupted

MAGIC = b"ERPG"
VERSION = 1
PREFIX = struct.Struct("<4sB3xII")  # magic, version, header length, header CRC32
MAX_HEADER_BYTES = 1 << 20  # a header is ~200 bytes; more than this is a corrupted length
# Payloads from this size on are laid on a block boundary of a page file and read straight
# into memory of their own (read_from). Below it malloc hands out memory it already holds, and
# the staging copy cost less than a fresh mapping's page faults; from 32 MiB, glibc's largest
# mmap threshold, its memory is a fresh mapping too (benchmarks/page_reads.py, this machine:
# straight in 0.85x as fast at 16 MiB, 1.19x at 32, 1.23-1.31x at 48-128).
STRAIGHT_READ_BYTES = 32 << 20


@dataclass(frozen=True)
class PageHeader:
    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    device: str
    nbytes: int
    crc32: int

    def to_bytes(self) -> bytes:
        body = json.dumps({"dtype": str(self.dtype).removeprefix("torch."),
                           "shape": list(self.shape), "stride": list(self.stride),
                           "device": self.device, "nbytes": self.nbytes, "crc32": self.crc32},
                          separators=(",", ":")).encode()
        return PREFIX.pack(MAGIC, VERSION, len(body), zlib.crc32(body)) + body


@dataclass
class EncodedPage:
    """A tensor ready to write: `header` bytes, then `payload`, a view of the tensor's memory.

    `payload` points into `owner`'s memory, so keep this object alive while writing it.
    """

    header: bytes
    payload: memoryview
    owner: torch.Tensor

    @property
    def total_bytes(self) -> int:
        return len(self.header) + self.payload.nbytes

    def to_bytes(self) -> bytes:
        return b"".join((self.header, self.payload))

    def aligned_at(self, offset: int) -> "EncodedPage":
        """This page, to be written at `offset` of a file, with its header padded so that the
        payload starts on a block boundary (ALIGN) of the file: JSON allows trailing blanks,
        so any reader of pages reads it as before."""
        prefix, body = self.header[:PREFIX.size], self.header[PREFIX.size:]
        body += b" " * (-(offset + len(self.header)) % ALIGN)
        magic, version, _, _ = PREFIX.unpack(prefix)
        header = PREFIX.pack(magic, version, len(body), zlib.crc32(body)) + body
        return EncodedPage(header, self.payload, self.owner)


def laid_out(pages: list[EncodedPage]) -> list[EncodedPage]:
    """The pages as one file holds them, back to back, each payload of STRAIGHT_READ_BYTES
    or more on a block boundary, where read_from can read it without a staging copy."""
    out, offset = [], 0
    for page in pages:
        if page.payload.nbytes >= STRAIGHT_READ_BYTES:
            page = page.aligned_at(offset)
        out.append(page)
        offset += page.total_bytes
    return out


def memory_view(tensor: torch.Tensor) -> memoryview:
    """A writable byte view of a dense CPU tensor's memory (no numpy: bfloat16 has no dtype there)."""
    nbytes = tensor.numel() * tensor.element_size()
    if nbytes == 0:
        return memoryview(bytearray())
    # Dense means the elements fill [data_ptr, data_ptr + nbytes) exactly, whatever the strides.
    return memoryview((ctypes.c_char * nbytes).from_address(tensor.data_ptr())).cast("B")


def is_dense(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """True when the elements cover one gap-free, overlap-free block of memory."""
    expected = 1
    for step, size in sorted((st, sz) for sz, st in zip(shape, stride) if sz != 1):
        if step != expected:
            return False
        expected *= size
    return True


def encode(tensor: torch.Tensor) -> EncodedPage:
    if tensor.layout != torch.strided or tensor.is_quantized:
        raise TypeError(f"cannot page a {tensor.layout} {tensor.dtype} tensor: only dense "
                        "(strided, unquantized) tensors are paged")
    # A lazily conjugated or negated view holds the other values in memory: apply the bit.
    value = tensor.detach().resolve_conj().resolve_neg()
    device = str(value.device)
    if value.device.type != "cpu":
        value = value.cpu()
    if value.numel() == 0 or not is_dense(tuple(value.shape), value.stride()):
        value = value.contiguous()
    payload = memory_view(value)
    header = PageHeader(value.dtype, tuple(value.shape), tuple(value.stride()), device,
                        payload.nbytes, zlib.crc32(payload))
    return EncodedPage(header.to_bytes(), payload, value)


def parse_prefix(prefix: bytes, key: Hashable, where: str) -> tuple[int, int]:
    """(header length, header CRC32), from the fixed-size start of a page."""
    if len(prefix) < PREFIX.size:
        raise PageCorrupted(key, where, f"truncated: {len(prefix)} bytes, shorter than a page start")
    magic, version, header_len, header_crc = PREFIX.unpack(prefix[:PREFIX.size])
    if magic != MAGIC:
        raise PageCorrupted(key, where, f"not a page (starts with {magic!r}, expected {MAGIC!r})")
    if version != VERSION:
        raise PageCorrupted(key, where, f"page version {version}, this agent reads {VERSION}")
    if header_len > MAX_HEADER_BYTES:
        raise PageCorrupted(key, where, f"header length {header_len} is implausible")
    return header_len, header_crc


def parse_header(body: bytes, crc: int, key: Hashable, where: str) -> PageHeader:
    if zlib.crc32(body) != crc:
        raise PageCorrupted(key, where, f"header CRC32 {zlib.crc32(body):#010x}, "
                            f"{crc:#010x} when written")
    try:
        fields = json.loads(body)
        dtype = getattr(torch, fields["dtype"])
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"{fields['dtype']!r} is not a torch dtype")
        header = PageHeader(dtype, tuple(int(n) for n in fields["shape"]),
                            tuple(int(n) for n in fields["stride"]), str(fields["device"]),
                            int(fields["nbytes"]), int(fields["crc32"]))
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise PageCorrupted(key, where, f"unreadable header: {error}") from None
    if len(header.shape) != len(header.stride):
        raise PageCorrupted(key, where, "header shape and stride differ in length")
    return header


# Where pages are read into: a function (nbytes, dtype, shape, stride, key) -> tensor or None, set
# per thread by the arena executor (executor/arena.py) so that a page lands in its planned slot.
_placement = threading.local()


@contextlib.contextmanager
def reading_into(place):
    previous = getattr(_placement, "place", None)
    _placement.place = place
    try:
        yield
    finally:
        _placement.place = previous


def has_placement() -> bool:
    """True inside `reading_into`: pages go where its function says."""
    return getattr(_placement, "place", None) is not None


def placed(nbytes: int, dtype: torch.dtype, shape: tuple, stride: tuple,
           key: Hashable = None) -> torch.Tensor | None:
    """The tensor the caller of `reading_into` gives for the page under `key`, so laid out,
    or None."""
    place = getattr(_placement, "place", None)
    return place(nbytes, dtype, shape, stride, key) if place else None


def allocate(header: PageHeader, key: Hashable, where: str) -> tuple[torch.Tensor, memoryview]:
    """An empty tensor laid out as the header says, and a view of its memory to fill."""
    check_layout(header, key, where)
    tensor = placed(header.nbytes, header.dtype, header.shape, header.stride, key)
    if tensor is None or tensor.device.type != "cpu":  # the payload is read into host memory
        tensor = torch.empty_strided(header.shape, header.stride, dtype=header.dtype)
    return tensor, memory_view(tensor)


def check_layout(header: PageHeader, key: Hashable, where: str) -> None:
    """PageCorrupted unless the header's layout is dense and holds exactly its payload."""
    if not is_dense(header.shape, header.stride):
        raise PageCorrupted(key, where, f"header stride {header.stride} is not a dense layout")
    holds = math.prod(header.shape) * header.dtype.itemsize
    if holds != header.nbytes:
        raise PageCorrupted(key, where, f"header says {header.nbytes} payload bytes, but "
                            f"{header.dtype} {list(header.shape)} holds {holds}")


def moved_back(tensor: torch.Tensor, header: PageHeader) -> torch.Tensor:
    """The tensor read into host memory, on the device it was paged from."""
    return tensor if header.device == "cpu" else tensor.to(header.device)


def _check_crc(crc: int, header: PageHeader, key: Hashable, where: str) -> None:
    if crc != header.crc32:
        raise PageCorrupted(key, where, f"CRC32 {crc:#010x} of the payload, "
                            f"{header.crc32:#010x} when written")


def decode(data: bytes | bytearray | memoryview, key: Hashable, where: str) -> torch.Tensor:
    """A tensor from a whole page held in memory (a copy: `data` can be dropped afterwards)."""
    data = memoryview(data).cast("B")
    header_len, header_crc = parse_prefix(bytes(data[:PREFIX.size]), key, where)
    start = PREFIX.size + header_len
    header = parse_header(bytes(data[PREFIX.size:start]), header_crc, key, where)
    if data.nbytes != start + header.nbytes:
        raise PageCorrupted(key, where, f"{data.nbytes} bytes, the header promises "
                            f"{start + header.nbytes}")
    tensor, view = allocate(header, key, where)
    view[:] = data[start:]
    _check_crc(zlib.crc32(view), header, key, where)
    return moved_back(tensor, header)


def read_from(stream: BinaryIO, key: Hashable, where: str, to_end: bool = True) -> torch.Tensor:
    """A tensor read from an open page file at its position, straight into the tensor's own
    memory. `to_end`: the page ends the file (else more pages follow it in the file)."""
    header_len, header_crc = parse_prefix(stream.read(PREFIX.size), key, where)
    body = stream.read(header_len)
    if len(body) != header_len:
        raise PageCorrupted(key, where, "truncated inside the header")
    header = parse_header(body, header_crc, key, where)
    tensor = _read_straight(stream, header, key, where)  # its CRC32 checked on the way
    if tensor is None:
        tensor, view = allocate(header, key, where)
        filled = 0
        while filled < view.nbytes:
            count = stream.readinto(view[filled:])
            if not count:
                raise PageCorrupted(key, where,
                                    f"truncated: {filled} of {header.nbytes} payload bytes")
            filled += count
        _check_crc(zlib.crc32(view), header, key, where)
    if to_end and stream.read(1):
        raise PageCorrupted(key, where, "longer than its header says")
    return moved_back(tensor, header)


def _read_straight(stream, header: PageHeader, key: Hashable, where: str) -> torch.Tensor | None:
    """The payload read from the device straight into memory of its own, laid out as the
    header says, where the stream can (an O_DIRECT reader at a block boundary), the payload is
    large and no caller placed it (the arena's slots are read into as before); else None."""
    read = getattr(stream, "read_aligned", None)
    if read is None or header.nbytes < STRAIGHT_READ_BYTES or has_placement():
        return None
    check_layout(header, key, where)
    try:
        flat = read(header.nbytes)
    except EOFError as error:
        raise PageCorrupted(key, where, f"truncated: {error}") from None
    if flat is None:
        return None
    _check_crc(zlib.crc32(memory_view(flat)), header, key, where)
    return flat.view(header.dtype).as_strided(header.shape, header.stride)
