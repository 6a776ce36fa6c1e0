"""From user inputs (graph, profile, budget text, paging flags) to a Problem."""

from __future__ import annotations

import time
from dataclasses import replace

from edge_remat_agent.costs import CostModel, build_costs
from edge_remat_agent.formats import Graph, Profile, Tier
from edge_remat_agent.formats.graph import CLIP_OP

from ..units import Budget
from .baselines import keep_all
from .evaluate import evaluate
from .ordering import ORDERS, memory_order
from .problem import Problem, ProblemError

PAGING_CHOICES = {"none": (), "flash": ("flash",), "host": ("host",), "both": ("flash", "host")}


def plain_peak_bytes(graph: Graph, profile: Profile | None = None) -> int:
    """Peak RAM of the plain schedule: every node once, in order, nothing paged (fixed
    included), as plain PyTorch trains (`plain_reference`). With a profile, each node's
    workspace is the profile's where it measured one (build_costs)."""
    return keep_all_peak_bytes(plain_reference(graph), profile)


def keep_all_peak_bytes(graph: Graph, profile: Profile | None = None) -> int:
    """Peak RAM of this graph's nodes run once each, in order, nothing paged: for a fused
    graph, less than plain PyTorch's (its gradients live only until their update)."""
    p = Problem(graph, build_costs(graph, profile), budget_bytes=2**62)
    return evaluate(p, keep_all(p)).sim.peak_bytes


def plain_reference(graph: Graph) -> Graph:
    """The graph as plain PyTorch trains it, the reference of fractional budgets: every
    parameter and its optimizer state resident for the whole step (param nodes become fixed
    memory), every gradient a `.grad` buffer kept to the end, and one `optimizer.step()` after
    the backward (the update nodes become one, last). The same graph captured with
    `update="step"` has this peak. Accumulating, the .grad buffers are the sums, and each
    micro-batch's gradients are added into them, group by group."""
    params = [n for n in graph.nodes if n.kind == "param"]
    updates = [n for n in graph.nodes if n.kind == "update"]
    # Accumulating micro-batches: plain PyTorch's .grad buffers are the sums, not beside them.
    sums = int(graph.capture.get("fixed", {}).get("gradient_accumulators", 0))
    if not params and len(updates) <= 1:
        # nothing planned beyond activations: the graph is its own reference
        return replace(graph, fixed_bytes=graph.fixed_bytes - sums) if sums else graph
    param_ids = {n.id for n in params}
    # Without accumulation each gradient becomes its .grad (torch keeps the tensor); with it
    # the sums are the .grad buffers, and each micro-batch's gradient is a temporary added
    # into them, here by its group's kind-update nodes (which only add: workspace 0) (QA: the
    # reference left the temporaries out, and --budget 100% of mlp with --accumulate 2 was
    # 78% of the floor).
    fixed = graph.fixed_bytes + sum(n.out_bytes for n in params)
    fixed += sum(n.attrs.get("state_bytes", 0) for n in updates if "home" in n.attrs)
    nodes = []
    for node in graph.nodes:
        if node.kind == "update" and sums:
            nodes.append(replace(node, inputs=[d for d in node.inputs if d not in param_ids],
                                 workspace_bytes=0))
        if node.kind in ("param", "update"):
            continue
        grad_bytes = 0 if sums else node.attrs.get("grad_bytes", 0)
        fixed += grad_bytes
        nodes.append(replace(node, inputs=[d for d in node.inputs if d not in param_ids],
                             out_bytes=node.out_bytes - grad_bytes))
    # the one step comes last, after every reader: its readers (param nodes gone) need no check;
    # accumulating with clipping it reads the global norm (kept above), which scales the sums
    attrs = {k: v for k, v in updates[-1].attrs.items() if k != "param_readers"}
    norm = [n.id for n in graph.nodes if n.op == CLIP_OP] if sums else []
    nodes.append(replace(updates[-1], id="optimizer.step", name="optimizer.step", inputs=norm,
                         workspace_bytes=max(n.attrs.get("temp_bytes", 0) for n in updates),
                         attrs=attrs))
    return Graph(nodes=nodes, name=graph.name, fixed_bytes=fixed, batch=graph.batch,
                 dtype=graph.dtype, capture=graph.capture, cost_source=graph.cost_source)


