"""The ops the arena executor runs as traced rather than through their `.out` variant
(executor/arena.OUT_VARIANT_ALLOCATES): each one's `.out` still allocates its whole result on
the CPU allocator (ATen's functional call, then a copy into `out`), so writing it "in place"
would hold the result twice; and an op that does write in place allocates nothing."""

from __future__ import annotations

import pytest
import torch

from edge_remat_agent.executor.arena import OUT_VARIANT_ALLOCATES
from edge_remat_agent.profiler.allocations import AllocatorPeak

aten = torch.ops.aten
x = torch.randn(4, 8, 16, 16)
w = torch.randn(8, 8, 3, 3)
conv = ([1, 1], [1, 1], [1, 1], False, [0, 0], 1)
stats = (torch.ones(8), torch.zeros(8), torch.ones(8), x.mean((0, 2, 3)), torch.ones(8))
tokens = torch.randint(0, 100, (4, 16))
rows = torch.randn(64, 32)
ln = aten.native_layer_norm.default(rows, [32], torch.ones(32), torch.zeros(32), 1e-5)

# op -> (its arguments, its results' shapes; None: a result it does not make)
CALLS = {
    "convolution": ((x, w, None, *conv), [x.shape]),
    "convolution_backward": ((x, x, w, [8], *conv, [True, True, True]),
                             [x.shape, w.shape, (8,)]),
    "native_batch_norm_backward": ((x, x, *stats, True, 1e-5, [True, True, True]),
                                   [x.shape, (8,), (8,)]),
    "relu": ((x,), [x.shape]),
    "clone": ((x,), [x.shape]),
    "embedding_dense_backward": ((torch.randn(4, 16, 32), tokens, 100, -1, False),
                                 [(100, 32)]),
    "native_layer_norm": ((rows, [32], torch.ones(32), torch.zeros(32), 1e-5),
                          [rows.shape, (64, 1), (64, 1)]),
    "native_layer_norm_backward": ((rows, rows, [32], ln[1], ln[2], torch.ones(32),
                                    torch.zeros(32), [True, True, True]),
                                   [rows.shape, (32,), (32,)]),
}


def allocated_by_out_variant(name: str) -> tuple[int, int]:
    """(the CPU allocator's peak while the op's .out variant runs, its results' bytes)."""
    args, shapes = CALLS[name]
    packet = getattr(aten, name)
    overload = next(getattr(packet, o) for o in packet.overloads() if "out" in o)
    outs = [a.name for a in overload._schema.arguments if a.is_out]
    buffers = [torch.empty(shape) for shape in shapes]
    overload(*args, **dict(zip(outs, buffers)))  # warm-up (oneDNN primitive creation)
    with AllocatorPeak() as meter:
        overload(*args, **dict(zip(outs, buffers)))
    assert meter.measured
    return meter.peak_bytes, sum(b.numel() * b.element_size() for b in buffers)


@pytest.mark.parametrize("name", sorted(CALLS))
def test_each_listed_out_variant_allocates_its_result(name):
    assert getattr(aten, name).default in OUT_VARIANT_ALLOCATES
    peak, results = allocated_by_out_variant(name)
    # At least its largest result (the small ones may be computed in place).
    largest = max(torch.Size(s).numel() for s in CALLS[name][1]) * 4
    assert peak >= largest, (name, peak, results)


def test_an_out_variant_that_writes_in_place_allocates_nothing():
    out = torch.empty_like(x)
    aten.add.out(x, x, out=out)
    with AllocatorPeak() as meter:
        aten.add.out(x, x, out=out)
    assert meter.measured and meter.peak_bytes == 0
    assert aten.add.Tensor not in OUT_VARIANT_ALLOCATES
