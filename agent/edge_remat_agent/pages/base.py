"""The interface the executor pages through: `page_out n tier` is put, `page_in n tier` is get."""

from __future__ import annotations

import abc
import threading
from typing import Any, Hashable, Iterator

import torch

from .codec import EncodedPage, encode
from .errors import PageStoreFull


class PageStore(abc.ABC):
    """Holds tensors out of RAM, keyed by node id, for one training step at a time.

    put(key, tensor)  store a copy (replacing any page already under `key`); returns the
                      bytes it occupies in the store
    get(key)          the tensor back: same dtype, shape and values, detached, on the device
                      it came from; the page stays until discarded (it may be paged in twice)
    put_many(items)   put each (key, tensor), all or none, any page it replaces kept on
                      failure; a store that can writes them at once (flash: one file)
    get_many(keys)    get each, in order; a store that can reads them at once
    discard(key)      forget a page; True if there was one
    clear()           forget every page (end of step)
    pop(key)          get, then discard
    close()           clear and release the store's resources; also on `with` exit
    """

    tier: str = "abstract"  # the plan's tier name: "flash" or "host"
    capacity_bytes: int | None = None  # None: bounded only by the medium
    # get() fills a tensor on the page's device that codec.reading_into gives (else only
    # tensors in host memory are filled in place: the bytes pass through the host)
    fills_device_tensors: bool = False

    @abc.abstractmethod
    def put(self, key: Hashable, tensor: torch.Tensor) -> int: ...

    @abc.abstractmethod
    def get(self, key: Hashable) -> torch.Tensor: ...

    @abc.abstractmethod
    def discard(self, key: Hashable) -> bool: ...

    @abc.abstractmethod
    def keys(self) -> list[Hashable]: ...

    @property
    @abc.abstractmethod
    def bytes_held(self) -> int: ...

    def put_many(self, items: list[tuple[Hashable, torch.Tensor]]) -> int:
        total, written = 0, []
        try:
            for key, tensor in items:
                total += self.put(key, tensor)
                written.append(key)
        except BaseException:
            for key in written:  # none stays (a key it replaced is gone too)
                self.discard(key)
            raise
        return total

    def get_many(self, keys: list[Hashable]) -> list[torch.Tensor]:
        return [self.get(key) for key in keys]

    def clear(self) -> None:
        for key in self.keys():
            self.discard(key)

    def pop(self, key: Hashable) -> torch.Tensor:
        tensor = self.get(key)
        self.discard(key)
        return tensor

    def close(self) -> None:
        self.clear()

    def __contains__(self, key: Hashable) -> bool:
        return key in self.keys()

    def __len__(self) -> int:
        return len(self.keys())

    def __iter__(self) -> Iterator[Hashable]:
        return iter(self.keys())

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()


class IndexedPageStore(PageStore):
    """A store that keeps its own index (key -> what it needs to find the page) and the bytes
    it holds, both guarded by one lock."""

    @staticmethod
    @abc.abstractmethod
    def _entry_bytes(entry: Any) -> int:
        """The bytes the page an index entry stands for occupies in the store."""

    def put_many(self, items: list[tuple[Hashable, torch.Tensor]]) -> int:
        # Page by page (the in-memory stores, whose index entries are the pages themselves):
        # the entries of the keys it replaces are put back if a later page fails. Flash and
        # the link write a group at once and have their own.
        with self._lock:
            before = {key: self._index[key] for key, _ in items if key in self._index}
        try:
            return super().put_many(items)
        except BaseException:
            with self._lock:
                for key, entry in before.items():
                    self._forget(key)
                    self._index[key] = entry
                    self._held += self._entry_bytes(entry)
            raise

    def _init_index(self) -> None:
        self._index: dict[Hashable, Any] = {}
        self._held = 0
        self._lock = threading.Lock()

    @property
    def bytes_held(self) -> int:
        return self._held

    def __contains__(self, key: Hashable) -> bool:
        return key in self._index

    def keys(self) -> list[Hashable]:
        with self._lock:
            return list(self._index)

    # Under the lock, for the stores' own methods:

    def _check_capacity(self, key: Hashable, nbytes: int, replaced: int, where: str) -> None:
        """PageStoreFull if holding `nbytes` under `key`, in place of `replaced` bytes, would
        pass the capacity of a host-tier store (in memory, or over the link)."""
        if self.capacity_bytes is not None and \
                self._held - replaced + nbytes > self.capacity_bytes:
            raise PageStoreFull(key, where, nbytes, capacity_bytes=self.capacity_bytes,
                                held_bytes=self._held, cause="over the store's capacity",
                                remedy="give the host tier more capacity, or plan with less")

    def _replaced_bytes(self, key: Hashable) -> int:
        """The bytes a page put under `key` would replace (0 where there is none)."""
        entry = self._index.get(key)
        return 0 if entry is None else self._entry_bytes(entry)

    def _forget(self, key: Hashable) -> Any:
        """Key's entry out of the index and its bytes out of the count; None where there is
        none."""
        entry = self._index.pop(key, None)
        if entry is not None:
            self._held -= self._entry_bytes(entry)
        return entry

    def _forget_all(self) -> None:
        self._index.clear()
        self._held = 0


def encoded_items(items: list[tuple[Hashable, torch.Tensor]]
                  ) -> tuple[list[Hashable], list[EncodedPage], int, Hashable]:
    """What a store's put_many writes: (the keys, their encoded pages, the pages' bytes in all,
    what an error names: the key, or the tuple of keys). ValueError where a key repeats."""
    keys = [key for key, _ in items]
    if len(set(keys)) != len(keys):
        raise ValueError(f"put_many takes distinct keys: {keys!r}")
    pages = [encode(tensor) for _, tensor in items]
    return keys, pages, sum(page.total_bytes for page in pages), \
        keys[0] if len(keys) == 1 else tuple(keys)
