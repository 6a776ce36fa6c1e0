"""The `host` tier over the agent's link, for any transport that can move bytes by key.

    store = LinkStore(send=link.put_page, fetch=link.get_page, drop=link.drop_page)

send(key, data)  store `data` (bytes) under `key` on the host; may raise PageStoreFull
fetch(key)       the bytes stored under `key`; KeyError if there are none
drop(key)        forget `key` on the host (no error if it is not there)

Keys are the executor's node ids, passed through unchanged. The bytes are whole pages from the
codec (header + payload + CRC32), so the host needs no torch to keep them, and a page damaged
on the way back is caught here.
"""

from __future__ import annotations

from typing import Callable, Hashable

import torch

from .base import IndexedPageStore
from .codec import decode, encode
from .errors import PageMissing
from .service import WAIT_S, PageClient

Send = Callable[[Hashable, bytes], object]
Fetch = Callable[[Hashable], bytes | bytearray | memoryview]
Drop = Callable[[Hashable], object]


class LinkStore(IndexedPageStore):
    tier = "host"

    def __init__(self, send: Send, fetch: Fetch, drop: Drop, capacity_bytes: int | None = None,
                 where: str = "the host"):
        self.send, self.fetch, self.drop = send, fetch, drop
        self.capacity_bytes = capacity_bytes
        self.where = where
        self._init_index()  # key -> bytes: what we believe the host holds for us

    def put(self, key: Hashable, tensor: torch.Tensor) -> int:
        data = encode(tensor).to_bytes()
        with self._lock:
            self._check_capacity(key, len(data), self._index.get(key, 0), self.where)
        self.send(key, data)
        with self._lock:
            self._held += len(data) - self._index.get(key, 0)
            self._index[key] = len(data)
        return len(data)

    def get(self, key: Hashable) -> torch.Tensor:
        with self._lock:
            if key not in self._index:
                raise PageMissing(key, self.where)
        try:
            data = self.fetch(key)
        except KeyError:
            raise PageMissing(key, self.where) from None
        return decode(data, key, self.where)

    def discard(self, key: Hashable) -> bool:
        with self._lock:
            if self._forget(key, int) is None:
                return False
        self.drop(key)
        return True


class ServiceStore(LinkStore):
    """A LinkStore over a PageClient: close() forgets this run's pages and closes the socket."""

    def __init__(self, client: PageClient, capacity_bytes: int | None = None):
        super().__init__(client.send, client.fetch, client.drop, capacity_bytes,
                         where=f"host page service at {client.address}")
        self.client = client

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.client.close()


def connect_store(address: str, capacity_bytes: int | None = None,
                  timeout_s: float = 60.0, wait_s: float = WAIT_S) -> ServiceStore:
    """A `host` store over the page service at HOST:PORT, connected now (so that an unreachable
    service is one clear error before the first step); a request whose link drops later waits
    up to `wait_s` for it to come back (PageClient)."""
    return ServiceStore(PageClient(address, timeout_s, wait_s).connect(), capacity_bytes)
