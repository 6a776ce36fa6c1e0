"""The `host` tier kept in memory: in the local case the parent process holds the pages, and
on a real link this is what the host side keeps (it serves put_bytes / get_bytes / drop_bytes).
"""

from __future__ import annotations

from typing import Hashable

import torch

from .base import IndexedPageStore
from .codec import decode, encode
from .errors import PageMissing

WHERE = "host memory"


class MemoryStore(IndexedPageStore):
    tier = "host"

    def __init__(self, capacity_bytes: int | None = None):
        if capacity_bytes is not None and capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be >= 0, got {capacity_bytes}")
        self.capacity_bytes = capacity_bytes
        self._init_index()  # key -> the encoded page

    _entry_bytes = staticmethod(len)  # an entry is the encoded page

    # Pages as opaque bytes (already encoded, checksummed): the host side of a link.

    def put_bytes(self, key: Hashable, data: bytes | bytearray | memoryview) -> int:
        data = bytes(data)
        with self._lock:
            replaced = self._replaced_bytes(key)
            self._check_capacity(key, len(data), replaced, WHERE)
            self._index[key] = data
            self._held += len(data) - replaced
        return len(data)

    def get_bytes(self, key: Hashable) -> bytes:
        with self._lock:
            try:
                return self._index[key]
            except KeyError:
                raise PageMissing(key, WHERE) from None

    def drop_bytes(self, key: Hashable) -> bool:
        with self._lock:
            return self._forget(key) is not None

    # Pages as tensors: the PageStore interface.

    def put(self, key: Hashable, tensor: torch.Tensor) -> int:
        return self.put_bytes(key, encode(tensor).to_bytes())

    def get(self, key: Hashable) -> torch.Tensor:
        return decode(self.get_bytes(key), key, WHERE)

    def discard(self, key: Hashable) -> bool:
        return self.drop_bytes(key)

    def clear(self) -> None:
        with self._lock:
            self._forget_all()
