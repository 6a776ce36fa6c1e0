"""The arena executor against the glibc executor: physical memory under a memory cgroup, and
step time.

For each model and budget (50% of plain training's memory beyond fixed memory, and the model's
floor with 2% room) it plans
(recomputation only: pages would put the page cache in the cgroup's figures), lays the plan's
tensors out in one arena (CP-SAT, started from the best fit), and runs the plan twice, once per
executor, each in a fresh process inside a fresh memory cgroup (root, cgroup v1 or v2). The
child captures the model, resets the cgroup's peak, then runs the steps; the run report states
the runtime baseline (what the kernel charged before the first step, less the model's resident
parameters) and the child reads the cgroup's peak afterwards. It prints, per row:

  planned   the plan's predicted peak (tensors + fixed memory + the running node's workspace,
            measured here by default: --workspace measured|graph). Measured, fixed memory
            also counts what the ops' first calls leave for the life of the process (oneDNN's
            primitives: profiler.ops runtime_warm_bytes, "warm" under the row), measured in a
            fresh process as the runs are: the runtime baseline is taken before their first
            step, so it holds none of it
  arena     the arena's size (+ fixed memory) and its size over the planned tensor peak
  phys      kernel peak - runtime baseline, per executor, and over the planned peak (the
            peak of the steps before the last, which runs under the allocator's profiler):
            the lowest of the --rounds runs; the line under the row gives their range (one
            process's figure varies from the next: bert-mini b16 at 50% 1.03-1.10x the plan
            under either executor, docs/memory.md)
  step      median step time (steps after the first, the counted step left out), per executor:
            wall seconds, and CPU seconds (user + system, getrusage; the child runs torch on
            --threads threads): on a shared machine only the CPU time compares
  allocs    CPU allocator events in one step (count, MiB), per executor; copied MiB (arena)
  malloc    the malloc the arena executor's process ran under (--malloc: jemalloc or tcmalloc
            preloaded, executor/allocator.py; its heap trims are then that malloc's purge);
            the glibc executor always runs under glibc's, the baseline

    python benchmarks/arena.py                    # the issue's shapes (slow on 2 cores)
    python benchmarks/arena.py --quick            # small shapes, a few minutes
    python benchmarks/arena.py --quick --malloc glibc   # the arena under glibc's malloc
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "host"), str(ROOT / "agent")]
from edge_remat_agent.allocator import (MALLOCS, malloc_library,  # noqa: E402
                                        missing_malloc, preload_environment)

from arguments import (comma_list, int_at_least, names_among,  # noqa: E402 - a neighbour
                       non_negative_int, positive_float, positive_float_or, positive_int)

MODELS = {"resnet18": dict(batch=64, image=32), "mobilenet_v2": dict(batch=32, image=64),
          "bert-mini": dict(batch=16, seq=128)}
QUICK = {"resnet18": dict(batch=16, image=32), "mobilenet_v2": dict(batch=8, image=32),
         "bert-mini": dict(batch=4, seq=64)}
MIB = 2 ** 20


def plan_row(name: str, shape: dict, budget: str, work: Path, time_limit: float,
             measured: dict | None = None) -> dict:
    """`measured`: measured_memory's answer for this model (None: the capture's figures)."""
    from edge_remat.planner.arena import plan_arena
    from edge_remat.planner.build import build_problem, plain_peak_bytes
    from edge_remat.planner.problem import InfeasibleBudget
    from edge_remat.planner.solve import solve
    from edge_remat_agent.capture import capture_model
    captured = capture_model(name, **shape)
    graph = captured.graph
    if measured is not None:
        count_measured_memory(graph, measured)
    plain = plain_peak_bytes(graph)
    if budget == "floor":
        smallest, _ = build_problem(graph, 2 ** 50, paging="none").smallest_budget()
        problem = build_problem(graph, int(smallest * 1.02), paging="none")
    else:
        # A fraction of what plain training holds beyond fixed memory (parameters, gradients,
        # optimizer state stay in RAM here: a fraction of the whole would not fit them).
        fixed = graph.fixed_bytes
        problem = build_problem(graph, int(fixed + float(budget) * (plain - fixed)),
                                paging="none")
    try:
        problem.check_budget()
    except InfeasibleBudget as below:
        problem = build_problem(graph, int(below.smallest_bytes * 1.02), paging="none")
    from edge_remat.planner.solve import NoPlan
    for _ in range(4):  # the floor is a bound: a schedule may need a little more
        try:
            plan = solve(problem, "auto", time_limit).plan
            break
        except NoPlan:
            problem = build_problem(graph, int(problem.budget_bytes * 1.05), paging="none")
    else:
        raise SystemExit(f"error: no plan for {name} near budget {budget}")
    plan.arena = plan_arena(graph, plan, problem.costs, "cpsat", time_limit)
    stem = f"{name}-{budget}"
    graph.save(work / f"{stem}.graph.json")
    plan.save(work / f"{stem}.plan.json")
    return {"model": name, "budget": budget, "plain_peak": plain, "stem": stem,
            "budget_bytes": plan.budget_bytes, "planned_peak": plan.predicted["peak_bytes"],
            "fixed": graph.fixed_bytes, "arena": plan.arena.size_bytes,
            "arena_over": plan.arena.details["over_tensor_peak"],
            "arena_status": plan.arena.details["status"],
            "warm": (graph.capture.get("fixed") or {}).get("runtime_warm", 0)}


def measured_memory(name: str, shape: dict, threads: int = 1) -> dict:
    """What one plain step, run node by node in a fresh process (the op profiler's memory
    half, profiler.ops.measure_workspace), found: each node's workspace (allocator events and
    the resident set) and what the nodes' first calls left behind (runtime_warm_bytes). A
    fresh process, because a process where the ops ran already (an earlier model, budget or
    capture here) keeps their primitives and would find none."""
    command = [sys.executable, __file__, "--measure", json.dumps(
        {"model": name, "shape": shape, "threads": threads})]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"measuring {name}: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure_main(spec: dict) -> None:
    import torch
    torch.set_num_threads(spec.get("threads", 1))
    from edge_remat_agent.capture import capture_model
    from edge_remat_agent.profiler.ops import measure_workspace, runtime_warm_bytes
    captured = capture_model(spec["model"], **spec["shape"])
    found = measure_workspace(captured)
    print(json.dumps({"workspace": [found[n.id].workspace_bytes if n.id in found else None
                                    for n in captured.graph.nodes],
                      "warm": runtime_warm_bytes(found.values()) or 0}))


def count_measured_memory(graph, measured: dict) -> None:
    """Each node's workspace in the graph becomes the measured one where that is more than the
    capture's figure: the plan then counts the scratch ATen and oneDNN take inside a node, as
    a plan made with a measured profile does. What the first calls left behind becomes fixed
    memory (`capture.fixed.runtime_warm`): every schedule, plain PyTorch's too, pays it."""
    for node, found in zip(graph.nodes, measured["workspace"]):
        if found is not None:
            node.workspace_bytes = max(node.workspace_bytes, found)
    fixed = graph.capture.setdefault("fixed", {})
    warm = int(measured["warm"])
    added = warm - int(fixed.get("runtime_warm", 0))
    graph.fixed_bytes += added
    fixed["total"] = int(fixed.get("total", 0)) + added
    fixed["runtime_warm"] = warm


