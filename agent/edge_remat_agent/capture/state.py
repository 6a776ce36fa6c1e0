"""Parameters, gradients and optimizer state as planned tensors (fused updates, parameter homes).

With `update="fused"` (the default) every byte of a training step that can move is a planner
tensor:
  - a parameter's gradient is an output of the backward node that completes it, and lives until
    its parameter group's **update node** (kind "update") consumes it: the optimizer steps that
    group as soon as its gradients are complete, instead of once after the whole backward, so
    gradients never all exist at once;
  - a parameter group whose home is a page tier (`params_home="flash"|"host"`) is a **param
    node** (kind "param", no inputs): computing it reads the group from its home, freeing it
    drops the RAM copy (the home keeps the value), and recomputing it reads it again. Its
    trainable groups' optimizer state lives at home too: the update node reads it, steps, and
    writes state and parameters back (new version first, then switch). Frozen groups are
    read-only pages: read back, never written.
  - accumulating micro-batches, a node right after a group's last gradient adds the pass's
    gradients into the group's sums (sum_nodes.py; with clipping, the group-norm node), and
    the update node steps with the sums in the last pass, at the pass's end (a homed group's:
    as without accumulation). A homed group's sums live at home too: that node reads them,
    adds and writes them back (accumulation.py), so no sum stays in RAM across the passes.
What stays fixed is the RAM-homed parameters and their optimizer state, buffers, the batch and the
step state (graph.capture["fixed"] says how much of each).

A parameter group is the parameters one module owns directly, split by trainability. Its update
node is placed after every node that reads the group *and* every node that reads their outputs:
an update modifies parameters in place, so a reader recomputed after it would compute from the
new weights. The placement leaves no first computation that needs a reader after the update,
but a recomputed user can (a backward `mm` with the weight, freed, and its user recomputed in a
later layer's stage): the update names its readers (`param_readers`). The exact solvers'
models forbid such a recompute, lowering keeps a heuristic plan's reader value instead (host
planner/stages.py), and the simulator refuses a plan that recomputes one after its update.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from ..formats import Node
from ..formats.graph import SUMS_SUFFIX, update_signature
from ..formats.graph_details import WEIGHT_FILE
from ..weights.deferred import is_deferred
from .estimate import Rates, round_time
from .clip_nodes import norm_nodes
from .sum_nodes import sum_nodes
from .optimizer import Optimizer
from .trace import JointTrace


@dataclass
class ParamGroup:
    name: str  # the first reader's name, "(frozen)" added when frozen
    params: list[str]  # parameter names (the first name of each tensor)
    placeholders: list[str]  # the joint graph's placeholders for them
    nbytes: int
    elements: int
    trainable: bool
    largest_bytes: int
    readers: set[int] = field(default_factory=set)  # planner node indices
    grads: dict[str, int] = field(default_factory=dict)  # gradient value -> producing node
    # frozen, of a model built on `meta`: a run homing it reads it from the model's weight
    # file (executor/stores.py), not from pages of its own
    from_weight_file: bool = False


def param_groups(trace: JointTrace, module: nn.Module, nodes: list[Node]) -> list[ParamGroup]:
    """The parameters grouped by the planner node that reads them first, and by trainability:
    as coarse as the graph (a node that runs a whole block loads and updates the block's
    parameters together), so that state nodes never outnumber the forward nodes. Parameters
    no node reads (unused by the forward) are left out: they have no gradient and stay put."""
    readers: dict[str, set[int]] = {}
    for index, node in enumerate(nodes):
        for op_name in node.attrs.get("replays", []) + node.attrs.get("members", []):
            for dep in trace.node(op_name).all_input_nodes:
                if dep.name in trace.params:
                    readers.setdefault(dep.name, set()).add(index)
    producers = {value: index for index, node in enumerate(nodes)
                 for value in node.attrs.get("grads", {})}
    grads_of: dict[str, list[str]] = {}
    for value, name in trace.grads.items():
        grads_of.setdefault(name, []).append(value)
    tensors = dict(module.named_parameters(remove_duplicate=False))
    deferred = is_deferred(module)
    groups: dict[tuple[int, bool], ParamGroup] = {}
    seen: set[int] = set()
    for placeholder, name in trace.params.items():
        tensor = tensors[name]
        if id(tensor) in seen or placeholder not in readers:
            continue
        seen.add(id(tensor))
        key = (min(readers[placeholder]), tensor.requires_grad)
        group = groups.get(key)
        if group is None:
            label = nodes[key[0]].name + ("" if tensor.requires_grad else " (frozen)")
            group = groups[key] = ParamGroup(label, [], [], 0, 0, tensor.requires_grad, 0,
                                             from_weight_file=deferred and
                                             not tensor.requires_grad)
        nbytes = tensor.numel() * tensor.element_size()
        group.params.append(name)
        group.placeholders.append(placeholder)
        group.nbytes += nbytes
        group.elements += tensor.numel()
        group.largest_bytes = max(group.largest_bytes, nbytes)
        group.readers |= readers[placeholder]
        for value in grads_of.get(name, []):
            if value in producers:
                group.grads[value] = producers[value]
    return sorted(groups.values(), key=lambda g: min(g.readers))


@dataclass
class StatePlan:
    """What `plan_state` decided: the nodes in execution order and the bytes that moved out of
    fixed memory into planned tensors, by class."""

    nodes: list[Node]
    planned: dict[str, int]


def plan_state(nodes: list[Node], groups: list[ParamGroup], optimizer: Optimizer,
               params_home: str, rates: Rates, clip_grad_norm: float | None = None,
               param_order: list[str] | None = None, accumulate: int = 1,
               shared_grads: dict[str, int] | None = None) -> StatePlan:
    """Insert param nodes (for groups homed on a tier) and fused update nodes into `nodes`
    (planner nodes without an update node, ids = positions), renumbering ids to positions.
    `clip_grad_norm`: clipping's norm nodes (clip_nodes.py), which every update node waits
    for (`param_order`: the module's parameter names, the order the norm sums in).
    `accumulate` > 1: a homed group's gradient sums live at its home between micro-passes.
    `shared_grads`: gradient value -> bytes, for the gradients whose storage outlives them
    (assemble._gradients_sharing_storage): clipping scales those on a copy."""
    paged = params_home != "ram"
    trainable = [g for g in groups if g.trainable and g.grads]
    clip = norm_nodes(trainable, nodes, clip_grad_norm, param_order or [], rates) \
        if clip_grad_norm is not None and trainable else None
    norm = clip.total if clip is not None else None
    # Accumulating, each group's gradients go into its sums at a node of their own, which the
    # update waits for: clipping's group-norm node, else a sums node (sum_nodes.py).
    adders = clip.groups if clip is not None else \
        sum_nodes(trainable, nodes, rates) if accumulate > 1 else {}
    adder_of = {id(group): adders[k] for k, group in enumerate(trainable) if k in adders}
    users: list[set[int]] = [set() for _ in nodes]
    for index, node in enumerate(nodes):
        for dep in node.inputs:
            users[dep].add(index)
    before: dict[int, list[Node]] = {}  # insert before node index
    after: dict[int, list[Node]] = {}  # insert after node index
    planned = {"parameters": 0, "gradients": 0, "optimizer_state": 0}
    homed_sums = paged and accumulate > 1
    if homed_sums:
        planned["gradient_accumulators"] = 0
    key = 0
    for group in groups:
        param_key = None
        if paged and group.readers:
            param_key = f"param:{key}"
            key += 1
            before.setdefault(min(group.readers), []).append(
                _param_node(param_key, group, params_home))
            for index in group.readers:
                reads = nodes[index].attrs.setdefault("reads", {})
                for ph in group.placeholders:
                    reads[ph] = param_key
                nodes[index].inputs.append(param_key)
            planned["parameters"] += group.nbytes
        if not group.trainable or not group.grads:
            continue
        last = max(group.grads.values())
        if clip is not None:  # after the norm node, which comes after the last gradient
            last = max(last, clip.last_gradient)
        for index in group.readers:
            last = max(last, index, *users[index])
        update_key = f"update:{key}"
        key += 1
        update = _update_node(update_key, group, optimizer, param_key,
                              params_home if paged else None, nodes, rates, norm,
                              homed_sums and param_key is not None,
                              {} if accumulate > 1 else shared_grads or {},
                              adder_of.get(id(group)) if accumulate > 1 else None)
        if "sum_bytes" in update.attrs:
            planned["gradient_accumulators"] += update.attrs["sum_bytes"]
        if accumulate > 1:  # what each micro-pass adds into the sums (accumulated_step.py)
            update.attrs["grad_bytes"] = group.nbytes
        # The placement keeps a reader's recompute after the update unread only by its direct
        # users: a user recomputed later would need it again, computed from the new weights.
        # The planner never recomputes a reader after its update (see the module docstring).
        update.attrs["param_readers"] = sorted(
            [nodes[index].id for index in group.readers] + ([param_key] if param_key else []),
            key=str)
        if accumulate > 1 and param_key is None:
            # It steps with the sums and reads nothing the pass makes: its temporaries go
            # where the pass holds least, at its end, as plain PyTorch's one step (vgg11,
            # AdamW, --accumulate 2: classifier.3's 128 MiB of them beside the features'
            # activations put the keep-all peak 8.1 MB above plain PyTorch's). A homed
            # group's stays by the parameters its param node loaded for the backward.
            last = len(nodes) - 1
        after.setdefault(last, []).append(update)
        planned["gradients"] += group.nbytes
        if paged:
            planned["optimizer_state"] += optimizer.state_bytes(group.nbytes, len(group.params))
    norms: dict[int, list[Node]] = {}  # the adders and clipping's, before the updates
    for k, group in enumerate(trainable):
        if k in adders:
            norms.setdefault(max(group.grads.values()), []).append(adders[k])
            if homed_sums and group.readers:
                _sums_through_the_home(adders[k], group.nbytes, params_home)
    if clip is not None:
        norms[clip.last_gradient].append(clip.total)
    ordered: list[Node] = []
    for index, node in enumerate(nodes):
        ordered += before.get(index, [])
        ordered.append(node)
        # Updates due at one place step smallest workspace first: each frees what only it
        # reads, so the largest workspace comes when the least is left beside it (QA: a
        # two-layer MLP with AdamW stepped its big layer first, beside the small one's
        # gradients, above plain PyTorch's peak, and --budget 100% was refused).
        ordered += norms.get(index, []) + sorted(after.get(index, []),
                                                 key=lambda update: update.workspace_bytes)
    _renumber(ordered)
    return StatePlan(ordered, planned)


def _param_node(key: str, group: ParamGroup, home: str) -> Node:
    return Node(id=key, name=f"{group.name}.params", kind="param", op="load_params",
                inputs=[], out_bytes=group.nbytes, workspace_bytes=0, time_s=0.0,
                signature=f"load_params:{group.nbytes}",
                attrs={"members": [], "outputs": list(group.placeholders), "reads": {},
                       "params": list(group.params), "home": home,
                       "io": {"tier": home, "read_bytes": group.nbytes, "write_bytes": 0,
                              **({"source": WEIGHT_FILE} if group.from_weight_file else {})}})


def _update_node(key: str, group: ParamGroup, optimizer: Optimizer, param_key: str | None,
                 home: str | None, nodes: list[Node], rates: Rates,
                 norm: Node | None = None, homed_sums: bool = False,
                 shared_grads: dict[str, int] | None = None, adder: Node | None = None
                 ) -> Node:
    flops = optimizer.flops_per_element * group.elements
    moved = optimizer.tensors_moved * group.nbytes
    time = max(flops / rates.flops_per_s, moved / rates.bytes_per_s) + rates.op_overhead_s
    state_bytes = optimizer.state_bytes(group.nbytes, len(group.params))
    if adder is None:
        reads = {value: nodes[index].id for value, index in group.grads.items()}
        inputs = sorted({nodes[index].id for index in group.grads.values()}, key=str)
    else:  # the sums hold them (sum_nodes.py): the gradients are gone by the step
        reads, inputs = {}, [] if norm is not None else [adder.id]  # the norm waits for it
    # gradient value -> parameter name, as the producing node's `grads` say
    update_grads = {value: nodes[index].attrs["grads"][value]
                    for value, index in group.grads.items()}
    attrs = {"members": [], "outputs": [], "reads": reads, "params": list(group.params),
             "update_grads": update_grads, "optimizer": optimizer.name, "flops": flops,
             "bytes_moved": moved, "state_bytes": state_bytes}
    workspace = optimizer.temp_copies * group.largest_bytes
    attrs["temp_bytes"] = workspace  # the optimizer's own (plain training's step has them)
    if adder is not None:
        attrs["summed_apart"] = True
    if norm is not None:
        # The gradients are scaled in place, as torch's clip_grad_norm_ scales .grad, but
        # those whose storage another value holds: scaled copies of those (FusedUpdates.step)
        inputs.append(norm.id)
        attrs["clip_grad_norm"] = norm.attrs["max_norm"]
        copies = [value for value in group.grads if value in (shared_grads or {})]
        if copies:
            attrs["clip_copies"] = sorted(update_grads[value] for value in copies)
            workspace += sum(shared_grads[value] for value in copies)
    if param_key is not None:
        inputs.append(param_key)
        for ph in group.placeholders:
            reads[ph] = param_key
        attrs["home"] = home
        # Reads the state; writes the state and the new parameters back (new version, switch).
        attrs["io"] = {"tier": home, "read_bytes": state_bytes,
                       "write_bytes": state_bytes + group.nbytes}
        workspace += state_bytes
        if homed_sums:
            # Accumulating: the group's gradient sums live at the home. The node that adds
            # the pass's gradients reads them from there (but in the first micro-pass) and
            # writes them back (_sums_through_the_home), and this node reads them in the last
            # pass only, to step with. (An update that adds them itself, `adder` None, reads
            # and writes them in every pass: the plan is one pass and counts both ways.)
            attrs["sum_bytes"] = group.nbytes
            attrs["io"]["read_bytes"] += group.nbytes
            if adder is None:
                attrs["io"]["write_bytes"] += group.nbytes
            workspace += group.nbytes
    return Node(id=key, name=f"{group.name}.update", kind="update",
                op=f"{optimizer.name}_update", inputs=inputs, out_bytes=0,
                workspace_bytes=workspace, time_s=round_time(time),
                signature=update_signature(optimizer.name, group.elements, home,
                                           norm is not None, "sum_bytes" in attrs),
                attrs=attrs)


def _sums_through_the_home(adder: Node, sum_bytes: int, home: str) -> None:
    """A homed group's accumulated gradients: the node that adds them (its sums node, or
    clipping's group-norm node, which in the last pass takes their norms too) reads the sums
    from the home (but in the first pass), adds the pass's gradients and writes them back
    for the update node, which steps with them in the last pass."""
    adder.attrs.update(sum_bytes=sum_bytes,
                       io={"tier": home, "read_bytes": sum_bytes, "write_bytes": sum_bytes})
    adder.workspace_bytes += sum_bytes
    adder.signature += f":{SUMS_SUFFIX}"


def _renumber(nodes: list[Node]) -> None:
    """Ids become positions (the graph format's convention for captured graphs)."""
    new_id = {node.id: position for position, node in enumerate(nodes)}
    for node in nodes:
        node.id = new_id[node.id]
        node.inputs = sorted({new_id[dep] for dep in node.inputs})
        if "param_readers" in node.attrs:
            node.attrs["param_readers"] = sorted(new_id[r] for r in node.attrs["param_readers"])
        reads = node.attrs.get("reads")
        if reads:
            node.attrs["reads"] = {value: new_id[producer] for value, producer in reads.items()}
