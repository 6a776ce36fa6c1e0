"""Which captured values share memory: memory is counted per storage, not per tensor.

A view (view, t, transpose, expand, detach, getitem of a view op, ...) costs nothing: it aliases the
storage of its base. We read aliasing from each ATen op's schema (`Tensor(a) self -> Tensor(a)`),
the same annotations functionalization relies on, so there is no list of view ops to maintain.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass

import torch
from torch import fx

# Not annotated as a view in its schema, but returns a tensor on its input's storage.
_ALIASING_WITHOUT_ANNOTATION = {"aten::_unsafe_view"}
# The same for each tensor of the list they return (the C++ GRU splits its gates with these).
_LIST_ALIASING_WITHOUT_ANNOTATION = {"aten::unsafe_split", "aten::unsafe_split_with_sizes",
                                     "aten::unsafe_chunk"}
# Losses whose eager CPU kernel reduces (mean or sum) into the storage of the elementwise loss:
# the scalar it returns keeps that storage, one element per element of the broadcast inputs,
# where the meta kernel gives it its own 4 bytes (mse_loss of 8 values: 32 bytes, not 4).
_REDUCED_IN_THE_ELEMENTWISE_LOSS = {"aten::mse_loss", "aten::smooth_l1_loss",
                                    "aten::soft_margin_loss", "aten::binary_cross_entropy"}

# Ops whose eager CPU kernel allocates one result an element longer than it returns it (the
# result's index): _embedding_bag's offset2bag is made with indices + 1 elements, then resized
# down, its storage kept (12 indices: 104 bytes where the meta kernel gives 96).
_ONE_ELEMENT_LONGER = {"aten::_embedding_bag": 1, "aten::_embedding_bag_forward_only": 1}


@dataclass(frozen=True)
class Storage:
    """The storage behind one captured value: `root` is the value that allocated it."""

    root: str
    nbytes: int


def storages(gm: fx.GraphModule) -> dict[str, Storage]:
    """Map every tensor-valued node (placeholders included) to the storage it lives in."""
    out: dict[str, Storage] = {}
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            continue
        base = aliased_input(node)
        if base is not None and base.name in out:
            out[node.name] = out[base.name]
        else:
            out[node.name] = Storage(node.name, _eager_storage_nbytes(node, val))
    return out


def _eager_storage_nbytes(node: fx.Node, val: torch.Tensor) -> int:
    """The bytes of the storage eager's kernel gives `node`'s value (see _ONE_ELEMENT_LONGER
    and _REDUCED_IN_THE_ELEMENTWISE_LOSS), which the traced value's own may understate."""
    nbytes = storage_nbytes(val)
    if node.target is operator.getitem and val.numel() \
            and isinstance(node.args[0].target, torch._ops.OpOverload) \
            and _ONE_ELEMENT_LONGER.get(node.args[0].target._schema.name) == node.args[1]:
        return max(nbytes, (val.numel() + 1) * val.element_size())
    if not isinstance(node.target, torch._ops.OpOverload) \
            or node.target._schema.name not in _REDUCED_IN_THE_ELEMENTWISE_LOSS:
        return nbytes
    shapes = [arg.meta["val"].shape for arg in node.all_input_nodes
              if isinstance(arg.meta.get("val"), torch.Tensor)]
    elements = math.prod(torch.broadcast_shapes(*shapes))
    return max(nbytes, elements * val.element_size())


def unpicked_result_nbytes(node: fx.Node) -> int:
    """Bytes of the results of an op with several that no getitem picks (an LSTM backward's
    unused state gradients): eager makes them with the rest and frees them at once, so they
    are held while the op runs. Results that alias an input own no memory."""
    val = node.meta.get("val")
    if not isinstance(val, (tuple, list)) or not isinstance(node.target, torch._ops.OpOverload):
        return 0
    picked = {user.args[1] for user in node.users if user.target is operator.getitem}
    returns = node.target._schema.returns
    total = 0
    for index, item in enumerate(val):
        if index in picked or not isinstance(item, torch.Tensor):
            continue
        if len(returns) == len(val) and returns[index].alias_info is not None:
            continue  # a view of an input
        total += storage_nbytes(item)
    return total


def storage_nbytes(t: torch.Tensor) -> int:
    try:
        return int(t.untyped_storage().nbytes())
    except Exception:  # some tensor subclasses have no storage: size it from shape and strides
        if t.numel() == 0:
            return 0
        span = 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride()))
        return int((span + t.storage_offset()) * t.element_size())


def aliased_input(node: fx.Node) -> fx.Node | None:
    """The input node whose storage `node`'s value aliases, or None when it owns new memory."""
    if node.op != "call_function":
        return None
    if node.target is operator.getitem:
        parent, index = node.args[0], node.args[1]
        if not isinstance(parent, fx.Node) or not isinstance(parent.target, torch._ops.OpOverload):
            return None
        schema = parent.target._schema
        if schema.name in _LIST_ALIASING_WITHOUT_ANNOTATION:
            first = parent.args[0] if parent.args else None
            return first if isinstance(first, fx.Node) else None
        returns = schema.returns
        if len(returns) == 1 and str(returns[0].type).startswith("List"):
            # `Tensor(a)[]` (unbind, split, chunk): the alias set sits on the element type,
            # which the schema object does not expose; the list aliases the `(a -> *)` input.
            if returns[0].alias_info is None:
                return None
            return _argument_for(parent, None, wildcard=True)
        ret = returns[index] if len(returns) > 1 else returns[0]
        return _argument_for(parent, ret.alias_info)
    if not isinstance(node.target, torch._ops.OpOverload):
        return None
    schema = node.target._schema
    if schema.name in _ALIASING_WITHOUT_ANNOTATION:
        first = node.args[0] if node.args else None
        return first if isinstance(first, fx.Node) else None
    if len(schema.returns) != 1:
        return None  # tuple results are split by getitem nodes, handled above
    return _argument_for(node, schema.returns[0].alias_info)


def _argument_for(node: fx.Node, alias_info, wildcard: bool = False) -> fx.Node | None:
    """The argument whose alias set the result shares (`wildcard`: the argument annotated
    `(a -> *)`, whose storage a list of views shares)."""
    if alias_info is None and not wildcard:
        return None
    wanted = set(alias_info.before_set) if alias_info is not None else set()
    for position, arg in enumerate(node.target._schema.arguments):
        info = arg.alias_info
        if info is None:
            continue
        if not (wanted & set(info.before_set) or wildcard and "*" in set(info.after_set)):
            continue
        value = node.args[position] if position < len(node.args) else node.kwargs.get(arg.name)
        return value if isinstance(value, fx.Node) else None
    return None
