"""Weights too large for the board's RAM: built on the `meta` device, stored once on flash in a
layout made for paging, and read back group by group while the step runs.

deferred   the switch that makes models whose weights are made per tensor build on `meta`
           (capture, the executor), and filling the parameters that must be real
store      the weight page store: one file, 4 KiB-aligned tensors, an index of offsets; written
           once tensor by tensor, read with O_DIRECT so the page cache never holds it
paged      the frozen parameters read from that file by param nodes, the next group read
           ahead in a background thread while the current one computes
"""

from .deferred import deferred_weights, deferring, is_deferred, make_missing
from .store import (WeightFile, WeightStoreError, ensure_model_weights, ensure_weight_file,
                    write_weight_file)

WEIGHTS_FOLDER = "edge-remat-weights"  # in a board's page directory: kept across runs

__all__ = ["deferred_weights", "deferring", "is_deferred", "make_missing", "WeightFile",
           "WeightStoreError", "ensure_model_weights", "ensure_weight_file", "write_weight_file",
           "WEIGHTS_FOLDER"]
