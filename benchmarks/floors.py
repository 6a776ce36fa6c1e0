"""Memory floors: how small a budget each model can train in, once every byte is planned.

For each model it prints the plain peak (plain PyTorch: parameters, .grad buffers and optimizer
state resident, one optimizer step after the backward), the floor (the least budget) of the
graph as captured by default for a small board (fused updates, parameters and optimizer state
homed on flash, refined to single ops where memory is decided) as a fraction and in bytes, and
what sets it: the largest node's inputs + output + workspace. Beside it, the floor without
paging (edge_remat_agent/pebbling.py: a tensor then comes back only with its inputs, so
whichever input of a node arrives last needs its own inputs beside the others). With --run, it
also plans without paging at 1.05x that floor, or the next of RUN_FACTORS that plans, and
trains in this process: tensor-ledger peak against the budget, median step time against plain
eager PyTorch (run in the same process), and whether the parameters after the steps equal plain
PyTorch's bit for bit.

    python benchmarks/floors.py                     # floors of the issue's models
    python benchmarks/floors.py --run --models resnet18,bert-mini --steps 3
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "host"), str(ROOT / "agent")]

import torch  # noqa: E402

from edge_remat_agent.capture import capture_model  # noqa: E402
from edge_remat_agent.capture.optimizer import torch_optimizer  # noqa: E402
from edge_remat_agent.executor.batches import batch_source  # noqa: E402
from edge_remat_agent.executor.gradcheck import deterministic  # noqa: E402
from edge_remat_agent.executor.run import run_plan  # noqa: E402
from edge_remat_agent.executor.step import plain_step  # noqa: E402
from edge_remat_agent.floor import describe_floor, floor_node  # noqa: E402
from edge_remat.planner.build import build_problem, plain_peak_bytes  # noqa: E402
from edge_remat.planner.problem import ProblemError  # noqa: E402
from edge_remat.planner.solve import NoPlan, solve  # noqa: E402

from arguments import names_among, positive_float, positive_int  # noqa: E402 - a neighbour

# The models and shapes, and its targets (smallest budget / plain peak).
MODELS = {
    "resnet18": (dict(batch=64, image=32), "sgd", 0.15),
    "mobilenet_v2": (dict(batch=32, image=64), "sgd", 0.20),
    "bert-mini": (dict(batch=16, seq=128), "sgd", 0.30),
    "gpt2-small": (dict(batch=4, seq=128), "sgd", 0.25),
    "gpt2-small-lora": (dict(batch=4, seq=128), "adamw", 0.40),
}
MIB = 2 ** 20


def floor_of(name: str, shape: dict, optimizer: str, max_nodes: int, home: str):
    start = time.perf_counter()
    captured = capture_model(name, optimizer=optimizer, params_home=home, max_nodes=max_nodes,
                             **shape)
    capture_s = time.perf_counter() - start
    graph = captured.graph
    problem = build_problem(graph, 2 ** 50, paging="none")
    need, k = floor_node(graph, problem.workspace)
    # without paging a tensor comes back only with its inputs: the pebbling floor
    no_paging = problem.smallest_budget()[0]
    return captured, plain_peak_bytes(graph), problem.fixed + need, no_paging, \
        describe_floor(graph, k, problem.workspace), capture_s


# Budgets tried, x the floor without paging, until one plans.
RUN_FACTORS = (1.05, 1.1, 1.15, 1.2, 1.25, 1.5)


def run_at(captured, smallest: int, steps: int, time_limit: float) -> dict:
    """Plan at the lowest of RUN_FACTORS x the floor that plans, train, compare with eager."""
    graph = captured.graph
    reference = copy.deepcopy(captured.module)
    for factor in RUN_FACTORS:
        try:
            problem = build_problem(graph, int(smallest * factor), paging="none")
            plan = solve(problem, "auto", time_limit).plan
            break
        except (NoPlan, ProblemError):
            continue
    else:
        return {"planned_at": None}
    with tempfile.TemporaryDirectory() as pages:
        report = run_plan(graph, plan, steps, pages, captured=captured, seed=0,
                          check_gradients=False, keep_parameters=True)
    optimizer = torch_optimizer(graph.capture["optimizer"], reference)
    batches = batch_source(None, captured.example_args, torch.device("cpu"), 0)
    eager_s = []
    torch.manual_seed(0)
    with deterministic(torch.device("cpu")):
        for i in range(steps):
            start = time.perf_counter()
            plain_step(reference, optimizer, batches(i))
            eager_s.append(time.perf_counter() - start)
    expected, actual = reference.state_dict(), captured.module.state_dict()
    exact = all(torch.equal(expected[n], actual[n]) for n in expected)
    planned_s = [s["step_time_s"] for s in report["steps"]]
    return {"planned_at": factor, "budget": plan.budget_bytes,
            "ledger_peak": max(s["ledger_peak_bytes"] for s in report["steps"]),
            "step_ratio": statistics.median(planned_s) / statistics.median(eager_s),
            "recomputed": report["recomputed"], "exact": exact}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=names_among(MODELS, "model"), default=",".join(MODELS))
    parser.add_argument("--max-nodes", type=positive_int, default=200)
    parser.add_argument("--home", default="flash", choices=("ram", "flash"))
    parser.add_argument("--run", action="store_true",
                        help="plan without paging from 1.05x its floor up and train")
    parser.add_argument("--steps", type=positive_int, default=3)
    parser.add_argument("--time-limit", type=positive_float, default=30.0)
    args = parser.parse_args()
    print(f"{'model':16} {'nodes':>5} {'plain peak':>11} {'floor':>10} {'floor/plain':>11} "
          f"{'target':>6} {'no paging':>10} {'/plain':>6}  what sets the floor")
    for name in args.models:
        shape, optimizer, target = MODELS[name]
        captured, plain, smallest, no_paging, what, capture_s = floor_of(
            name, shape, optimizer, args.max_nodes, args.home)
        fraction = smallest / plain
        print(f"{name:16} {len(captured.graph):5d} {plain / MIB:9.1f}Mi {smallest / MIB:8.1f}Mi "
              f"{fraction:10.1%} {'met' if fraction <= target else 'no':>6} "
              f"{no_paging / MIB:8.1f}Mi {no_paging / plain:6.1%}  {what} "
              f"[capture {capture_s:.1f} s]", flush=True)
        if args.run:  # it plans without paging: from that floor
            row = run_at(captured, no_paging, args.steps, args.time_limit)
            if row["planned_at"] is None:
                print(f"{'':16} no plan found up to 1.5x the floor in {args.time_limit:.0f} s")
                continue
            print(f"{'':16} planned at {row['planned_at']:.2f}x the floor without paging "
                  f"({row['budget'] / MIB:.1f} MiB): ledger peak {row['ledger_peak'] / MIB:.1f} "
                  f"MiB, step {row['step_ratio']:.2f}x eager, {row['recomputed']} recomputed, "
                  f"parameters after {args.steps} steps "
                  f"{'bitwise equal to' if row['exact'] else 'DIFFERENT from'} plain PyTorch",
                  flush=True)


if __name__ == "__main__":
    main()
