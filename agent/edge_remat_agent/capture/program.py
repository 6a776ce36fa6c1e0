"""A captured joint graph as plain data: what it takes to run it, without tracing again.

Tracing imports AOTAutograd and builds fake tensors: some 90 MB of resident memory on top of
torch, and more while it traces. On a board that is the very memory a plan saves, so the
executor captures in a child process (isolated.py) and takes back a `Program`: every captured
op as (name, target, args, kwargs), the placeholders, the tensor constants the trace lifted (real
values, a few bytes each), the calling convention and which value owns which storage, and
each value's tensor layout (shape, strides, dtype, which storage it shares: `TensorLayout`).
`Program.trace()` rebuilds the FX graph from it, names unchanged, without tracing, each node
carrying a meta tensor of its traced layout where the trace had a fake one: the runner's
choices read them (arena .out writes, in-place ops, folded getitems, the compiled replay's
ledger), and without them a job captured in a child ran none of those. Which ops may run
through their Python binding is decided in the child too (`bound`, bindings.py).
The result runs through StepRunner like the trace itself.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from . import bindings
from .trace import JointTrace


@dataclass(frozen=True)
class Ref:
    """An op argument that is another captured value, by name."""

    name: str


@dataclass(frozen=True)
class TensorLayout:
    """A traced tensor's layout; `storage`: an index shared by the values that alias."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    dtype: torch.dtype
    storage: int
    storage_bytes: int


@dataclass
class Program:
    model: str
    placeholders: list[str]
    ops: list[tuple[str, str, Any, Any]]  # (name, target, args, kwargs), in execution order
    signature: dict[str, Any]  # JointTrace.signature()
    storage_roots: dict[str, str]
    # value name -> its TensorLayout, a tuple of them (None for a non-tensor item), or a
    # Python number; values the trace gave no fake value are absent
    layouts: dict[str, Any]
    # the ops whose Python binding reaches the traced overload (bindings.py), checked where
    # the trace was made, so that the check's own memory stays there
    bound: frozenset[str] = frozenset()
    constants: dict[str, torch.Tensor] = field(default_factory=dict)  # JointTrace.constants()

    def trace(self) -> JointTrace:
        graph = fx.Graph()
        root = torch.nn.Module()
        nodes: dict[str, fx.Node] = {}
        for name in self.placeholders:
            nodes[name] = graph.placeholder(name)
        for name, value in self.constants.items():
            setattr(root, name, value)
            nodes[name] = graph.create_node("get_attr", name, name=name)

        def bind(value):
            if isinstance(value, Ref):
                return nodes[value.name]
            if isinstance(value, (list, tuple)):
                return type(value)(bind(v) for v in value)
            if isinstance(value, dict):
                return {k: bind(v) for k, v in value.items()}
            return value

        for name, target, args, kwargs in self.ops:
            node = graph.create_node("call_function", _resolve(target), bind(args), bind(kwargs),
                                     name=name)
            if node.name != name:
                raise ValueError(f"captured value {name!r} came back as {node.name!r}")
            node.meta[bindings.DECIDED] = name in self.bound
            nodes[name] = node
        graph.output(None)
        storages: dict[int, torch.UntypedStorage] = {}
        for name, layout in self.layouts.items():
            nodes[name].meta["val"] = _meta_value(layout, storages)
        sig = self.signature
        return JointTrace(self.model, fx.GraphModule(root, graph), sig["params"],
                          sig["buffers"], sig["user_inputs"], sig["tangent"], sig["loss"],
                          sig["grads"], sig["buffer_updates"], sig.get("input_updates", {}),
                          roots=dict(self.storage_roots))


def program_of(trace: JointTrace) -> Program:
    def plain(value):
        if isinstance(value, fx.Node):
            return Ref(value.name)
        if isinstance(value, (list, tuple)):
            return type(value)(plain(v) for v in value)
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return value

    gm = trace.graph_module
    placeholders = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    ops = [(n.name, _target_name(n.target), plain(n.args), plain(dict(n.kwargs)))
           for n in trace.compute_nodes]
    storage_ids: dict[int, int] = {}
    layouts = {}
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "get_attr", "call_function") and "val" in node.meta:
            layout = _layout(node.meta["val"], storage_ids)
            if layout is not None:
                layouts[node.name] = layout
    bound = frozenset(n.name for n in trace.compute_nodes
                      if isinstance(n.target, torch._ops.OpOverload)
                      and bindings.python_binding(n, dict(n.kwargs)) is not None)
    return Program(trace.model, placeholders, ops, trace.signature(), trace.storage_roots(),
                   layouts, bound, trace.constants())


def _layout(value: Any, storage_ids: dict[int, int]) -> Any:
    """A fake value as plain data: TensorLayout, a tuple of layouts, a Python number, or
    None (kept out of the program)."""
    if isinstance(value, torch.Tensor):
        try:
            storage = value.untyped_storage()
        except (RuntimeError, NotImplementedError):  # no storage (sparse, nested)
            return None
        index = storage_ids.setdefault(storage._cdata, len(storage_ids))
        return TensorLayout(tuple(value.shape), tuple(value.stride()), value.storage_offset(),
                            value.dtype, index, storage.nbytes())
    if isinstance(value, (list, tuple)):
        items = tuple(_layout(v, storage_ids) for v in value)
        return items if any(item is not None for item in items) else None
    if isinstance(value, (bool, int, float)):
        return value
    return None


def _meta_value(layout: Any, storages: dict[int, torch.UntypedStorage]) -> Any:
    """A TensorLayout as a meta tensor; layouts of one storage share one meta storage, so
    that aliasing reads as it did in the trace (executor/in_place.py compares storages)."""
    if isinstance(layout, TensorLayout):
        storage = storages.get(layout.storage)
        if storage is None:
            storage = storages[layout.storage] = torch.UntypedStorage(layout.storage_bytes,
                                                                        device="meta")
        return torch.empty(0, dtype=layout.dtype, device="meta").set_(
            storage, layout.offset, layout.shape, layout.stride)
    if isinstance(layout, tuple):
        return tuple(_meta_value(item, storages) for item in layout)
    return layout


def _target_name(target) -> str:
    if target is operator.getitem:
        return "getitem"
    if isinstance(target, torch._ops.OpOverload):
        return f"{target._schema.name}.{target._overloadname}"  # e.g. aten::add.Tensor
    raise TypeError(f"cannot name the captured op {target!r}")


def _resolve(name: str):
    if name == "getitem":
        return operator.getitem
    qualified, _, overload = name.rpartition(".")
    namespace, _, op = qualified.partition("::")
    return getattr(getattr(getattr(torch.ops, namespace), op), overload)
