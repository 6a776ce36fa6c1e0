"""The weight page store: a model's frozen weights in one file on flash, laid out for paging.

    [16 B magic][8 B header length][JSON header][padding] [tensor 0][pad] [tensor 1][pad] ...

Every tensor starts at a multiple of 4 KiB and its region is padded to one, so that it can be
read with O_DIRECT: the bytes go from the device straight into the tensor's own memory (an
anonymous mapping, page-aligned, as O_DIRECT wants), never through the page cache, which a
memory cgroup would charge to the board. Reading through an 8 MiB staging buffer and copying
out, as this did before, took 1.4-1.7x as long for tensors of 64 and 256 MiB on this machine
(at 1-8 MiB it was faster: a fresh mapping's page faults; benchmarks/weight_reads.py). The
header indexes each tensor (offset, bytes, dtype, shape) and names what the file was made from
(`key`: model, seed, and the shapes), so a file made for another model is never read.

The file is written once, tensor by tensor (each made, written, synced, dropped from the cache
and freed before the next), to a temporary name renamed at the end: writing a 4.4 GB model
needs the RAM of its largest tensor, and a write cut short leaves no file that looks whole.
Where O_DIRECT is refused (tmpfs, some network filesystems) reads fall back to pread with the
range dropped from the cache after each read.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import threading
import time
from typing import Callable, Iterable

import torch

from ..pages.codec import memory_view
from ..pages.direct import ALIGN, MAX_READ, padded, pwrite_all, read_aligned

MAGIC = b"EDGE-REMAT-WTS1\n"
FORMAT = "edge-remat/weights"


class WeightStoreError(RuntimeError):
    """A weight file that is missing, damaged, made for another model, or cannot be written."""


def layout_key(model: str, seed: int, tensors: Iterable[tuple[str, tuple, torch.dtype]]) -> str:
    digest = hashlib.sha256(json.dumps([model, seed, [[n, list(s), str(d)] for n, s, d in
                                                       tensors]]).encode()).hexdigest()
    return digest[:16]


def write_weight_file(path: str, key: str, tensors: list[tuple[str, tuple, torch.dtype]],
                      make: Callable[[str, tuple, torch.dtype], torch.Tensor]) -> dict:
    """Write the tensors `make(name, shape, dtype)` gives, one at a time; returns figures
    (bytes, seconds, write bandwidth)."""
    index, offset = {}, 0
    for name, shape, dtype in tensors:
        nbytes = int(torch.Size(shape).numel()) * torch.empty((), dtype=dtype).element_size()
        index[name] = {"offset": offset, "nbytes": nbytes, "dtype": str(dtype).split(".")[-1],
                       "shape": list(shape)}
        offset += padded(nbytes)
    # offsets count from the first aligned byte after the header
    header = json.dumps({"format": FORMAT, "version": 1, "alignment": ALIGN, "key": key,
                         "tensors": index}).encode()
    data_start = padded(len(MAGIC) + 8 + len(header))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    temporary = f"{path}.{os.getpid()}.partial"
    start, written = time.perf_counter(), 0
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.pwrite(fd, MAGIC + struct.pack("<Q", len(header)) + header, 0)
            for name, shape, dtype in tensors:
                row = index[name]
                value = make(name, tuple(shape), dtype).contiguous()
                data = memory_view(value)
                pwrite_all(fd, data, data_start + row["offset"])
                os.fdatasync(fd)  # on the device, then out of the cache (RAM the board lacks)
                _drop(fd, data_start + row["offset"], row["nbytes"])
                written += row["nbytes"]
                del value, data
            os.ftruncate(fd, data_start + offset)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, path)
    except OSError as error:
        _remove_quietly(temporary)
        raise WeightStoreError(f"cannot write the weight file {path}: "
                               f"{error.strerror or error}") from error
    except BaseException:
        _remove_quietly(temporary)
        raise
    seconds = time.perf_counter() - start
    return {"path": path, "bytes": written, "seconds": seconds,
            "write_bytes_per_s": written / seconds if seconds > 0 else None}


def ensure_weight_file(folder: str, model: str, seed: int,
                       tensors: list[tuple[str, tuple, torch.dtype]],
                       make: Callable[[str, tuple, torch.dtype], torch.Tensor]
                       ) -> tuple[str, dict | None]:
    """The weight file for this model, seed and layout in `folder`, written if it is not there
    (None as figures when it was); a damaged or foreign file under that name is rewritten."""
    key = layout_key(model, seed, tensors)
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in model)[-60:]
    path = os.path.join(folder, f"{safe}-{key}.weights")
    if os.path.exists(path):
        try:
            WeightFile(path, expect_key=key).close()
            return path, None
        except WeightStoreError:
            pass
    return path, write_weight_file(path, key, tensors, make)


def ensure_model_weights(module, model: str, seed: int, folder: str) -> tuple[str, dict | None]:
    """The weight file of a meta-built model's frozen parameters (all of them, by name) in
    `folder`, written there once from the model's own per-tensor init (deferred.py)."""
    from .deferred import weight_maker
    tensors = sorted((name, tuple(p.shape), p.dtype) for name, p in module.named_parameters()
                     if not p.requires_grad)
    return ensure_weight_file(folder, model, seed, tensors, weight_maker(module))


