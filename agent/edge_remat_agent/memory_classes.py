"""Where the memory goes: each planned byte in one class, counted alike by the plan and the ledger.

    parameters       the model's weights (a `param` node's outputs, or fixed when homed in RAM)
    gradients        the parameters' gradients (backward outputs an update node reads), and
                     with --accumulate their sums (fixed, or an update's while it runs)
    optimizer_state  momentum, AdamW's moments (an update node's state while it runs, or fixed)
    activations      forward outputs, the loss and the activations' gradients
    workspace        a node's temporaries while it runs (an update's scratch included)
    inputs           the batch, buffers and constants (fixed)
    runtime_warm     what the ops' first calls leave to the process (oneDNN's primitives,
                     kernel caches): fixed, planned from a profile (costs.runtime_warm_bytes);
                     no tensor, so the ledger's figure is 0 and the kernel's peak shows it

The runtime (interpreter, torch, the allocator's slack) holds no planned tensor: the run report
sets the kernel's figures beside these. The ledger counts tensors, not temporaries, so its
`workspace` stays 0; the kernel's peak is where temporaries show.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Hashable

from .formats import Graph, Node, Stages

if TYPE_CHECKING:
    from .costs import CostModel
    from .formats import Plan
    from .simulate import SimResult

CLASSES = ("parameters", "gradients", "optimizer_state", "activations", "workspace", "inputs",
           "runtime_warm")


def output_classes(node: Node) -> dict[str, int]:
    """A node's output bytes by class."""
    if node.kind == "param":
        return {"parameters": node.out_bytes}
    grads = min(int(node.attrs.get("grad_bytes") or 0), node.out_bytes)
    return {"gradients": grads, "activations": node.out_bytes - grads}


def workspace_classes(node: Node, workspace: int) -> dict[str, int]:
    """A running node's workspace by class: a homed group's update node's holds its optimizer
    state, and the gradient sums it reads from the home (capture/state.py); a RAM group's
    state is fixed memory, and its update's workspace the optimizer's temporaries (mlp with
    AdamW's report said 26 MiB of optimizer state planned, 12 of them AdamW's temporaries)."""
    if node.kind != "update":
        return {"optimizer_state": 0, "gradients": 0, "workspace": workspace}
    state = min(int(node.attrs.get("state_bytes") or 0), workspace) \
        if "home" in node.attrs else 0
    sums = min(int(node.attrs.get("sum_bytes") or 0), workspace - state)
    return {"optimizer_state": state, "gradients": sums, "workspace": workspace - state - sums}


def fixed_classes(graph: Graph) -> dict[str, int]:
    """Fixed memory by class, from the capture's breakdown (the rest of it: inputs)."""
    fixed = graph.capture.get("fixed") or {}
    out = {name: int(fixed.get(name, 0)) for name in ("parameters", "gradients",
                                                        "optimizer_state")}
    out["gradients"] += int(fixed.get("gradient_accumulators", 0))  # micro-batches' sums
    # What the executor holds to the step's end (the loss): an activation, as the ledger sees it.
    out["activations"] = int(fixed.get("step_state", 0))
    out["inputs"] = max(0, graph.fixed_bytes - sum(out.values()))
    return out


def planned_by_class(graph: Graph, plan: "Plan", costs: "CostModel",
                     sim: "SimResult | None" = None) -> dict[str, int]:
    """What the plan holds at its peak, by class, replayed with `costs`: the board's with the
    graph's (its `sim` at hand), the host's with the profile the plan was made with (QA: the
    board's figures summed to 219.0 MiB beside a planned peak of 226.78 MiB, its own replay
    peaking elsewhere)."""
    from .simulate import simulate
    if sim is None:
        sim = simulate(graph, costs, plan.stages, plan.budget_bytes)
    return planned_at(graph, plan.stages, sim.peak_at, costs.workspace(graph),
                      plan.runtime_warm_bytes)


def planned_at(graph: Graph, stages: Stages, at: tuple[int, int],
               workspace: list[int], runtime_warm: int = 0) -> dict[str, int]:
    """What the plan holds at instruction `at` (the simulator's peak_at), by class: the
    resident outputs, the running node's output and workspace, and fixed memory (the
    graph's, and `runtime_warm` where the plan counted it). The plan is taken as valid (the
    simulator checked it)."""
    resident: set[int] = set()
    running: int | None = None
    for s, stage in enumerate(stages[:at[0] + 1]):
        for k, ins in enumerate(stage if s < at[0] else stage[:at[1] + 1]):
            i = graph.index[ins.node]
            running = None
            if ins.op in ("compute", "page_in"):
                resident.add(i)
                running = i if ins.op == "compute" else None
            else:
                resident.discard(i)
    out = dict.fromkeys(CLASSES, 0)
    for i in resident:
        _add(out, output_classes(graph.nodes[i]))
    if running is not None:
        _add(out, workspace_classes(graph.nodes[running], workspace[running]))
    _add(out, fixed_classes(graph))
    out["runtime_warm"] += runtime_warm
    return out


def ledger_classifier(trace) -> Callable[[Hashable], str]:
    """The class of an executor ledger key (capture.replay: ("value", name, i); executor.step:
    ("fixed", what, ...); executor.updates: ("state", group, key)) for a captured trace."""
    from .capture.replay import gradient_storages
    params = set(trace.params)
    # a gradient by the value it lives in: the ledger keys a gradient that is a view (a
    # weight's transposed mm) by the value that allocated it, as the plan counts its bytes
    grads, grad_elements = gradient_storages(trace)
    grads |= set(trace.grads)

    def classify(key: Hashable) -> str:
        if not isinstance(key, tuple) or not key:
            return "activations"
        if key[0] == "state":
            return "optimizer_state"
        if key[0] == "fixed":
            what = str(key[1])
            return "gradients" if what in ("gradients", "gradient_accumulators") else \
                "optimizer_state" if what.startswith("optimizer_state") else "inputs"
        name = key[1] if len(key) > 1 else None
        if name in params:
            return "parameters"
        if name in grads or (len(key) > 2 and key[2] in grad_elements.get(name, ())):
            return "gradients"
        if name in trace.buffers or name in trace.user_inputs:
            return "inputs"
        return "activations"
    return classify


def _add(total: dict[str, int], part: dict[str, int]) -> None:
    for name, nbytes in part.items():
        total[name] = total.get(name, 0) + nbytes
