"""Models and plans the executor tests share: the user's example model, plans that recompute
every forward node or page every recomputation to flash (validated by the simulator, carrying
their flash figures), and eager PyTorch to compare with."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from edge_remat_agent.capture import Captured
from edge_remat_agent.capture.models import load_model
from edge_remat_agent.costs import build_costs
from edge_remat_agent.executor import plain_step, torch_optimizer
from edge_remat_agent.executor.batches import batch_source
from edge_remat_agent.executor.gradcheck import deterministic
from edge_remat_agent.formats import Graph, Instruction, Plan, Tier
from edge_remat_agent.simulate import simulate

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = f"{ROOT / 'examples' / 'my_model.py'}:make_model"
FLASH = Tier(read_bytes_per_s=1e9, write_bytes_per_s=1e9)


# The zoo's models at small shapes, and plans of them that recompute and page to flash.
SMALL = {"resnet18": dict(image=32), "mobilenet_v2": dict(image=32),
         "bert-mini": dict(seq=16, vocab=512)}


def zoo_model(name):
    from edge_remat_agent.zoo import build
    return lambda: build(name, batch=2, **SMALL[name])


def activation_budget(graph: Graph, fraction: float) -> int:
    """`fraction` of the graph's own keep-all schedule's planned memory, on top of fixed
    memory (at 60% of the whole plain peak, fixed memory alone would not fit)."""
    from edge_remat.planner.build import keep_all_peak_bytes
    return int(graph.fixed_bytes + fraction * (keep_all_peak_bytes(graph) - graph.fixed_bytes))


def dtr_plan(graph: Graph, fraction: float = 0.6) -> Plan:
    from edge_remat.planner.build import build_problem
    from edge_remat.planner.solve import solve
    from edge_remat.planner.problem import InfeasibleBudget
    from edge_remat.planner.solve import NoPlan
    budget = activation_budget(graph, fraction)
    try:
        problem = build_problem(graph, budget, None, "time", None, "flash", {"flash": FLASH})
        problem.check_budget()
    except InfeasibleBudget as below_the_floor:  # the graph's floor, with a little room
        problem = build_problem(graph, int(below_the_floor.smallest_bytes * 1.02), None,
                                "time", None, "flash", {"flash": FLASH})
    # DTR near the floor may recompute a parameter reader after its update; kept instead
    # (planner/stages.py), its plan can pass the budget: then a little more room, until one fits
    for _ in range(40):
        try:
            return solve(problem, "heuristic:dtr").plan
        except NoPlan:
            problem = build_problem(graph, int(problem.budget_bytes * 1.01), None, "time",
                                    None, "flash", {"flash": FLASH})
    return solve(problem, "heuristic:dtr").plan


def zoo_capturer():
    """name -> a fresh copy of that zoo model's capture (each model captured once)."""
    from edge_remat_agent.capture import capture_module
    cache = {}

    def get(name):
        if name not in cache:
            module, args = zoo_model(name)()
            cache[name] = capture_module(module, args, name)
        return fresh(cache[name], zoo_model(name))
    return get


def user_capturer():
    """() -> a fresh copy of the example model's capture."""
    from edge_remat_agent.capture import capture_model
    captured = capture_model(EXAMPLE, batch=4, image=16)
    return lambda: fresh(captured, example_model)


def example_model():
    return load_model(EXAMPLE, batch=4, image=16)


def fresh(captured: Captured, make) -> Captured:
    """The same capture with a newly built module (same seed, same weights): runs train the
    module, so each run starts from its own."""
    module, args = make()
    return dataclasses.replace(captured, module=module, example_args=tuple(args))


def with_paging(plan: Plan, graph: Graph, every: int = 2) -> Plan:
    """Every `every`-th recomputation becomes a page round trip to flash: the free before it a
    page_out, the recompute a page_in. Same memory, a deterministic mix of both mechanisms."""
    stages = [list(stage) for stage in plan.stages]
    computed, last_free, seen = set(), {}, 0
    for s, stage in enumerate(stages):
        for k, ins in enumerate(stage):
            if ins.op == "free":
                last_free[ins.node] = (s, k)
            elif ins.op == "compute":
                if ins.node in computed and ins.node in last_free:
                    seen += 1
                    if seen % every == 1 or every == 1:
                        fs, fk = last_free.pop(ins.node)
                        stages[fs][fk] = Instruction("page_out", ins.node, "flash")
                        stage[k] = Instruction("page_in", ins.node, "flash")
                computed.add(ins.node)
    return _validated(plan, graph, stages)


