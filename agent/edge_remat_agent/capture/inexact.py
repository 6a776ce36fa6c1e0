"""Ops whose eager backward a captured graph cannot repeat bit for bit: refused at capture.

Eager `prod`'s backward branches on the input's values (ATen's prod_backward): no zero in
the input, `grad * (result / input)`; otherwise the zero-safe formula from exclusive cumulative
products. Traced on fake tensors it always takes the zero-safe one, so where eager's input holds
no zero the gradients differ in the last bits (1e-7 to 2e-4 here). A prod that is trained
through is therefore refused; one outside the gradient's path (no backward op shares its
seq_nr) is exact and stays.
"""

from __future__ import annotations

import torch
from torch import fx

from .errors import CaptureError

_PROD = {torch.ops.aten.prod.default, torch.ops.aten.prod.dim_int}


def refuse_value_dependent_backwards(model: str, graph: fx.Graph, scope_key: str) -> None:
    backward_seq = {n.meta.get("seq_nr") for n in graph.nodes
                    if n.meta.get("partitioner_tag") == "is_backward"}
    for node in graph.nodes:
        if node.op != "call_function" or node.target not in _PROD \
                or node.meta.get("partitioner_tag") == "is_backward" \
                or node.meta.get("seq_nr") not in backward_seq:
            continue
        scope = (node.meta.get("custom") or {}).get(scope_key)
        raise CaptureError(model, "torch.prod is trained through: eager's backward picks its "
                           "formula by whether the input holds a zero, a branch on values a "
                           "captured graph cannot take, so gradients would differ from "
                           "eager's: write the product as torch.cumprod(x, dim).select(dim, -1)",
                           op=str(node.target), module=scope)
