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

Nothing is computed twice: the same ops run, the gradient ops after the others of their
group (the graph is functional and backward draws no random numbers, so the values are the
same bit for bit). What cannot be split this way stays: a gradient that one op computes with
other results (convolution_backward's weight gradient with the input's, a norm's affine
gradients) stays with them.
"""

from __future__ import annotations

import operator

from torch import fx

from .coarsen import Group
from .storage import storages
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
    return {name: s.nbytes for name, s in storages(trace.graph_module).items()
            if s.root == name}
