"""`edge-remat-agent run PLAN --graph G --steps N [--page-dir D] [--json]`: execute a plan here.

Kept outside the executor package so the agent's CLI starts without importing torch.
Exit status: 0 done (and, when checked, the gradients were bitwise equal to eager's, or on a
CUDA device to the captured step's replayed plainly);
1 the run failed on the board (out of memory, a full or corrupted page store), the gradients
differ, or --stop-on-nonfinite stopped it at a loss that is not finite (its report is still
printed and written); 2 bad input (a plan for another graph, an invalid plan, unreadable
files).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .output_names import empty_name
from .units import counted, format_size


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "run", help="execute a plan on this board for N training steps and measure it",
        description="Captures the plan's graph again here, refuses a plan made for another "
                    "graph, then trains for --steps steps following the plan (recompute, page "
                    "out, page in), measuring per step the wall time, the live-tensor ledger's "
                    "peak, the resident memory peak and energy (with a sensor). The first "
                    "step's gradients are compared with plain eager PyTorch, bit for bit (on a "
                    "CUDA device, with the captured step's ops replayed plainly: eager "
                    "takes other kernels there).")
    p.add_argument("plan", help="plan JSON (edge-remat plan)")
    p.add_argument("--graph", required=True, help="the graph JSON the plan was made for")
    p.add_argument("--steps", type=int, default=10, help="training steps (default 10)")
    p.add_argument("--page-dir", help="directory on the flash for paged tensors (needed when "
                                      "the plan pages to flash)")
    p.add_argument("--no-grad-check", action="store_true",
                   help="skip the eager reference on step 1 (it needs plain training's memory)")
    p.add_argument("--sensor", default="auto",
                   help="power sensor name, 'auto' (the board's own, if any) or 'none'")
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    p.add_argument("--seed", type=int, help="seed the generator before the first step")
    p.add_argument("--no-fsync", dest="fsync", action="store_false",
                   help="do not fsync pages written to flash (faster; the page cache then "
                        "holds them in RAM until writeback)")
    p.add_argument("--keep-malloc-defaults", action="store_true",
                   help="do not fix glibc's mmap threshold at 1 MiB: faster steps, but freed "
                        "tensors stay resident (glibc's own policy at its steady state, see "
                        "edge_remat_agent/allocator.py)")
    p.add_argument("--stop-on-nonfinite", action="store_true",
                   help="stop after the first step whose loss is NaN or infinite (exit 1; the "
                        "report is still written); by default the run goes on, as PyTorch's "
                        "would, and warns once")
    p.add_argument("-o", "--output", help="also write the whole run report here (JSON)")
    p.add_argument("--json", action="store_true", help="print the run report as one JSON object")
    return p


def run(args: argparse.Namespace) -> int:
    from .formats import FormatError, load_graph, load_plan
    if (empty := empty_name(args.output, "-o", "a file name")) is not None:
        print(f"error: {empty}", file=sys.stderr)  # before the work, not when writing after it
        return 2
    from .lr_schedule import steps_refusal
    if (refusal := steps_refusal(args.steps)) is not None:  # 0 ran nothing, 1e12 forever
        print(f"error: {refusal}", file=sys.stderr)
        return 2
    try:
        graph, plan = load_graph(args.graph), load_plan(args.plan)
    except (FormatError, OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    from .executor import BadInput, ExecutorError, run_plan
    from .executor.stores import host_pages_refusal
    unhosted = host_pages_refusal(plan, None, args.device, where="this command has none")
    if unhosted is not None:  # the run job's rule: host pages never held in this process
        print(f"error: {unhosted}", file=sys.stderr)
        return 2

    from .diverged import LossTally, LossWatch, remedy_for
    # this command has no --lr: its graph's optimizer's own rate, which deploy's --lr changes
    remedy = remedy_for(graph.capture, None, takes_lr=False)
    loss_watch, losses = LossWatch(), LossTally(remedy)

    def progress(index: int, total: int, record: dict) -> None:
        if not args.json:
            print(_step_line(record, total), file=sys.stderr, flush=True)
        losses.see(record["step"], record["loss"])
        warning = loss_watch.see(losses.found)
        if warning:
            print(f"warning: {warning}", file=sys.stderr, flush=True)

    try:
        report = run_plan(graph, plan, args.steps, args.page_dir,
                          check_gradients=not args.no_grad_check, progress=progress,
                          sensor=args.sensor, device=args.device, seed=args.seed,
                          flash_fsync=args.fsync,
                          map_large_allocations=not args.keep_malloc_defaults,
                          stop_on_nonfinite=args.stop_on_nonfinite, remedy=remedy)
    except BadInput as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except ExecutorError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except MemoryError:
        print("error: the board ran out of memory outside the plan's instructions (capturing "
              "the graph, building the model, or the gradient check's eager step); "
              "try --no-grad-check", file=sys.stderr)
        return 1
    if args.output:
        from .formats.fields import dump_json
        dump_json(report, args.output)
    if args.json:
        print(json.dumps(report))
    else:
        print(summary_text(report))
    mismatch = gradient_mismatch(report.get("grad_check"))
    if mismatch:
        print(f"error: {mismatch}", file=sys.stderr)
    stopped = stopped_at_nonfinite(report, args.steps)
    if stopped:
        print(f"error: {stopped}", file=sys.stderr)
    return 1 if mismatch or stopped else 0


def stopped_at_nonfinite(report: Any, steps: int) -> str | None:
    """The error line of a run that --stop-on-nonfinite stopped (its report or job result:
    `stopped_at_step`, and `nonfinite_loss` there or under `summary`); None where it went on.
    A run or deploy exits 1 with it."""
    if not isinstance(report, dict) or not report.get("stopped_at_step"):
        return None
    from .diverged import stopped_line
    found = report.get("nonfinite_loss") or (report.get("summary") or {}).get("nonfinite_loss")
    return stopped_line(found or {"step": report["stopped_at_step"], "loss": "NaN or inf"},
                        steps)


# A gradient check's reference (its `reference`; none in reports older than the replay)
REFERENCES = {"eager": "eager PyTorch", "replay": "the captured step replayed plainly"}


def reference_words(check: dict) -> str:
    """What a gradient check compared the planned step with, in words."""
    return REFERENCES.get(check.get("reference", "eager"), REFERENCES["eager"])


def gradient_mismatch(check: Any) -> str | None:
    """The error line of a gradient check that found the plan's step unlike its reference's
    (eager PyTorch's, or on a device the captured step replayed plainly; None where it agreed
    or did not run): a run or deploy exits 1 with it, not 0 beside a report that says so in
    one of its lines."""
    if not isinstance(check, dict) or check.get("bitwise_equal") is not False:
        return None
    differing = check.get("differing", []) + check.get("missing", []) + check.get("extra", [])
    which = ", ".join(differing[:3]) + (" ..." if len(differing) > 3 else "") if differing \
        else "the loss"
    return (f"the planned step's gradients differ from those of {reference_words(check)} "
            f"(max |diff| "
            f"{check.get('max_abs_diff', float('nan')):.3g}; {which}): training under this plan "
            "is not exact. A forward that reads Python state the capture fixed (a call counter, "
            "a flag) does this; otherwise it is a bug in edge-remat: report it with the model, "
            "graph and plan")


def _step_line(record: dict, total: int) -> str:
    return (f"step {record['step']}/{total}: loss {record['loss']:.6g}, "
            f"{record['step_time_s']:.3f} s, ledger peak {format_size(record['ledger_peak_bytes'])}"
            f", RSS peak {format_size(record['rss_peak_bytes'])}"
            + (f", {record['energy_j']:.3g} J" if record.get("energy_j") is not None else ""))


def device_memory_line(steps: list) -> str | None:
    """A CUDA run's memory in words: its caching allocator's peaks over the steps after the
    first (the first holds the gradient check's plain step); None on the CPU."""
    later = [r for r in steps[1:] or steps if r.get("device_peak_bytes") is not None]
    if not later:
        return None
    allocated = max(r["device_peak_bytes"] for r in later)
    reserved = max(r.get("device_reserved_peak_bytes") or 0 for r in later)
    which = "steps 2 on" if len(steps) > 1 else "the one step"
    return (f"{format_size(allocated)} allocated, {format_size(reserved)} reserved at most "
            f"(CUDA's allocator, {which}; reserved is what the board pays)")


def summary_text(report: dict) -> str:
    s = report["summary"]
    lines = [
        f"model {report['model']}: {counted(s['steps'], 'step')} on {report['device']}, "
        f"final loss {s['final_loss']:.6g}",
        f"  step time    {s['step_time_s']:.3f} s measured (median), "
        f"{s['predicted_time_s']:.3f} s predicted",
        f"  ledger peak  {format_size(s['ledger_peak_bytes'])} measured, "
        f"{format_size(s['predicted_peak_bytes'])} predicted "
        f"({'within' if s['ledger_within_prediction'] else 'OVER'} the prediction)",
        f"  RSS peak     {format_size(s['rss_peak_bytes'])} (the whole process)",
        f"  recompute    {s['recompute_overhead_percent']:.1f}% measured, "
        f"{s['predicted_recompute_overhead_percent']:.1f}% predicted; "
        f"{counted(report['recomputed'], 'recompute')}, {counted(report['page_outs'], 'page-out')}"
        f", {counted(report['page_ins'], 'page-in')} per step",
    ]
    kernel, baseline = report.get("kernel_peak"), report.get("runtime_baseline_bytes")
    if kernel:  # the agent's memory-limited cgroup's (executor/baseline.py)
        lines.append(f"  kernel peak  {format_size(kernel['bytes'])} ({kernel['source']})" + (
            f"; {format_size(kernel['bytes'] - baseline)} above the runtime baseline"
            if isinstance(baseline, int) else ""))
    device = device_memory_line(report.get("steps") or [])
    if device:
        lines.append(f"  device       {device}")
    if s["energy_j"] is not None:
        lines.append(f"  energy       {s['energy_j']:.3g} J over the run ({report['sensor']})")
    from .lr_schedule import lr_history_text
    changed = lr_history_text((report.get("optimizer") or {}).get("lr_history"))
    if changed:  # a deploy resumed with another --lr
        lines.append(f"  lr           {changed}")
    if s.get("nonfinite_loss"):
        from .diverged import nonfinite_loss_warning
        lines.append(f"  warning      {nonfinite_loss_warning(s['nonfinite_loss'])}")
    check = report["grad_check"]
    if check is not None:
        against = reference_words(check)
        lines.append("  gradients    " + (
            f"bitwise equal to {against} ({check['compared']} compared)"
            if check["bitwise_equal"] else
            f"DIFFER from {against}: max |diff| {check['max_abs_diff']:.3g} "
            f"({', '.join(check['differing'] + check['missing']) or 'loss'})"))
    return "\n".join(lines)
