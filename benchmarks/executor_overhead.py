#!/usr/bin/env python3
"""The executor's own overhead: the keep-all plan (nothing recomputed, nothing paged) against
plain eager PyTorch, in one process, interleaved, measured in CPU time as well as wall time.

On a shared machine wall time swings 2x with the other jobs' load; the process's CPU time
(user + system, getrusage) swings much less, so it is the figure a 3% target can be held to
here. Per round (in alternating order): five eager steps and one run_plan of the keep-all plan
of five steps; of each, the first two warm up (the optimizer's momentum, glibc's heap at its
steady size after the other method ran) and the next three are measured; per method the median over rounds of wall time, CPU time and minor
page faults per step. Ours' two warm-up steps are measured ones (the interpreter, the ledger
counting every tensor); they agree, so its three timed steps run compiled, the ledger's rise
replayed (executor/ledger_replay.py), as every later step of a run does. Both run with the
same process-wide settings (threads, glibc mallopt, as
run_plan leaves them after its first call; map_large_allocations=False as end_to_end.py does).

    python benchmarks/executor_overhead.py [--models bert-mini,resnet18,mobilenet_v2] [--rounds 7]
    python benchmarks/executor_overhead.py --profile bert-mini    # cProfile of the keep-all step
    python benchmarks/executor_overhead.py --runner-only          # the runner without the ops
    python benchmarks/executor_overhead.py --paired 40            # adjacent steps, paired
    python benchmarks/executor_overhead.py --accumulate 4         # and every pass measured

--paired N runs one keep-all run_plan with an eager step after each of its steps, and takes
the median of the per-pair CPU ratios (see `paired`).

--runner-only times the keep-all step with every ATen op taken out (each returns its result
from the first step): what the runner, its ledger and the interpreter cost by themselves, in
CPU time a step. Run warm in a loop, so it is a lower bound: in a real step the ops between
them evict the Python interpreter's caches (`perf`: libpython several times this figure).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile

import torch

from arguments import names_among, positive_int  # this script's neighbour

QUICK = {"resnet18": {"batch": 8, "image": 32}, "bert-mini": {"batch": 8, "seq": 64},
         "mobilenet_v2": {"batch": 8, "image": 32}}
WARM_STEPS, TIMED_STEPS = 2, 3  # as benchmarks/end_to_end.py times ours
TARGET = 1.03


def keep_all_plan(graph):
    from edge_remat.planner.build import build_problem
    from edge_remat.planner.solve import solve
    return solve(build_problem(graph, f"{2**50}B", None, "time", None, "none"), "auto",
                 time_limit=10).plan


def bench(name: str, rounds: int, page_dir: str, accumulate: int = 1) -> dict:
    """`accumulate` K > 1: K micro-batches a step, eager's as plain_step sums them; ours is
    then also run with every micro-pass measured ("ours-measured", ledger_replay.AGREE out of
    reach), as accumulating runs were until their later micro-passes replayed compiled."""
    from edge_remat_agent.capture import capture_model
    from edge_remat_agent.capture.models import load_model
    from edge_remat_agent.capture.optimizer import torch_optimizer
    from edge_remat_agent.executor import ledger_replay, run_plan
    from edge_remat_agent.executor.step import plain_step
    from edge_remat_agent.profiler import LiveTensorLedger, StepMeter

    captured = capture_model(name, update="step", accumulate=accumulate, **QUICK[name])
    plan = keep_all_plan(captured.graph)
    module, batch = load_model(name, **QUICK[name])
    optimizer = torch_optimizer(captured.graph.capture.get("optimizer", "sgd"), module)
    agree = ledger_replay.AGREE

    def ours(measured: bool = False) -> list[tuple]:
        ledger_replay.AGREE = 10**9 if measured else agree
        try:
            report = run_plan(captured.graph, plan, WARM_STEPS + TIMED_STEPS, page_dir,
                              check_gradients=False, captured=captured,
                              map_large_allocations=False)
        finally:
            ledger_replay.AGREE = agree
        return [(s["step_time_s"], s["cpu_time_s"], s["minor_faults"],
                 s["rss_peak_kernel_bytes"]) for s in report["steps"][WARM_STEPS:]]

    def eager() -> list[tuple]:
        steps, ledger = [], LiveTensorLedger()  # the meter wants a ledger; eager fills none
        for _ in range(WARM_STEPS + TIMED_STEPS):  # as ours: warm-up steps, then timed ones
            with StepMeter(ledger) as meter:
                plain_step(module, optimizer, *[batch] * accumulate)
            m = meter.result
            steps.append((m.wall_s, m.cpu_s, m.minor_faults, m.rss_peak_kernel_bytes))
        return steps[WARM_STEPS:]

    methods = {"eager": eager, "ours": ours}
    if accumulate > 1:
        methods["ours-measured"] = lambda: ours(measured=True)
    ours()  # the first run_plan sets the process up (gc, allocator) as later ones find it
    samples: dict[str, list] = {method: [] for method in methods}
    ratios: dict[str, list] = {f"{what} {method}": [] for what in ("wall", "cpu")
                               for method in methods if method != "eager"}
    for r in range(rounds):
        order = list(methods) if r % 2 == 0 else list(reversed(methods))
        taken = {method: methods[method]() for method in order}
        for method, rows in taken.items():
            samples[method].extend(rows)
        for k, what in enumerate(("wall", "cpu")):
            for method in methods:
                if method != "eager":
                    ratios[f"{what} {method}"].append(
                        statistics.median(s[k] for s in taken[method])
                        / statistics.median(s[k] for s in taken["eager"]))
    out = {"model": name, "rounds": rounds, "accumulate": accumulate}
    for method, rows in samples.items():
        out[method] = {"wall_s": statistics.median(s[0] for s in rows),
                       "cpu_s": statistics.median(s[1] for s in rows),
                       "minor_faults": statistics.median(s[2] for s in rows),
                       "faulting_steps": sum(s[2] > 1000 for s in rows), "steps": len(rows),
                       "kernel_peak_bytes": max((s[3] or 0) for s in rows)}
    out["ratios"] = {key: statistics.median(values) for key, values in ratios.items()}
    return out


def paired(name: str, pairs: int, page_dir: str, shape: dict | None = None) -> dict:
    """One keep-all run_plan of `pairs` + 3 steps with one eager step after each of ours (the
    run's progress callback, in the run's process-wide settings); the first three pairs warm
    up. Adjacent steps share the machine's load, which moves on a shorter scale than a round
    of five steps each: the per-pair ratio is steadier on a loaded machine. `shape`: the
    model's sizes (default QUICK's)."""
    from edge_remat_agent.capture import capture_model
    from edge_remat_agent.capture.models import load_model
    from edge_remat_agent.capture.optimizer import torch_optimizer
    from edge_remat_agent.executor import run_plan
    from edge_remat_agent.executor.step import plain_step
    from edge_remat_agent.profiler import LiveTensorLedger, StepMeter

    shape = QUICK[name] if shape is None else shape
    captured = capture_model(name, update="step", **shape)
    plan = keep_all_plan(captured.graph)
    module, batch = load_model(name, **shape)
    optimizer = torch_optimizer(captured.graph.capture.get("optimizer", "sgd"), module)
    eager, ledger = [], LiveTensorLedger()

    def eager_step(i, steps, record):
        with StepMeter(ledger) as meter:
            plain_step(module, optimizer, batch)
        eager.append(meter.result.cpu_s)
    report = run_plan(captured.graph, plan, pairs + 3, page_dir, check_gradients=False,
                      captured=captured, map_large_allocations=False, progress=eager_step)
    ours = [s["cpu_time_s"] for s in report["steps"]][3:]
    eager = eager[3:]
    return {"pairs": len(ours), "ours_cpu_s": statistics.median(ours),
            "eager_cpu_s": statistics.median(eager),
            "ratio_cpu": statistics.median(o / e for o, e in zip(ours, eager))}


def profile_step(name: str, page_dir: str, steps: int = 8) -> None:
    """cProfile over a keep-all run_plan's steps (set-up included: read past it)."""
    import cProfile
    import pstats
    from edge_remat_agent.capture import capture_model
    from edge_remat_agent.executor import run_plan
    captured = capture_model(name, update="step", **QUICK[name])
    plan = keep_all_plan(captured.graph)
    run_plan(captured.graph, plan, 2, page_dir, check_gradients=False, captured=captured,
             map_large_allocations=False)
    profiler = cProfile.Profile()
    profiler.enable()
    run_plan(captured.graph, plan, steps, page_dir, check_gradients=False, captured=captured,
             map_large_allocations=False)
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


def runner_only(name: str, repeats: int = 15, steps: int = 20) -> dict[str, float]:
    """Median CPU seconds of a keep-all step with the ops taken out (see the docstring): as
    the interpreter runs a measured step, and as the compiled step runs a replayed one."""
    import dataclasses
    import resource
    from edge_remat_agent.capture import capture_model, replay
    from edge_remat_agent.capture.replay import StepRunner
    from edge_remat_agent.executor.compiled_step import compile_step
    from edge_remat_agent.executor.interpreter import Interpreter
    from edge_remat_agent.memory_classes import ledger_classifier
    from edge_remat_agent.profiler import LiveTensorLedger
    captured = capture_model(name, update="step", **QUICK[name])
    plan = keep_all_plan(captured.graph)
    recorded: dict = {}

    def recorded_call(step):
        def call(*args, **kwargs):
            if step.name not in recorded:
                recorded[step.name] = step.call(*args, **kwargs)
            return recorded[step.name]
        return dataclasses.replace(step, call=call)
    compile_node = replay.compile_node
    replay.compile_node = lambda steps, *args, **kwargs: compile_node(
        [recorded_call(step) for step in steps], *args, **kwargs)
    try:
        ledger = LiveTensorLedger(classify=ledger_classifier(captured.trace))
        runner = StepRunner(captured.trace, captured.graph, captured.module,
                            captured.example_args, None, ledger)
        interpreter = Interpreter(runner, captured.graph, {})

        def measured():
            runner.start_step(captured.module, captured.example_args)
            with torch.no_grad():
                interpreter.run(plan.stages)
            runner.release_all()
        measured()
        for prep in runner._node_ops.values():  # the compiled step's ops: the recorded ones
            if prep.ops is not None:
                prep.steps = [recorded_call(step) for step in prep.steps]
        compiled = compile_step(runner, captured.graph, plan.stages)

        def replayed():  # as executor/step.py runs a replayed step: nothing registered
            runner.ledger = None
            runner.start_step(captured.module, captured.example_args)
            with torch.no_grad():
                runner.env.update(compiled.run(runner.env).resident)
            runner.release_all()
            runner.ledger = ledger

        def cpu() -> float:
            usage = resource.getrusage(resource.RUSAGE_SELF)
            return usage.ru_utime + usage.ru_stime
        samples: dict[str, list[float]] = {"measured": [], "replayed": []}
        for step in (measured, replayed):
            for _ in range(steps):
                step()
        for _ in range(repeats):  # interleaved: the load moves
            for what, step in (("measured", measured), ("replayed", replayed)):
                start = cpu()
                for _ in range(steps):
                    step()
                samples[what].append((cpu() - start) / steps)
        return {what: statistics.median(s) for what, s in samples.items()}
    finally:
        replay.compile_node = compile_node


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=names_among(QUICK, "model"),
                        default="bert-mini,resnet18")
    parser.add_argument("--rounds", type=positive_int, default=7)
    parser.add_argument("--threads", type=positive_int, default=1)
    parser.add_argument("--profile", metavar="MODEL", choices=list(QUICK),
                        help="cProfile the keep-all run instead")
    parser.add_argument("--runner-only", action="store_true",
                        help="time the runner with the ops taken out instead")
    parser.add_argument("--accumulate", type=positive_int, default=1, metavar="K",
                        help="K micro-batches a step (the default mode); ours is also run "
                             "with every micro-pass measured")
    parser.add_argument("--paired", type=positive_int, metavar="N",
                        help="instead: N pairs of adjacent steps (ours, then eager) in one run")
    args = parser.parse_args()
    models = args.models
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as page_dir:
        if args.profile:
            profile_step(args.profile, page_dir)
            return 0
        if args.runner_only:
            for name in models:
                times = runner_only(name)
                print(f"{name} {QUICK[name]}: the runner with the ops taken out, ms CPU a step "
                      f"(median): measured step (interpreter, ledger) "
                      f"{times['measured'] * 1e3:.2f}, replayed step (compiled) "
                      f"{times['replayed'] * 1e3:.2f}")
            return 0
        if args.paired:
            for name in models:
                out = paired(name, args.paired, page_dir)
                print(f"{name} {QUICK[name]}: {out['pairs']} pairs, CPU ours "
                      f"{out['ours_cpu_s'] * 1e3:.1f} ms, eager {out['eager_cpu_s'] * 1e3:.1f} "
                      f"ms (medians); keep-all / eager {out['ratio_cpu']:.3f}x (median of "
                      f"per-pair ratios; target <= {TARGET:.2f}x)")
            return 0
        for name in models:
            out = bench(name, args.rounds, page_dir, args.accumulate)
            k = f", {args.accumulate} micro-batches a step" if args.accumulate > 1 else ""
            print(f"{name} {QUICK[name]}{k}, {args.threads} thread(s), {args.rounds} rounds")
            for method in ("eager", "ours", "ours-measured"):
                if method not in out:
                    continue
                m = out[method]
                print(f"  {method:13s} wall {m['wall_s'] * 1e3:7.1f} ms  CPU "
                      f"{m['cpu_s'] * 1e3:7.1f} ms  minor faults {m['minor_faults']:7.0f} "
                      f"(median; {m['faulting_steps']} of {m['steps']} steps > 1000), kernel "
                      f"peak {m['kernel_peak_bytes'] / 2**20:.0f} MiB")
            for method in ("ours", "ours-measured"):
                if f"cpu {method}" in out["ratios"]:
                    print(f"  keep-all ({method}) / eager: wall "
                          f"{out['ratios'][f'wall {method}']:.3f}x, CPU "
                          f"{out['ratios'][f'cpu {method}']:.3f}x (median of per-round "
                          f"ratios; target <= {TARGET:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
