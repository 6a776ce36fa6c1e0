"""An independent measurement of what eager PyTorch keeps for backward.

Autograd hands every tensor it saves for backward to `saved_tensors_hooks`; we add up the unique
storages among them, leaving out parameters, buffers and the batch (fixed memory in our graphs).
This is what the captured graph's `saved_bytes` is checked against.
"""

from __future__ import annotations

import torch
from torch import nn


def eager_saved_bytes(module: nn.Module, example_args) -> int:
    """Bytes of the unique storages autograd saves during one eager forward (no backward run)."""
    fixed = {t.untyped_storage().data_ptr() for t in
             [*module.parameters(), *module.buffers(),
              *(a for a in example_args if isinstance(a, torch.Tensor))]}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr and ptr not in fixed:
            saved[ptr] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = module(*example_args)
    del loss  # the saved tensors stayed alive until now, so no address was reused
    return sum(saved.values())


def eager_saved_bytes_as_captured(module: nn.Module, example_args, trace) -> int:
    """What the capture `trace` of `module` should save, measured on eager: eager's saved
    bytes less dropout's float noise, which the capture keeps as a 1-byte mask."""
    return eager_saved_bytes(module, example_args) - dropout_mask_savings(trace)


def dropout_mask_savings(trace) -> int:
    """Bytes eager's saved dropout noise takes beyond the 1-byte masks a capture keeps instead
    (trace._keep_dropout_masks): eager's saved bytes less this is what capture should save."""
    masks = [n for n in trace.compute_nodes if n.target is torch.ops.aten._to_copy.default
             and n.kwargs.get("dtype") is torch.bool
             and n.args[0].target is torch.ops.aten.bernoulli.p]
    return sum(n.meta["val"].numel() * (n.args[0].meta["val"].element_size() - 1) for n in masks)
