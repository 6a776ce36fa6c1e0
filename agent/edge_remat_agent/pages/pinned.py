"""The `host` tier for tensors on a CUDA device: each page a page-locked (pinned) host tensor
that the device's copy engines fill and read back.

Nothing crosses a medium, so a page is not encoded or checksummed (the flash and the link
need that; process memory does not). Copies run on the calling thread's current stream, and
each call waits for its own copy only: called from the executor's IO thread under a side
stream, a page moves while compute runs on the main stream. Pinned blocks come from PyTorch's
caching host allocator, which reuses them across steps (pinning memory costs a system call).

On a discrete GPU this frees device memory into the host's RAM. On a Jetson the GPU and the
CPU share one DRAM: paging to `host` frees the device allocator's blocks, not the board's
memory; the flash tier is what frees memory there.
"""

from __future__ import annotations

from typing import Hashable

import torch

from .base import IndexedPageStore
from .codec import is_dense, placed
from .errors import PageMissing

WHERE = "pinned host memory"


class PinnedStore(IndexedPageStore):
    tier = "host"
    fills_device_tensors = True

    def __init__(self, capacity_bytes: int | None = None):
        if capacity_bytes is not None and capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be >= 0, got {capacity_bytes}")
        self.capacity_bytes = capacity_bytes
        self._init_index()  # key -> (the pinned tensor, the device it came from)

    @staticmethod
    def _entry_bytes(entry: tuple[torch.Tensor, torch.device]) -> int:
        return _nbytes(entry[0])

    def put(self, key: Hashable, tensor: torch.Tensor) -> int:
        value = tensor.detach().resolve_conj().resolve_neg()
        if value.numel() == 0 or not is_dense(tuple(value.shape), value.stride()):
            value = value.contiguous()
        nbytes = value.numel() * value.element_size()
        with self._lock:
            replaced = self._replaced_bytes(key)
            self._check_capacity(key, nbytes, replaced, WHERE)
        page = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype,
                                   pin_memory=value.device.type == "cuda")
        page.copy_(value, non_blocking=True)
        _wait_for_copy(value.device)
        with self._lock:
            self._index[key] = (page, value.device)
            self._held += nbytes - replaced
        return nbytes

    def get(self, key: Hashable) -> torch.Tensor:
        """The page on its device, in the tensor a `codec.reading_into` caller gives for it
        when that one is laid out as the page and on the page's device."""
        with self._lock:
            try:
                page, device = self._index[key]
            except KeyError:
                raise PageMissing(key, WHERE) from None
        into = placed(_nbytes(page), page.dtype, tuple(page.shape), page.stride(), key)
        if into is None or into.device != device:
            into = torch.empty_strided(page.shape, page.stride(), dtype=page.dtype,
                                       device=device)
        into.copy_(page, non_blocking=True)
        _wait_for_copy(device)
        return into

    def discard(self, key: Hashable) -> bool:
        with self._lock:
            return self._forget(key) is not None

    def clear(self) -> None:
        with self._lock:
            self._forget_all()


def _nbytes(page: torch.Tensor) -> int:
    return page.numel() * page.element_size()


def _wait_for_copy(device: torch.device) -> None:
    """The current stream's queue done: this call's copy, not other streams' work."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()