def every_forward_recomputed(graph: Graph) -> Plan:
    """The plain order, each forward node computed, freed and computed again at once."""
    last_reader = {dep: node.id for node in graph.nodes for dep in node.inputs}
    stages = []
    for node in graph.nodes:
        stage = [Instruction("compute", node.id)]
        if node.kind == "forward":
            stage += [Instruction("free", node.id), Instruction("compute", node.id)]
        stage += [Instruction("free", d) for d in node.inputs if last_reader[d] == node.id]
        stages.append(stage)
    return _validated(Plan(stages, graph.fingerprint(), 2**62), graph, stages)


def keep_all(graph: Graph) -> Plan:
    """Every node once, in the plain order, nothing freed before the step ends."""
    stages = [[Instruction("compute", node.id)] for node in graph.nodes]
    return _validated(Plan(stages, graph.fingerprint(), 2**62), graph, stages)


def problem_near_floor(graph: Graph, fraction: float, paging: str = "none",
                       tiers: dict | None = None):
    """The planning problem at `fraction` of the plain peak or, where that is below the
    graph's floor, at 1.05x the floor: a budget tight enough to make a plan recompute or
    page, on any model."""
    from edge_remat.planner.build import build_problem
    from edge_remat.planner.problem import InfeasibleBudget
    tiers = {} if tiers is None else tiers
    try:
        problem = build_problem(graph, fraction, None, "time", None, paging, tiers)
        problem.check_budget()
        return problem
    except InfeasibleBudget as floor:
        return build_problem(graph, int(floor.smallest_bytes * 1.05), None, "time", None,
                             paging, tiers)


def _validated(plan: Plan, graph: Graph, stages) -> Plan:
    sim = simulate(graph, build_costs(graph, None, {"flash": FLASH}), stages)
    return dataclasses.replace(plan, stages=stages, predicted=sim.summary(),
                               tiers={"flash": FLASH})


def eager_run(make, steps: int, seed: int):
    module, args = make()
    optimizer = torch_optimizer("sgd", module)
    torch.manual_seed(seed)
    losses = [plain_step(module, optimizer, args) for _ in range(steps)]
    return module, losses


def eager_parameters(module: torch.nn.Module, optimizer: str, example_args, steps: int) -> dict:
    """`module` trained by plain eager PyTorch for `steps` steps on the batches a run takes
    (executor.batches, seed 0, deterministic): its state dict, what a plan's must equal."""
    opt = torch_optimizer(optimizer, module)
    batches = batch_source(None, example_args, torch.device("cpu"), 0)
    torch.manual_seed(0)
    with deterministic(torch.device("cpu")):
        for i in range(steps):
            plain_step(module, opt, batches(i))
    return module.state_dict()


def eager_clipped(module: torch.nn.Module, optimizer: str, example_args, steps: int,
                  max_norm: "float | None", lr_factor=None) -> tuple[dict, list]:
    """`module` trained by plain PyTorch as a user writes clipping and a schedule, not through
    the executor's plain_step: torch.nn.utils.clip_grad_norm_ after each backward (none where
    `max_norm` is None), the optimizer's step, then LambdaLR's with `lr_factor` (none without
    one); the run's batches, seed 0, deterministic. Its state dict and the norms returned."""
    opt = torch_optimizer(optimizer, module)
    scheduler = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor) if lr_factor else None
    batches = batch_source(None, example_args, torch.device("cpu"), 0)
    norms = []
    torch.manual_seed(0)
    with deterministic(torch.device("cpu")):
        for i in range(steps):
            opt.zero_grad(set_to_none=True)
            module(*batches(i)).backward()
            if max_norm is not None:
                norms.append(float(torch.nn.utils.clip_grad_norm_(module.parameters(),
                                                                  max_norm)))
            opt.step()
            if scheduler is not None:
                scheduler.step()
    return module.state_dict(), norms


def assert_same_model(mine: torch.nn.Module, theirs: torch.nn.Module) -> None:
    for (name, a), (_, b) in zip(mine.state_dict().items(), theirs.state_dict().items()):
        assert torch.equal(a, b), name


def trainable_count(module: torch.nn.Module) -> int:
    return sum(1 for p in module.parameters() if p.requires_grad)
