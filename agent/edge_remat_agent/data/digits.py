"""The handwritten digits kept in this package (digits.csv.gz): real data with no download.

1797 grey 8x8 images of the digits 0-9 (pixels 0..16), the test set of the UCI "Optical
Recognition of Handwritten Digits" data set (E. Alpaydin, C. Kaynak, 1998; CC BY 4.0), as
scikit-learn ships it (`sklearn.datasets.load_digits`). One row per image: 64 pixels in row
order, then the label; lines starting with '#' are comments. It is read from the package, so it
travels inside the agent archive to every board.
"""

from __future__ import annotations

import functools
import gzip
import importlib.resources
from typing import Iterator

FILE = "digits.csv.gz"
SIDE = 8
CLASSES = 10


@functools.lru_cache(maxsize=1)
def _rows() -> tuple[tuple[int, ...], ...]:
    raw = importlib.resources.files(__package__).joinpath(FILE).read_bytes()
    text = gzip.decompress(raw).decode("ascii")
    return tuple(tuple(int(v) for v in line.split(","))
                 for line in text.splitlines() if line and not line.startswith("#"))


def load_digits():
    """(images, labels): float32 [1797, 1, 8, 8] standardised to mean 0 and std 1, int64 [1797]."""
    import torch
    table = torch.tensor(_rows(), dtype=torch.int64)
    images = table[:, :SIDE * SIDE].to(torch.float32).reshape(-1, 1, SIDE, SIDE)
    images = (images - images.mean()) / images.std()
    return images, table[:, SIDE * SIDE].clone()


def digits_batches(batch: int, seed: int = 0) -> Iterator[tuple]:
    """(images [batch,1,8,8], labels [batch]) forever: a fresh shuffle each epoch, every batch
    full (an epoch's remainder starts the next one)."""
    import torch
    images, labels = load_digits()
    generator = torch.Generator().manual_seed(seed)
    pending = torch.empty(0, dtype=torch.int64)
    while True:
        while len(pending) < batch:
            pending = torch.cat([pending, torch.randperm(len(labels), generator=generator)])
        take, pending = pending[:batch], pending[batch:]
        yield images[take], labels[take]