class WeightFile:
    """Read-only access to a weight file: `read(name)` returns a new tensor holding the
    stored value. Thread-safe (positional reads); counts bytes and seconds read."""

    def __init__(self, path: str, expect_key: str | None = None, direct: bool = True):
        self.path = path
        try:
            with open(path, "rb") as handle:
                head = handle.read(len(MAGIC) + 8)
                if len(head) < len(MAGIC) + 8 or head[:len(MAGIC)] != MAGIC:
                    raise WeightStoreError(f"{path} is not an edge-remat weight file")
                (length,) = struct.unpack("<Q", head[len(MAGIC):])
                header = json.loads(handle.read(length))
        except (OSError, ValueError) as error:
            raise WeightStoreError(f"cannot read the weight file {path}: {error}") from error
        if expect_key is not None and header.get("key") != expect_key:
            raise WeightStoreError(f"{path} was made for another model or seed (key "
                                   f"{header.get('key')}, expected {expect_key})")
        self.key, self.index = header["key"], header["tensors"]
        data_start = padded(len(MAGIC) + 8 + length)
        for row in self.index.values():
            row["offset"] += data_start
        size = os.path.getsize(path)
        if any(row["offset"] + padded(row["nbytes"]) > size for row in self.index.values()):
            raise WeightStoreError(f"{path} is shorter than its index says: written only in "
                                   "part; remove it and run again to rewrite it")
        self.direct = False
        self.fd = os.open(path, os.O_RDONLY)
        if direct and hasattr(os, "O_DIRECT"):
            try:
                fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
                os.close(self.fd)
                self.fd, self.direct = fd, True
            except OSError:  # the filesystem refuses O_DIRECT: pread + drop the cache
                pass
        self._lock = threading.Lock()
        self.bytes_read = 0
        self.read_s = 0.0
        self.reads = 0

    def names(self) -> list[str]:
        return list(self.index)

    def nbytes(self, name: str) -> int:
        return self.index[name]["nbytes"]

    def read(self, name: str) -> torch.Tensor:
        """A new tensor of exactly the stored bytes (its storage is what the plan counts)."""
        row = self.index[name]
        nbytes = row["nbytes"]
        start = time.perf_counter()
        try:
            if self.direct:
                value = read_aligned(self.fd, row["offset"], nbytes)
            else:
                value = torch.empty(nbytes, dtype=torch.uint8)
                _read_all(self.fd, memory_view(value), row["offset"])
                _drop(self.fd, row["offset"], nbytes)
        except (OSError, EOFError) as error:
            raise WeightStoreError(f"reading {name} from {self.path} failed: "
                                   f"{getattr(error, 'strerror', None) or error}") from error
        value = value.view(getattr(torch, row["dtype"])).view(row["shape"])
        seconds = time.perf_counter() - start
        with self._lock:
            self.bytes_read += nbytes
            self.read_s += seconds
            self.reads += 1
        return value

    def figures(self) -> dict:
        return {"path": self.path, "direct_io": self.direct, "reads": self.reads,
                "bytes_read": self.bytes_read, "read_s": round(self.read_s, 6),
                "read_bytes_per_s": self.bytes_read / self.read_s if self.read_s else None}

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _read_all(fd: int, view: memoryview, offset: int) -> None:
    done, total = 0, len(view)
    while done < total:
        n = os.preadv(fd, [view[done:done + MAX_READ]], offset + done)
        if n <= 0:
            raise OSError(0, f"unexpected end of file at byte {offset + done}")
        done += n


def _drop(fd: int, offset: int, length: int) -> None:
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass
