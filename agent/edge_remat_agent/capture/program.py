"""A captured joint graph as plain data: what it takes to run it, without tracing again.

Tracing imports AOTAutograd and builds fake tensors: some 90 MB of resident memory on top of
torch, and more while it traces. On a board that is the very memory a plan saves, so the
executor captures in a child process (isolated.py) and takes back a `Program`: every captured
op as (name, target, args, kwargs), the placeholders, the tensor constants the trace lifted (real
values, a few bytes each), the calling convention and which value owns which storage. `Program.trace()` rebuilds the FX graph from it, names unchanged, without
tracing; the result runs through StepRunner like the trace itself.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from .trace import JointTrace


@dataclass(frozen=True)
class Ref:
    """An op argument that is another captured value, by name."""

    name: str


@dataclass
class Program:
    model: str
    placeholders: list[str]
    ops: list[tuple[str, str, Any, Any]]  # (name, target, args, kwargs), in execution order
    signature: dict[str, Any]  # JointTrace.signature()
    tangent_shape: tuple[int, ...]
    tangent_dtype: torch.dtype
    storage_roots: dict[str, str]
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
        nodes[self.signature["tangent"]].meta["val"] = torch.empty(
            self.tangent_shape, dtype=self.tangent_dtype, device="meta")

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
            nodes[name] = node
        graph.output(None)
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
    tangent = trace.node(trace.tangent).meta["val"]
    return Program(trace.model, placeholders, ops, trace.signature(), tuple(tangent.shape),
                   tangent.dtype, trace.storage_roots(), trace.constants())


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
