"""What one optimizer step of K micro-batches (`--accumulate K`) costs, from the replay of its
plan, which stands for one micro-pass.

Every pass runs the plan, but not every node does the same work in every pass
(executor/updates.py):
- an update node steps the optimizer, and reads and writes its group's state and parameters on
  their home, in the last pass only; a group's sums node (clipping's group-norm node) adds the
  pass's gradients to the sums in every pass (in graphs captured before sums nodes, the update
  node adds them);
- clipping's norm nodes take norms in the last pass only;
- gradient sums homed on a tier come from the home in every pass but the first, and the node
  that adds them writes them back in every pass; the update node reads them in the last pass
  only (an update that adds them itself: every pass but the first, and writes them back in
  every pass but the last).
The plan counts each node's whole work in its one pass, the most a pass does; K times that
counted the optimizer's step and its state's IO K times (gpt-mini, AdamW, parameters on flash,
K = 4, a profile measured on the machine: 17.66 s a step against 10.3-11.7 s measured; this
gives 11.73 s, docs/running.md). This counts each pass's own.
Every pass also adds its gradients into the sums (the first copies them in): memory-bound
work the plan does not hold, costed as the update node's own step at its rate per byte moved
(`grad_bytes` of the group's gradients; the step moves `bytes_moved`). A checked step's last
pass also writes its sums home (for the gradient check), which this leaves out.
"""

from __future__ import annotations

from typing import Any

from .costs import CostModel, home_transfer_cost
from .formats import Graph, Node
from .formats.graph import GRAD_SUMS_OP, GROUP_NORMS_OP, sums_added_apart


def pass_transfers(node: Node, k: int, j: int) -> tuple[int, int]:
    """Bytes the node reads from and writes to its home in pass j (from 0) of K; its plan
    counts `attrs.io`, what the most demanding pass moves."""
    io = node.attrs.get("io")
    if not io:
        return 0, 0
    planned = io["read_bytes"], io["write_bytes"]
    sums = node.attrs.get("sum_bytes", 0)
    last, first = j == k - 1, j == 0
    if node.op in (GROUP_NORMS_OP, GRAD_SUMS_OP):  # the sums in and out: none in at first
        return (0, sums) if first and not last else planned
    if node.kind != "update":
        return planned  # a param node loads its group in every pass
    if last:  # the step: state in and out, new parameters out; sums in, none back
        return planned[0], planned[1] - (0 if sums_added_apart(node) else sums)
    if sums_added_apart(node) or not sums:
        return 0, 0  # only adds (the node that adds them moves the sums)
    return (0 if first else sums), sums


# Tensors of the gradients' size each pass's summing reads or writes: the first pass copies the
# gradients in (read, write), later ones add (read both, write)
COPY_MOVES, ADD_MOVES = 2, 3


def summing_share(node: Node, j: int) -> float:
    """The update node's summing in pass j, as a share of its optimizer step's compute (both
    memory-bound); 0 for a node that sums nothing (K = 1, or no rate to scale)."""
    moved = node.attrs.get("bytes_moved") or 0
    if not moved or not node.attrs.get("grad_bytes"):
        return 0.0
    return (COPY_MOVES if j == 0 else ADD_MOVES) * node.attrs["grad_bytes"] / moved


def _last_pass_only(node: Node) -> bool:
    """Whether the node's compute runs in the last pass only (else in every pass): the
    optimizer's updates and clipping's norm nodes, all of kind `update`."""
    return node.kind == "update"


def accumulated_step(graph: Graph, costs: CostModel, stages: Any, sim: Any,
                     k: int) -> dict[str, Any] | None:
    """{micro_batches, time_s, energy_j}: a step of K passes of the plan (`stages`, replayed as
    `sim` under `costs`); None at K = 1, where a step is the pass."""
    if k <= 1:
        return None
    computes: dict[int, int] = {}
    for stage in stages:
        for ins in stage:
            if ins.op == "compute":
                i = graph.index[ins.node]
                if _last_pass_only(graph.nodes[i]):  # the others do a pass's work each pass
                    computes[i] = computes.get(i, 0) + 1
    home_s = costs.home_io_s or [0.0] * len(graph)
    home_j = costs.home_io_j or [0.0] * len(graph)
    saved_s = saved_j = 0.0  # what K whole passes count and the step does not do
    for i, times in computes.items():
        node = graph.nodes[i]
        compute_s, compute_j = costs.time_s[i] - home_s[i], costs.energy_j[i] - home_j[i]
        done_s = done_j = 0.0
        for j in range(k):
            share = (j == k - 1) + summing_share(node, j)  # its compute: the last pass's
            done_s, done_j = done_s + share * compute_s, done_j + share * compute_j
            if "io" in node.attrs:
                io_s, io_j = home_transfer_cost(node, *pass_transfers(node, k, j),
                                                costs.tier_figures)
                done_s, done_j = done_s + io_s, done_j + io_j
        saved_s += times * (k * costs.time_s[i] - done_s)
        saved_j += times * (k * costs.energy_j[i] - done_j)
    time_s = k * sim.time_s - saved_s
    dynamic_j = k * (sim.energy_compute_j + sim.energy_paging_j) - saved_j
    return {"micro_batches": k, "time_s": time_s,
            "energy_j": dynamic_j + costs.static_w * time_s}


def step_figure(predicted: dict[str, Any], key: str) -> Any:
    """A plan's predicted `time_s` or `energy_j` for a whole step: its accumulated step's
    where it has one (--accumulate K), else its own (the step is the pass)."""
    return (predicted.get("accumulated_step") or predicted).get(key)
