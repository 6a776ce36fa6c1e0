"""The executor, the arena, paging and the op profiler on a CUDA device (a Jetson's GPU, or any
NVIDIA GPU standing in for one), against plain eager PyTorch on the same device.

Per model and budget (50% and 25% of plain training's memory beyond fixed memory) it plans on this machine (recomputation only; CP-SAT where OR-Tools is installed),
lays the plan out in an arena, and runs, each on the device:

  eager     plain PyTorch training (`run_plain`)
  ours      the plan, tensors from PyTorch's caching allocator (the default executor)
  arena     the plan, every planned tensor in one `torch.empty` laid out by the plan
  paged     (--paging) a plan that pages to host memory at 30%, overlapped on a CUDA stream,
            under each allocator

With --every-byte the models are captured as this wave plans them: one node per allocating ATen
op, parameters and Adam's state homed on flash (a page folder of its own), so the device holds
a parameter group only between its param node and its update.

and prints per row: the planned peak, the device's peak of allocated bytes (the caching
allocator's `max_memory_allocated`, reset before each step, the first step's gradient check
left out) and of reserved bytes (what the allocator took from the driver), both over the
planned peak; the median step time over eager's; and the first step's gradient check
(deterministic algorithms, CUBLAS_WORKSPACE_CONFIG set here): against eager on the CPU, against
the captured step replayed plainly on a device, where eager takes other kernels (executor/
gradcheck.py); the eager row compares two eager steps from the same state: the device's own
determinism).
Then the op profiler on the device: the sum of its per-node in-context times against the
measured step time of eager (close to 1 when every node is timed to its completion).

    python benchmarks/cuda.py                 # on a machine with a CUDA GPU
    python benchmarks/cuda.py --device cpu    # the same path on the CPU (no device figures)
    python benchmarks/cuda.py --every-byte --budgets 0.3 --no-profile
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
from pathlib import Path

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS's deterministic mode
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "host"), str(ROOT / "agent")]

from arguments import (comma_list, names_among, positive_float,  # noqa: E402 - a neighbour
                       positive_float_or, positive_int)

MODELS = {"resnet18": dict(batch=64, image=64), "mobilenet_v2": dict(batch=32, image=64),
          "bert-mini": dict(batch=16, seq=128)}
MIB = 2 ** 20
MODEL_SHAPE = ("batch", "image", "seq")
# --every-byte: this wave's graphs (one node per allocating ATen op, parameters and Adam's state
# homed on flash, read at each param node and written back by each update)
EVERY_BYTE = {"operator_level": True, "params_home": "flash", "optimizer": "adam"}


def host_tier(device: str):
    """The `host` tier as the executor pages to it from `device` (the page store's put and
    get of a 16 MiB tensor, the device's copies included), measured here."""
    import time

    import torch

    from edge_remat_agent.devices import synchronize
    from edge_remat_agent.formats.profile import Tier
    from edge_remat_agent.pages.memory import MemoryStore
    store, value = MemoryStore(), torch.randn(4 * MIB, device=device)
    nbytes = value.numel() * value.element_size()
    times = {"put": [], "get": []}
    for i in range(6):
        synchronize(device)
        start = time.perf_counter()
        store.put(i, value)
        times["put"].append(time.perf_counter() - start)
        start = time.perf_counter()
        store.get(i)
        synchronize(device)
        times["get"].append(time.perf_counter() - start)
        store.discard(i)
    put, get = (statistics.median(t[1:]) for t in times.values())
    return Tier(read_bytes_per_s=nbytes / get, write_bytes_per_s=nbytes / put)


def make_plan(graph, budget: str, time_limit: float, paging: str = "none", tiers=None):
    from edge_remat.planner.arena import plan_arena
    from edge_remat.planner.build import build_problem, plain_peak_bytes
    from edge_remat.planner.problem import InfeasibleBudget
    from edge_remat.planner.solve import NoPlan, solve
    plain, fixed = plain_peak_bytes(graph), graph.fixed_bytes
    if budget == "floor":
        smallest, _ = build_problem(graph, 2 ** 50, paging=paging,
                                    tiers=tiers).smallest_budget()
        budget_bytes = int(smallest * 1.02)
    else:
        budget_bytes = int(fixed + float(budget) * (plain - fixed))
    problem = build_problem(graph, budget_bytes, paging=paging, tiers=tiers)
    try:
        problem.check_budget()
    except InfeasibleBudget as below:
        problem = build_problem(graph, int(below.smallest_bytes * 1.02), paging=paging,
                                tiers=tiers)
    solver = "auto" if _has_ortools() else "heuristic:peak-split"
    for _ in range(4):  # the floor is a bound: a schedule may need a little more
        try:
            plan = solve(problem, solver, time_limit).plan
            break
        except NoPlan:
            problem = build_problem(graph, int(problem.budget_bytes * 1.05), paging=paging,
                                    tiers=tiers)
    else:
        raise SystemExit(f"error: no plan for {graph.name} near budget {budget}")
    plan.arena = plan_arena(graph, plan, problem.costs, "best-fit", time_limit)
    return plan


def _has_ortools() -> bool:
    return importlib.util.find_spec("ortools") is not None


def measured(report: dict, skip_first: bool) -> dict:
    steps = report["steps"][1:] if skip_first and len(report["steps"]) > 1 else report["steps"]
    peaks = [s.get("device_peak_bytes") for s in steps]
    reserved = [s.get("device_reserved_peak_bytes") for s in steps]
    return {"step_s": statistics.median(s["step_time_s"] for s in steps),
            "peak": max(peaks) if None not in peaks else None,
            "reserved": max(reserved) if None not in reserved else None,
            "bitwise": _grad_summary(report.get("grad_check"))}


def _grad_summary(check: dict | None) -> str:
    if not check:
        return "-"
    if check["bitwise_equal"]:
        return "equal"
    return (f"{len(check['differing'])}/{check['compared']} differ, max {check['max_abs_diff']:.1e}"
            f"{'' if check['loss_equal'] else ', loss differs'}")


def eager_twice(name: str, shape: dict, device: str) -> str:
    """Two eager steps from the same parameters, batch and generator state, compared as ours
    is compared with eager: whether the device's kernels are deterministic here at all."""
    import torch

    from edge_remat_agent.capture import capture_model
    from edge_remat_agent.executor.gradcheck import compare, deterministic, eager_reference
    captured = capture_model(name, **{k: v for k, v in shape.items() if k in MODEL_SHAPE})
    device = torch.device(device)
    module = captured.module.to(device)
    batch = tuple(a.to(device) if isinstance(a, torch.Tensor) else a
                  for a in captured.example_args)
    with deterministic(device):
        first = eager_reference(module, batch, device)
        second = eager_reference(module, batch, device)
    return _grad_summary(compare(first, second.loss, second.grads, module))


def fresh(device: str) -> None:
    """The previous run's blocks given back, so each run's reserved peak is its own."""
    import gc

    import torch
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def run_row(name: str, shape: dict, budget: str, steps: int, device: str, time_limit: float,
            paging: str = "none", capture: dict | None = None) -> list[dict]:
    """`capture`: more capture_model options (--every-byte's)."""
    import tempfile

    from edge_remat_agent.capture import capture_model
    from edge_remat_agent.executor.run import run_plain, run_plan
    shape = {**shape, **(capture or {})}
    captured = capture_model(name, **shape)
    graph = captured.graph
    tiers = {"host": host_tier(device)} if paging == "host" else None
    plan = make_plan(graph, budget, time_limit, paging, tiers)
    planned = plan.predicted["peak_bytes"]
    rows = []
    fresh(device)
    eager = run_plain(graph, steps, device=device, seed=0,
                      model=(captured.module, captured.example_args))
    rows.append({"run": "eager", **measured(eager, skip_first=True), "pages": 0})
    rows[-1]["bitwise"] = "twice: " + eager_twice(name, shape, device)
    pages = tempfile.mkdtemp(prefix="cuda-bench-")  # parameters homed on flash live here
    for label, allocator in [("ours", "glibc"), ("arena", "arena")]:
        captured = capture_model(name, **shape)  # each run trains its own
        fresh(device)
        report = run_plan(graph, plan, steps, pages, captured=captured, seed=0, device=device,
                          allocator=allocator, check_gradients=True)
        rows.append({"run": label if paging == "none" else f"{label}, paged to host",
                     **measured(report, skip_first=True), "pages": report.get("page_ins"),
                     "arena": (report.get("arena") or {}).get("size_bytes")})
    for row in rows:
        row.update(model=name, budget=budget, planned=planned, plain=eager)
    return rows


def profile_row(name: str, shape: dict, device: str) -> dict:
    from edge_remat_agent.capture import capture_model
    from edge_remat_agent.executor.run import run_plain
    from edge_remat_agent.profiler.ops import measure_nodes
    captured = capture_model(name, **shape)
    nodes = measure_nodes(captured, device=device, context_steps=3)
    summed = sum(n.time_s for n in nodes)
    isolated = sum(n.isolated_time_s or 0.0 for n in nodes)
    captured = capture_model(name, **shape)
    eager = run_plain(captured.graph, 4, device=device, seed=0,
                      model=(captured.module, captured.example_args))
    step = statistics.median(s["step_time_s"] for s in eager["steps"][1:])
    workspace = sum(n.workspace_bytes for n in nodes)
    return {"model": name, "nodes": len(nodes), "sum_in_context_s": summed,
            "sum_isolated_s": isolated, "eager_step_s": step, "workspace_sum": workspace}


def _mib(value) -> str:
    return "-" if value is None else f"{value / MIB:.1f}"


def _over(value, planned) -> str:
    return "-" if value is None else f"{value / planned:.2f}x"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--models", type=names_among(MODELS, "model"), default=",".join(MODELS))
    parser.add_argument("--budgets", type=comma_list(positive_float_or("floor")),
                        default="0.5,0.25")
    parser.add_argument("--steps", type=positive_int, default=5)
    parser.add_argument("--time-limit", type=positive_float, default=10.0)
    parser.add_argument("--paging", action="store_true",
                        help="also a plan paging to host memory at 30%%")
    parser.add_argument("--no-profile", action="store_true", help="skip the op profiler rows")
    parser.add_argument("--small", action="store_true", help="small shapes (a quick look)")
    parser.add_argument("--every-byte", action="store_true",
                        help="capture operator-level, parameters and Adam's state on flash")
    args = parser.parse_args()
    import torch
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("error: no CUDA device here (torch.cuda.is_available() is False): "
              "run with --device cpu for the CPU path", file=sys.stderr)
        return 2
    if args.device.startswith("cuda"):
        print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
              f"CUDA {torch.version.cuda}, PYTORCH_CUDA_ALLOC_CONF "
              f"{os.environ.get('PYTORCH_CUDA_ALLOC_CONF', '(unset)')}")
    shapes = {k: ({"batch": max(2, v["batch"] // 8), **{n: m for n, m in v.items()
                                                       if n != "batch"}} if args.small else v)
              for k, v in MODELS.items()}
    print(f"\n{'model':14} {'budget':6} {'run':22} {'planned':>8} {'alloc':>8} {'/plan':>6} "
          f"{'reserved':>9} {'/plan':>6} {'step s':>8} {'/eager':>7} {'page-ins':>8} "
          f"gradient check", flush=True)
    for name in args.models:
        budgets = [(b, "none") for b in args.budgets]
        budgets += [("0.3", "host")] if args.paging else []
        for budget, paging in budgets:
            try:
                rows = run_row(name, shapes[name], budget, args.steps, args.device,
                               args.time_limit, paging, EVERY_BYTE if args.every_byte else None)
            except (SystemExit, Exception) as error:  # noqa: BLE001 - the row says why
                print(f"{name:14} {budget:6} failed: {type(error).__name__}: {error}",
                      flush=True)
                continue
            for r in rows:
                eager_step = measured(r["plain"], skip_first=True)["step_s"]
                print(f"{r['model']:14} {r['budget']:6} {r['run']:22} {_mib(r['planned']):>8} "
                      f"{_mib(r['peak']):>8} {_over(r['peak'], r['planned']):>6} "
                      f"{_mib(r['reserved']):>9} {_over(r['reserved'], r['planned']):>6} "
                      f"{r['step_s']:8.4f} {r['step_s'] / eager_step:7.2f} "
                      f"{r['pages']:8} {r['bitwise']}", flush=True)
    if not args.no_profile:
        print(f"\n{'model':14} {'nodes':>5} {'sum in-context s':>17} {'sum isolated s':>15} "
              f"{'eager step s':>13} {'ratio':>6}")
        for name in args.models:
            p = profile_row(name, shapes[name], args.device)
            print(f"{p['model']:14} {p['nodes']:5} {p['sum_in_context_s']:17.4f} "
                  f"{p['sum_isolated_s']:15.4f} {p['eager_step_s']:13.4f} "
                  f"{p['sum_in_context_s'] / p['eager_step_s']:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
