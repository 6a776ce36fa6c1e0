"""The nodes that clip a fused graph's gradients by their global norm (grad_clip.py).

torch.nn.utils.clip_grad_norm_ needs every gradient before any parameter steps. In a fused
graph that is two kinds of node, both of kind "update" (run by executor/updates.py):
  - a **group-norm node** per trainable parameter group (op `grad_norms`), right after the
    group's last gradient: each of its gradients' 2-norm, a float32 scalar each. Only these
    scalars need to wait, not the gradients, so a gradient may be paged out once it is read;
  - one **norm node** (op `clip_grad_norm`), after every group-norm node: the 2-norm of all
    those norms in the module's parameter order (the order torch stacks them in).
Every update node reads the norm node, so none steps before the last gradient is complete:
each group's gradients live, in RAM or paged, until its update, which the planner sees.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..formats import Node
from ..formats.graph import CLIP_OP, GROUP_NORMS_OP
from .estimate import Rates, round_time

SCALAR_BYTES = 4  # a float32 norm


@dataclass
class NormNodes:
    groups: dict[int, Node]  # position of a group (in the trainable list) -> its norm node
    total: Node
    last_gradient: int  # the node index after which the norm node goes


def gradient_pairs(group, nodes: list[Node], position: dict[str, int] | None = None
                   ) -> tuple[list[list[str]], dict[str, object]]:
    """A group's [gradient value, parameter name] pairs (in `position`'s order of the names,
    else the capture's), and gradient value -> the id of the node that makes it."""
    value_of, producer = {}, {}
    for value, index in group.grads.items():
        value_of[nodes[index].attrs["grads"][value]] = value  # the last, as updates assign
        producer[value] = nodes[index].id
    names = list(value_of) if position is None else \
        sorted(value_of, key=lambda name: position.get(name, len(position)))
    return [[value_of[name], name] for name in names], producer


def norm_nodes(groups: list, nodes: list[Node], max_norm: float, param_order: list[str],
               rates: Rates) -> NormNodes:
    """`groups`: the trainable ParamGroups with gradients; `nodes`: planner nodes, ids =
    positions; `param_order`: the module's parameter names in order."""
    position = {name: k for k, name in enumerate(param_order)}
    by_group: dict[int, Node] = {}
    for k, group in enumerate(groups):
        pairs, producer = gradient_pairs(group, nodes, position)
        time = max(2 * group.elements / rates.flops_per_s, group.nbytes / rates.bytes_per_s)
        by_group[k] = Node(
            id=f"grad_norms:{k}", name=f"{group.name}.grad_norms", kind="update",
            op=GROUP_NORMS_OP, inputs=sorted(set(producer.values()), key=str),
            out_bytes=SCALAR_BYTES * len(pairs), workspace_bytes=0,
            time_s=round_time(time + rates.op_overhead_s),
            signature=f"{GROUP_NORMS_OP}:{group.elements}",
            attrs={"members": [], "outputs": [], "reads": producer, "norm_grads": pairs,
                   "flops": 2 * group.elements, "bytes_moved": group.nbytes})
    order = sorted((name for node in by_group.values() for _, name in node.attrs["norm_grads"]),
                   key=lambda name: position.get(name, len(position)))
    total = Node(id="clip_grad_norm", name="clip_grad_norm", kind="update", op=CLIP_OP,
                 inputs=[node.id for node in by_group.values()], out_bytes=SCALAR_BYTES,
                 # the norms stacked into one tensor
                 workspace_bytes=SCALAR_BYTES * len(order),
                 time_s=round_time(rates.op_overhead_s), signature=f"{CLIP_OP}:{len(order)}",
                 attrs={"members": [], "outputs": [], "reads": {}, "norm_order": order,
                        "max_norm": float(max_norm)})
    last = max(index for group in groups for index in group.grads.values())
    return NormNodes(by_group, total, last)