def run_child(row: dict, shape: dict, allocator: str, steps: int, work: Path,
              threads: int = 1, onednn_cache: int | None = None, malloc: str = "glibc") -> dict:
    """One run in a fresh memory cgroup; the child's JSON result. `onednn_cache`: oneDNN's
    primitive cache capacity, set in the child's environment before torch starts. `malloc`:
    the malloc the child is started under (preloaded)."""
    from edge_remat.cgroup import MemoryCgroup
    name = f"arena-bench-{os.getpid()}"
    group = MemoryCgroup.ensure(name, 16 * 2 ** 30)
    try:
        command = [*group.exec_prefix(), sys.executable, __file__, "--child", json.dumps(
            {"work": str(work), "stem": row["stem"], "model": row["model"], "shape": shape,
             "allocator": allocator, "steps": steps, "group": name, "threads": threads})]
        env, _ = preload_environment(malloc)
        if onednn_cache is not None:
            env["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = str(onednn_cache)
        done = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
        if done.returncode != 0:
            raise RuntimeError(f"{row['stem']} {allocator}: {done.stderr.strip()[-2000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        group.kill_all()
        group.remove()


def child_main(spec: dict) -> None:
    import gc
    import resource

    import torch
    torch.set_num_threads(spec.get("threads", 1))

    from edge_remat_agent.allocator import give_back_freed_memory, running_malloc
    from edge_remat_agent.capture import capture_model
    from edge_remat.cgroup import MemoryCgroup
    from edge_remat_agent.executor.run import run_plan
    from edge_remat_agent.formats import load_graph, load_plan
    work = Path(spec["work"])
    graph = load_graph(work / f"{spec['stem']}.graph.json")
    plan = load_plan(work / f"{spec['stem']}.plan.json")
    captured = capture_model(spec["model"], **spec["shape"])
    for mine, planned in zip(captured.graph.nodes, graph.nodes):  # the measured workspace
        mine.workspace_bytes = planned.workspace_bytes
    captured.graph.fixed_bytes = graph.fixed_bytes  # and the first calls' memory
    captured.graph.capture["fixed"] = graph.capture.get("fixed")
    gc.collect()
    give_back_freed_memory()  # under jemalloc its purge: its dirty pages are not the baseline
    group = MemoryCgroup.existing(spec["group"])
    group.reset_peak()
    peaks = []
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu_marks = [usage.ru_utime + usage.ru_stime]
    fault_marks = [usage.ru_minflt]

    def before_the_counted_step(i, steps, record):
        usage = resource.getrusage(resource.RUSAGE_SELF)
        cpu_marks.append(usage.ru_utime + usage.ru_stime)
        fault_marks.append(usage.ru_minflt)
        if i == steps - 2:
            peaks.append(group.peak_bytes())

    # The last step runs under the profiler that counts allocator events, whose own buffers
    # the cgroup charges too (mobilenet_v2: tens of MiB): the peak is read before it.
    report = run_plan(graph, plan, spec["steps"], None, captured=captured, seed=0,
                      check_gradients=False, allocator=spec["allocator"],
                      count_allocations=True, progress=before_the_counted_step)
    peak = peaks[0]
    stat = _memory_stat(group.path)
    timed = [r["step_time_s"] for r in report["steps"][1:-1]] or \
        [report["steps"][-1]["step_time_s"]]
    cpu = [b - a for a, b in zip(cpu_marks, cpu_marks[1:])]
    faults = [b - a for a, b in zip(fault_marks, fault_marks[1:])]
    last = report["steps"][-1]
    print(json.dumps({"step_cpu_s": statistics.median(cpu[1:-1] or cpu[-1:]),
                      "step_faults": statistics.median(faults[1:-1] or faults[-1:]),
                      "kernel_peak": peak, "kernel_peak_profiled": group.peak_bytes(), "baseline": report["runtime_baseline_bytes"],
                      "step_s": statistics.median(timed),
                      "allocations": last.get("cpu_allocations"), "arena": last.get("arena"),
                      "ledger_peak": max(r["ledger_peak_bytes"] for r in report["steps"]),
                      # Where the charged bytes are at the end: anonymous memory against page
                      # cache (files read or written), and what the runtime baseline was.
                      "anon_end": stat.get("total_rss", stat.get("anon")),
                      "file_end": stat.get("total_cache", stat.get("file")),
                      "usage_end": group.usage_bytes(), "malloc": running_malloc()}))


def _memory_stat(path: Path) -> dict[str, int]:
    try:
        lines = (path / "memory.stat").read_text().splitlines()
    except OSError:
        return {}
    return {k: int(v) for k, v in (line.split() for line in lines) if v.isdigit()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small shapes")
    parser.add_argument("--models", type=names_among(MODELS, "model"), default=",".join(MODELS))
    parser.add_argument("--budgets", type=comma_list(positive_float_or("floor")),
                        default="0.5,floor")
    parser.add_argument("--steps", type=int_at_least(3), default=5, help="steps per run (>= 3)")
    parser.add_argument("--rounds", type=positive_int, default=1,
                        help="runs per executor, alternating")
    parser.add_argument("--time-limit", type=positive_float, default=30.0,
                        help="planner seconds")
    parser.add_argument("--workspace", choices=("measured", "graph"), default="measured",
                        help="each node's workspace: measured here (the op profiler's memory "
                             "pass) or the capture's figure")
    parser.add_argument("--threads", type=positive_int, default=1,
                        help="torch threads in each run (CPU time is summed over threads)")
    parser.add_argument("--onednn-cache", type=non_negative_int, default=None, metavar="N",
                        help="ONEDNN_PRIMITIVE_CACHE_CAPACITY for both executors' runs "
                             "(default: oneDNN's own, 1024)")
    parser.add_argument("--malloc", choices=MALLOCS, default="jemalloc",
                        help="the malloc the arena executor's runs are started under "
                             "(preloaded; the glibc executor's stay under glibc's)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_main(json.loads(args.child))
        return 0
    if args.measure:
        measure_main(json.loads(args.measure))
        return 0
    from edge_remat.cgroup import unavailable_reason
    reason = unavailable_reason()
    if reason:
        print(f"error: this benchmark measures under a memory cgroup: {reason}",
              file=sys.stderr)
        return 2
    if args.malloc != "glibc" and malloc_library(args.malloc) is None:
        print(f"error: --malloc {args.malloc}: {missing_malloc(args.malloc)}, or pass "
              "--malloc glibc", file=sys.stderr)
        return 2
    shapes = QUICK if args.quick else MODELS
    header = (f"{'model':<13}{'budget':>7}{'planned':>9}{'arena':>9}{'/tens':>6}"
              f"{'phys glibc':>14}{'phys arena':>14}{'step s glibc':>13}{'step s arena':>13}"
              f"{'arena/glibc':>12}{'allocs glibc':>14}{'allocs arena':>14}{'copied':>7}"
              f"{'malloc':>10}")
    print("MiB; phys = kernel peak - runtime baseline (x planned peak); step s = median "
          "seconds a step, wall / CPU; arena/glibc = their ratio, wall / CPU; allocs = CPU "
          "allocator events in one step (count / MiB)")
    print(header)
    with tempfile.TemporaryDirectory(prefix="arena-bench-") as tmp:
        work = Path(tmp)
        for name in args.models:
            measured = measured_memory(name, shapes[name], args.threads) \
                if args.workspace == "measured" else None
            for budget in args.budgets:
                row = plan_row(name, shapes[name], budget, work, args.time_limit, measured)
                runs: dict[str, list[dict]] = {"glibc": [], "arena": []}
                for r in range(args.rounds):
                    order = ("glibc", "arena") if r % 2 == 0 else ("arena", "glibc")
                    for allocator in order:
                        runs[allocator].append(run_child(row, shapes[name], allocator,
                                                         args.steps, work, args.threads,
                                                         args.onednn_cache,
                                                         args.malloc if allocator == "arena"
                                                         else "glibc"))
                print(_line(row, runs), flush=True)
                print(_where(runs, row), flush=True)
    return 0


def _where(runs: dict[str, list[dict]], row: dict) -> str:
    """Where the bytes beyond the plan went, per executor (the last run): the runtime
    baseline, anonymous memory and page cache charged at the end, and the CPU allocator's own
    peak of live bytes within one step (what ATen allocated outside the arena)."""
    parts = []
    for a in ("glibc", "arena"):
        r = runs[a][-1]
        mib = [(r.get(k) or 0) / MIB for k in ("baseline", "anon_end", "file_end")]
        cpu = ((r.get("allocations") or {}).get("peak_bytes") or 0) / MIB
        profiled = ((r.get("kernel_peak_profiled") or 0) - r["kernel_peak"]) / MIB
        released = ((r.get("arena") or {}).get("released_bytes") or 0) / MIB
        faults = statistics.median(x.get("step_faults", 0) for x in runs[a])
        peaks = [(x["kernel_peak"] - x["baseline"]) / MIB for x in runs[a]]
        spread = (f"phys {min(peaks):.1f}-{max(peaks):.1f} over {len(peaks)} runs, "
                  if len(peaks) > 1 else "")
        parts.append(f"{a}: {spread}baseline {mib[0]:.1f}, anon {mib[1]:.1f} + file "
                     f"{mib[2]:.1f} at "
                     f"the end, CPU allocator peak {cpu:.1f}, profiled step +{profiled:.1f}, "
                     f"minor faults {faults:.0f} a step"
                     + (f", pages given back {released:.1f} a step, heap trims "
                        f"{(r.get('arena') or {}).get('heap_trims', 0)}" if a == "arena" else ""))
    return f"    warm {row['warm'] / MIB:.1f} (in planned); " + "; ".join(parts)


def _line(row: dict, runs: dict[str, list[dict]]) -> str:
    def phys(a):
        best = min(r["kernel_peak"] - r["baseline"] for r in runs[a])
        return f"{best / MIB:.1f} ({best / row['planned_peak']:.2f}x)"

    def step(a, key="step_s"):
        return statistics.median(r[key] for r in runs[a])

    def steps(a):
        return f"{step(a):.3f}/{step(a, 'step_cpu_s'):.3f}"
    ratio = (f"{step('arena') / step('glibc'):.2f}/"
             f"{step('arena', 'step_cpu_s') / step('glibc', 'step_cpu_s'):.3f}")

    def allocs(a):
        counted = runs[a][-1]["allocations"] or {}
        return f"{counted.get('count', 0)} / {counted.get('bytes', 0) / MIB:.0f}"
    copied = (runs["arena"][-1]["arena"] or {}).get("copied_bytes", 0) / MIB
    budget = row["budget"] if row["budget"] == "floor" else f"{float(row['budget']):.0%}"
    return (f"{row['model']:<13}{budget:>7}{row['planned_peak'] / MIB:>9.1f}"
            f"{(row['arena'] + row['fixed']) / MIB:>9.1f}{row['arena_over']:>6.3f}"
            f"{phys('glibc'):>14}{phys('arena'):>14}{steps('glibc'):>13}"
            f"{steps('arena'):>13}{ratio:>12}"
            f"{allocs('glibc'):>14}{allocs('arena'):>14}{copied:>7.1f}"
            f"{runs['arena'][-1].get('malloc', '?'):>10}")


if __name__ == "__main__":
    sys.exit(main())
