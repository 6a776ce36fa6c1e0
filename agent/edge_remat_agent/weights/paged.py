"""Frozen parameters served from the weight file, the next group read ahead while one computes.

A plan loads parameter groups (its param nodes) in the same order every step. `PagedWeights`
is told that order (`groups`: the parameter names of each param-node compute, in schedule
order) and, each time a group is asked for, starts reading the group after it in a background
thread: the read of layer k+1 overlaps the compute of layer k. At most `ahead` groups are read
ahead, so what prefetch adds to RAM is bounded by the largest `ahead` groups (the report says
how large). A load the order did not foresee is read at once, in the caller's thread.

Figures: bytes read, the time reads took in the reader thread, and the time the step waited
for them (`wait_s`): the share of reading hidden behind compute is 1 - wait_s / read_s.
"""

from __future__ import annotations

import concurrent.futures
import time

import torch

from .store import WeightFile


class PagedWeights:
    def __init__(self, file: WeightFile, groups: list[list[str]] | None = None, ahead: int = 1):
        self.file = file
        self.names = set(file.names())
        self.groups = [[n for n in group if n in self.names] for group in (groups or [])]
        self.groups = [g for g in self.groups if g]
        self.ahead = max(0, ahead) if self.groups else 0
        self._pool = concurrent.futures.ThreadPoolExecutor(1, "edge-remat-weights") \
            if self.ahead else None
        self._pending: dict[str, concurrent.futures.Future] = {}
        self._cursor = 0  # the group expected next
        self.wait_s = 0.0
        self.sync_reads = 0
        self.largest_ahead_bytes = 0

    def load(self, name: str) -> torch.Tensor:
        if self.ahead:
            self._advance(name)
        future = self._pending.pop(name, None)
        if future is None:
            self.sync_reads += 1
            start = time.perf_counter()
            value = self.file.read(name)
            self.wait_s += time.perf_counter() - start
            return value
        start = time.perf_counter()
        value = future.result()
        self.wait_s += time.perf_counter() - start
        return value

    def _advance(self, name: str) -> None:
        """When `name` opens the group expected next, read ahead the groups after it."""
        n = len(self.groups)
        for step in range(n):  # find the group this load belongs to, from the cursor on
            index = (self._cursor + step) % n
            if self.groups[index][0] == name:
                break
        else:
            return
        self._cursor = (index + 1) % n
        ahead_bytes = 0
        for k in range(1, self.ahead + 1):
            for other in self.groups[(index + k) % n]:
                if other not in self._pending:
                    self._pending[other] = self._pool.submit(self.file.read, other)
                ahead_bytes += self.file.nbytes(other)
        self.largest_ahead_bytes = max(self.largest_ahead_bytes, ahead_bytes)

    def figures(self) -> dict:
        figures = self.file.figures()
        read_s = figures["read_s"]
        figures.update(prefetch_groups=self.ahead, wait_s=round(self.wait_s, 6),
                       sync_reads=self.sync_reads,
                       hidden_share=(max(0.0, 1.0 - self.wait_s / read_s) if read_s else None),
                       largest_ahead_bytes=self.largest_ahead_bytes)
        return figures

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        self._pending.clear()
        self.file.close()
