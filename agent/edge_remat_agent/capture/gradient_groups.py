"""Parameter gradients in backward nodes of their own, for clipping (`--clip-grad-norm`).

A planner node's outputs are one tensor to the planner: they live until the node's last
reader. Clipping makes every update wait for the global norm (clip_nodes.py), so a backward
node that computes a gradient would hold its whole output, the gradient for its input
activation and every value another backward node reads, until the last update: on gpt-mini
with parameters on flash, 75 MB more at the keep-all peak than without clipping. Here each
backward group's ops that lead only to parameter gradients (a Linear's weight-gradient mm and
its transpose, its bias-gradient sum, a tied weight's partial gradient) become a group of
their own right after the rest, so that the norm and update nodes read the gradients alone
and the rest of the backward output goes when the next backward node is done with it.

The same ops run, the gradient ops after the others of their group (the graph is functional
and backward draws no random numbers, so the values are the same bit for bit). An op that
computes a weight's gradient with its input's in one call (convolution_backward,
native_layer_norm_backward, native_batch_norm_backward) is first made two calls of that op,
one per `output_mask` half (`weight_gradients_apart`): each result is computed as in the one
call (the kernels take the input's and the weights' gradients each on its own;
tests/test_clip_gradient_nodes.py checks them bit for bit); only a norm's per-channel sums,
which both halves need, are taken twice.
"""

from __future__ import annotations

import operator

from torch import fx

from .coarsen import Group
from .trace import JointTrace


def gradients_apart(trace: JointTrace, groups: list[Group], room: int | None = None
                    ) -> list[Group]:
    """`groups` with each backward group's gradient-only ops moved to a group right after it,
    where both parts allocate memory. `room`: at most this many groups more (the node budget
    that coarsening and refinement left), given to the groups whose other part allocates the
    most (what their gradients would hold); None: no limit."""
    allocates = _allocating(trace)
    splits: dict[int, tuple[list[str], list[str]]] = {}
    held: dict[int, int] = {}
    for k, group in enumerate(groups):
        only = gradient_only_ops(trace, group.members) if group.kind == "backward" else set()
        grads = [name for name in group.members if name in only]
        rest = [name for name in group.members if name not in only]
        if any(n in allocates for n in grads) and any(n in allocates for n in rest):
            splits[k] = (rest, grads)
            held[k] = sum(allocates[n] for n in rest if n in allocates)
    chosen = sorted(splits, key=lambda k: -held[k])[:max(0, room)] if room is not None \
        else splits
    out: list[Group] = []
    for k, group in enumerate(groups):
        if k not in chosen:
            out.append(group)
            continue
        rest, grads = splits[k]
        name = group.label or f"{group.scope or 'loss'}.backward"
        out += [Group(group.kind, group.scope, rest, group.label),
                Group(group.kind, group.scope, grads, f"{name}.grads")]
    return out


def gradient_only_ops(trace: JointTrace, members: list[str]) -> set[str]:
    """The ops of a group (`members`, in execution order) whose results are read only on the
    way to its parameter gradients (the gradients included): by the group's own
    gradient-only ops, or by another group's gradient (a tied weight's partial gradient, which
    that gradient sums). Not by any other op of another group: every backward value leads to
    some gradient in the end. A result of an op with several results goes with its op: a
    getitem counts only where the op does, and the op where every getitem does."""
    inside = set(members)
    only: set[str] = set()
    for name in reversed(members):  # users before the values they read
        node = trace.node(name)
        users = [u for u in node.users if u.op != "output"]
        if (name in trace.grads or users) and all(
                u.name in only if u.name in inside else _a_gradient(trace, u) for u in users):
            only.add(name)
    for name in members:  # a getitem whose op gives other results too stays with that op
        node = trace.node(name)
        parent = node.args[0] if node.target is operator.getitem else None
        if isinstance(parent, fx.Node) and parent.name not in only:
            only.discard(name)
    return only


def _a_gradient(trace: JointTrace, node: fx.Node) -> bool:
    """A parameter gradient that only the step's output reads."""
    return node.name in trace.grads and all(u.op == "output" for u in node.users)


def _allocating(trace: JointTrace) -> dict[str, int]:
    """The values that own a storage (views own none), and its bytes."""
    return {name: s.nbytes for name, s in trace.storages().items()
            if s.root == name}


# Backward ops that compute their input's gradient and their weights' by `output_mask`.
_MASKED = ("convolution_backward", "native_layer_norm_backward", "native_batch_norm_backward")


def weight_gradients_apart(trace: JointTrace) -> None:
    """Make each masked backward op (_MASKED) that gives both its input's gradient and
    parameter gradients two calls of the op: the input's gradient alone, then the parameter
    gradients alone, so that the second can be a gradient-only op."""
    graph = trace.graph_module.graph
    changed = False
    for node in trace.compute_nodes:
        packet = getattr(node.target, "overloadpacket", None)
        if packet is None or packet.__name__ not in _MASKED or "output_mask" not in _names(node):
            continue
        at = _names(node).index("output_mask")
        mask = list(node.args[at])
        picks = {u.args[1]: u for u in node.users if u.target is operator.getitem}
        weights = [k for k in picks if k > 0]
        if not (mask[0] and 0 in picks and weights
                and all(picks[k].name in trace.grads for k in weights)):
            continue
        with graph.inserting_after(node):
            apart = graph.call_function(node.target, (*node.args[:at], [False, *mask[1:]],
                                                      *node.args[at + 1:]), dict(node.kwargs))
        apart.meta = dict(node.meta)
        value = node.meta.get("val")
        if isinstance(value, (tuple, list)):
            apart.meta["val"] = tuple(None if k == 0 else v for k, v in enumerate(value))
            node.meta["val"] = tuple(v if k == 0 else None for k, v in enumerate(value))
        node.args = (*node.args[:at], [True, False, False], *node.args[at + 1:])
        for k in weights:
            picks[k].args = (apart, k)
        changed = True
    if changed:
        trace.roots = None  # storages are looked up afresh
        trace.graph_changed()


def _names(node: fx.Node) -> list[str]:
    return [a.name for a in node.target._schema.arguments]
