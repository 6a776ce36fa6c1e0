"""Accumulating micro-batches (`--accumulate K`) without clipping: a node per trainable
parameter group (op `grad_sums`, kind "update") right after the group's last gradient, which
adds the pass's gradients into the group's sums (accumulation.py; a homed group's sums through
its home). The update node then steps with the sums alone, in the last pass: a pass's
gradients are freed once added, before the optimizer's temporaries, as plain PyTorch's
AccumulateGrad adds each into `.grad` before the one step (QA: mlp with AdamW and
`--accumulate 2` could not plan below 46.19 MiB, plain PyTorch's peak being 40.19 MiB). With
clipping, the group-norm node (clip_nodes.py) adds them as it takes their norms.

The adds are costed on the update node (accumulated_step.summing_share), which the plan
replays for every pass; this node's own time is an op's overhead.
"""

from __future__ import annotations

from ..formats import Node
from ..formats.graph import GRAD_SUMS_OP
from .clip_nodes import gradient_pairs
from .estimate import Rates, round_time


def sum_nodes(groups: list, nodes: list[Node], rates: Rates) -> dict[int, Node]:
    """Position of a group in `groups` (the trainable ParamGroups with gradients) -> its
    sums node; `nodes`: planner nodes, ids = positions."""
    by_group: dict[int, Node] = {}
    for k, group in enumerate(groups):
        pairs, producer = gradient_pairs(group, nodes)
        by_group[k] = Node(
            id=f"grad_sums:{k}", name=f"{group.name}.grad_sums", kind="update",
            op=GRAD_SUMS_OP, inputs=sorted(set(producer.values()), key=str), out_bytes=0,
            workspace_bytes=0, time_s=round_time(rates.op_overhead_s),
            signature=f"{GRAD_SUMS_OP}:{group.elements}",
            attrs={"members": [], "outputs": [], "reads": producer, "sum_grads": pairs})
    return by_group