def resolve_budget(budget: Budget | str | float, graph: Graph,
                   reference_peak: int | None = None, profile: Profile | None = None) -> int:
    """The budget in bytes; a fraction of `reference_peak`, else of the graph's plain peak
    (computed only when needed). Text and numbers are read as the command line reads them."""
    budget = Budget.parse(budget)
    if budget.bytes is not None:
        return budget.bytes
    return budget.resolve(reference_peak if reference_peak is not None
                          else plain_peak_bytes(graph, profile))


def paging_tiers(paging: str | None, costs: CostModel) -> tuple[str, ...]:
    """The tiers a plan may page to: --paging's choice, or by default (None) every tier whose
    costs the inputs give (a profile, the command line, the graph's own page costs)."""
    if paging is None:
        return tuple(t for t in ("flash", "host") if t in costs.tiers)
    if paging in PAGING_CHOICES:
        return PAGING_CHOICES[paging]
    raise ProblemError(f"--paging must be one of {', '.join(PAGING_CHOICES)}, got {paging!r}")


def _check_flash_home(costs: CostModel) -> None:
    """Refuse parameters homed on flash that need more than the flash capacity: page-outs get
    what the home leaves (build_costs), and here it leaves nothing, not even for the home."""
    flash, figures = costs.tiers.get("flash"), costs.tier_figures.get("flash")
    capacity = figures.capacity_bytes if figures is not None else None
    if flash is None or capacity is None or flash.home_bytes <= capacity:
        return
    from edge_remat_agent.pages.errors import FLASH_CAPACITY_REMEDY
    raise ProblemError(
        f"the parameters and optimizer state homed on flash, with the largest group's new "
        f"version an update writes beside them, need {flash.home_bytes} bytes, more than the "
        f"flash capacity of {capacity} bytes: that leaves nothing for them, nor for "
        f"page-outs. Remedy: keep the parameters in RAM (--params-home ram), or "
        f"{FLASH_CAPACITY_REMEDY}")


def build_problem(graph: Graph, budget: Budget | str | float, profile: Profile | None = None,
                  objective: str = "time", deadline: float | None = None,
                  paging: str | None = None, tiers: dict[str, Tier] | None = None,
                  paging_time: str = "counted", plain_peak: int | None = None,
                  io: str = "overlap", order: str = "auto",
                  order_time_s: float | None = None, costs: CostModel | None = None) -> Problem:
    """`plain_peak`: the plain schedule's peak when the caller has it (a fraction's
    reference, unless the graph brings its own). `io`: paging overlapped with compute
    (planner/overlap.py) or stop-the-world ("sync"). `order`: "given" plans the graph's own
    order; "memory" a memory-aware one (planner/ordering.py), where the graph's order is
    free (`Graph.replayed` false); "auto" the memory-aware one where it is free and leaves
    less RAM above the budget. A fractional budget is always of the given order's peak.
    `order_time_s`: at most this long for choosing the order (callers with a time limit give
    ordering.ORDER_SHARE of it); the time taken is `order_s`, which solve() counts. `costs`:
    build_costs(graph, profile, tiers) where the caller has built it already (plan's checks)."""
    if order not in ORDERS:
        raise ProblemError(f"--order must be one of {', '.join(ORDERS)}, got {order!r}")
    if order == "memory" and graph.replayed:
        raise ProblemError(f"--order memory: graph '{graph.name}' was captured from a model, "
                           "whose ops draw random numbers and update state in its order; "
                           "plan it in its own order (--order given or auto)")
    costs = costs or build_costs(graph, profile, tiers)
    _check_flash_home(costs)
    chosen = paging_tiers(paging, costs)
    reference = graph.capture.get("reference_peak_bytes", plain_peak)
    problem = Problem(graph, costs, resolve_budget(budget, graph, reference, profile),
                      objective, deadline, chosen, paging_time,
                      profile.name if profile else None, io)
    if order == "given" or graph.replayed:
        return problem
    started = time.perf_counter()
    ordered, _, _ = memory_order(graph, problem.workspace, problem.budget_bytes - problem.fixed,
                                 time_limit_s=order_time_s)
    if ordered is graph:
        return problem  # no order found that leaves less above the budget
    return replace(problem, graph=ordered, costs=build_costs(ordered, profile, tiers),
                   given_graph=graph, order_s=time.perf_counter() - started)

