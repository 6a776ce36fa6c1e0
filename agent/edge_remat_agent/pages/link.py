"""The `host` tier over the agent's link, for any transport that can move bytes by key.

    store = LinkStore(send=link.put_page, fetch=link.get_page, drop=link.drop_page)

send(key, data)  store `data` (bytes) under `key` on the host; may raise PageStoreFull
fetch(key)       the bytes stored under `key`; KeyError if there are none
drop(key)        forget `key` on the host (no error if it is not there)

Keys are the executor's node ids, passed through unchanged. The bytes are whole pages from the
codec (header + payload + CRC32), so the host needs no torch to keep them, and a page damaged
on the way back is caught here. `put_many` sends its pages as one body under a key of its own
and `get_many` fetches it once (a node's outputs: one round trip each way, where a page each
took one per output); the host forgets it when every page in it is discarded.
"""

from __future__ import annotations

import itertools
from typing import Callable, Hashable

import torch

from .base import IndexedPageStore, encoded_items
from .codec import EncodedPage, decode
from .errors import PageMissing
from .service import REQUEST_FLOOR_S, WAIT_S, PageClient

Send = Callable[[Hashable, bytes], object]
Fetch = Callable[[Hashable], bytes | bytearray | memoryview]
Drop = Callable[[Hashable], object]


class LinkStore(IndexedPageStore):
    tier = "host"
    BUNDLE = "edge-remat pages"  # the host keys of pages sent together: (BUNDLE, n)

    def __init__(self, send: Send, fetch: Fetch, drop: Drop, capacity_bytes: int | None = None,
                 where: str = "the host"):
        self.send, self.fetch, self.drop = send, fetch, drop
        self.capacity_bytes = capacity_bytes
        self.where = where
        # key -> (its host key, bytes, offset there): what we believe the host holds for us
        self._init_index()
        self._sent: dict[Hashable, int] = {}  # host key -> pages of ours still in it
        self._serial = itertools.count()

    @staticmethod
    def _entry_bytes(entry: tuple[Hashable, int, int]) -> int:
        return entry[1]

    def put(self, key: Hashable, tensor: torch.Tensor) -> int:
        return self.put_many([(key, tensor)])

    def put_many(self, items: list[tuple[Hashable, torch.Tensor]]) -> int:
        keys, pages, total, named = encoded_items(items)
        if not keys:
            return 0
        host_key = keys[0] if len(keys) == 1 else (self.BUNDLE, next(self._serial))
        with self._lock:
            replaced = sum(self._replaced_bytes(key) for key in keys)
            self._check_capacity(named, total, replaced, self.where)
        self.send(host_key, pages[0].to_bytes() if len(pages) == 1 else _joined(pages, total))
        emptied = []
        with self._lock:
            offset = 0
            for key, page in zip(keys, pages):
                old = self._forget(key)
                if old is not None and self._page_gone(old[0]) and old[0] != host_key:
                    emptied.append(old[0])
                self._index[key] = (host_key, page.total_bytes, offset)
                offset += page.total_bytes
            self._held += total
            self._sent[host_key] = len(keys)
        for old_key in emptied:
            self.drop(old_key)
        return total

    def get(self, key: Hashable) -> torch.Tensor:
        return self.get_many([key])[0]

    def get_many(self, keys: list[Hashable]) -> list[torch.Tensor]:
        with self._lock:
            for key in keys:
                if key not in self._index:
                    raise PageMissing(key, self.where)
            entries = [self._index[key] for key in keys]
        fetched: dict[Hashable, memoryview] = {}
        out = []
        for key, (host_key, nbytes, offset) in zip(keys, entries):
            if host_key not in fetched:
                try:
                    fetched[host_key] = memoryview(self.fetch(host_key)).cast("B")
                except KeyError:
                    raise PageMissing(key, self.where) from None
            out.append(decode(fetched[host_key][offset:offset + nbytes], key, self.where))
        return out

    def discard(self, key: Hashable) -> bool:
        with self._lock:
            entry = self._forget(key)
            if entry is None:
                return False
            emptied = self._page_gone(entry[0])
        if emptied:
            self.drop(entry[0])
        return True

    def _page_gone(self, host_key: Hashable) -> bool:
        """One of our pages under `host_key` forgotten (lock held): True when it was the last."""
        self._sent[host_key] -= 1
        if self._sent[host_key]:
            return False
        del self._sent[host_key]
        return True


def _joined(pages: list[EncodedPage], total: int) -> bytearray:
    """The pages back to back, copied once."""
    body, at = bytearray(total), 0
    for page in pages:
        for part in (page.header, page.payload):
            body[at:at + len(part)] = part
            at += len(part)
    return body


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
                  timeout_s: float = REQUEST_FLOOR_S, wait_s: float = WAIT_S) -> ServiceStore:
    """A `host` store over the page service at HOST:PORT, connected now (so that an unreachable
    service is one clear error before the first step); a request whose link drops later waits
    up to `wait_s` for it to come back (PageClient)."""
    return ServiceStore(PageClient(address, timeout_s, wait_s).connect(), capacity_bytes)
