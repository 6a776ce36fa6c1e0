"""The run report: what the plan promised against what the board measured, step by step.

`build_report` turns a run's facts into one JSON-able dict (what `edge-remat run --json`
prints); `report_text` renders it as a table with the misses spelled out. Step figures come
from the executor's result or from plain training, in whichever of two shapes they arrive:
lists per field (`{"loss": [...], "step_time_s": [...]}`) or one record per step
(`{"steps": [{"loss": ..., "step_time_s": ...}, ...]}`).
"""

from __future__ import annotations

import statistics
from typing import Any, Optional

from edge_remat_agent.diverged import first_nonfinite_loss, nonfinite_loss_warning
from edge_remat_agent.executor.report import first_steps_of_starts
from edge_remat_agent.lr_schedule import lr_history_text
from edge_remat_agent.run_command import device_memory_line, reference_words
from edge_remat_agent.units import counted

from ..units import budget_against_plain, fmt_bytes
from .report import asked_budget

# job_start: which start of the board's job trained the step (its daemon restarted it)
STEP_FIELDS = ("loss", "step_time_s", "ledger_peak_bytes", "rss_peak_bytes", "energy_j",
               "job_start", "device_peak_bytes", "device_reserved_peak_bytes")
_ALIASES = {"wall_s": "step_time_s", "time_s": "step_time_s", "rss_peak": "rss_peak_bytes",
            "ledger_peak": "ledger_peak_bytes"}
PLAN_FIGURES = ("predicted_peak_bytes", "predicted_time_s", "recomputed", "page_ins",
                "page_outs")


def steps_from(result: Optional[dict]) -> dict[str, list]:
    """Per-step lists of STEP_FIELDS (missing ones empty) from a job's result."""
    result = result or {}
    rows = result.get("steps") if isinstance(result.get("steps"), list) else \
        result.get("per_step") if isinstance(result.get("per_step"), list) else None
    out: dict[str, list] = {name: [] for name in STEP_FIELDS}
    if rows is not None:
        for row in rows:
            row = {_ALIASES.get(k, k): v for k, v in dict(row).items()}
            for name in STEP_FIELDS:
                out[name].append(row.get(name))
    else:
        for key, value in result.items():
            name = _ALIASES.get(key, key)
            if name in out and isinstance(value, list):
                out[name] = list(value)
    width = max((len(v) for v in out.values()), default=0)
    return {name: values + [None] * (width - len(values)) if values else [None] * width
            for name, values in out.items()}


def step_figures(result: Optional[dict]) -> dict[str, Any]:
    """What a job's result says of its steps: the per-step lists, how many were done, where
    the loss left the finite numbers, and the peaks over the steps."""
    per_step = steps_from(result)
    return {
        "steps_done": sum(1 for v in per_step["loss"] if v is not None),
        # training diverged there: the board's words (its steps, what to try), else the losses'
        "nonfinite_loss": board_nonfinite(result) or first_nonfinite_loss(per_step["loss"]),
        "stopped_at_step": (result or {}).get("stopped_at_step"),  # --stop-on-nonfinite
        **per_step,
        "measured_peak_bytes": _max(per_step["rss_peak_bytes"]),
        "tensor_peak_bytes": _max(per_step["ledger_peak_bytes"])}


def _max(values: list) -> Optional[float]:
    numbers = [v for v in values if isinstance(v, (int, float))]
    return max(numbers) if numbers else None


def _times(value: Optional[float], k: int) -> Optional[float]:
    return value * k if isinstance(value, (int, float)) else value


def _total(values: list) -> Optional[float]:
    numbers = [v for v in values if isinstance(v, (int, float))]
    return sum(numbers) if numbers and len(numbers) == len(values) else None


def build_report(*, mode: str, status: str, device: str, model: str, steps: int,
                 result: Optional[dict], plan: Optional[dict] = None,
                 killed_at_step: Optional[int] = None, message: str = "",
                 killed_by: Optional[str] = None,
                 memory_limit_bytes: Optional[int] = None,
                 kernel_peak_bytes: Optional[int] = None, kernel_peak_source: str = "",
                 plain_peak_bytes: Optional[int] = None, profile: Optional[dict] = None,
                 grad_check: Any = None, data: str = "example",
                 paths: Optional[dict] = None, micro_batches: int = 1,
                 resumed_after_step: Optional[int] = None) -> dict[str, Any]:
    """One object with everything the run showed; `plots` and `report` are filled in later.
    `micro_batches`: K of gradient accumulation, whose step is K passes of the plan (its
    time and energy the plan's `accumulated_step`; its peak the plan's).
    `resumed_after_step`: the step a resumed run went on from, which the misses' words number
    their steps from (QA: set after them, a run resumed after step 3 said "steps 2-5")."""
    steps_seen = step_figures(result)
    per_step = {name: steps_seen[name] for name in STEP_FIELDS}
    predicted = (plan or {}).get("predicted", {})
    asked = asked_budget(plan) if plan else None
    # K passes, each with its own work (a plan from before it said so: K times the pass)
    step = predicted.get("accumulated_step") or {}
    figures = {name: (result or {}).get(name) for name in PLAN_FIGURES}
    # The plan's figures first: a board replays the plan with the graph's costs only.
    predicted_peak = predicted.get("peak_bytes") or figures["predicted_peak_bytes"]
    report: dict[str, Any] = {
        "status": status, "mode": mode, "message": message, "killed_at_step": killed_at_step,
        # what killed it, as the message says it: the table's row reads it
        **({"killed_by": killed_by} if killed_by else {}),
        "device": device, "model": model, "steps": steps,
        # What the board says it trained on; a board whose job does not say gets the request.
        "data": (result or {}).get("data") or f"{data} (requested; the board does not say)",
        **steps_seen,
        "memory_limit_bytes": memory_limit_bytes,
        "kernel_peak_bytes": kernel_peak_bytes, "kernel_peak_source": kernel_peak_source,
        # What the kernel charged before the first step (interpreter, torch, model code):
        # kernel peak - runtime baseline is the physical memory of training.
        "runtime_baseline_bytes": (result or {}).get("runtime_baseline_bytes"),
        "training_physical_bytes": _difference(kernel_peak_bytes,
                                               (result or {}).get("runtime_baseline_bytes"))
        if _peak_spans_training((result or {}).get("runtime_baseline")) else None,
        # The most the weight page store held read ahead at once: RAM beside the plan's,
        # which a budget derived from a memory limit keeps out for it
        "read_ahead_bytes": ((result or {}).get("weights") or {}).get("largest_ahead_bytes"),
        "executor_allocator": (result or {}).get("executor_allocator"),
        "malloc": (result or {}).get("malloc"),  # the board's: requested, running (note)
        "arena_bytes": ((result or {}).get("arena") or {}).get("size_bytes"),
        # the budget asked (QA: after --allocator arena re-planned lower so that its arena
        # fits, the report called the lower one the budget, as a share of another plain peak)
        "budget_bytes": asked,
        **({"planned_at_bytes": plan["budget_bytes"]}
           if plan and plan.get("budget_bytes") != asked else {}),
        **_arena_over(plan),
        **_arena_footprint(plan, (result or {}).get("executor_allocator")),
        "plain_peak_bytes": plain_peak_bytes,
        "predicted_peak_bytes": predicted_peak,
        # Of the peak, what the ledger can see: all but the memory the ops' first calls leave
        # to the process (oneDNN's primitives), which the plan counts and no tensor holds.
        "predicted_tensor_peak_bytes": _difference(
            predicted_peak, ((plan or {}).get("problem") or {}).get("runtime_warm_bytes") or 0),
        "predicted_time_s": step.get("time_s") or _times(predicted.get("time_s"), micro_batches)
        or figures["predicted_time_s"],  # the board's is a step's
        "predicted_energy_j": step.get("energy_j") or _times(predicted.get("energy_j"),
                                                             micro_batches),
        **({"micro_batches": micro_batches} if micro_batches > 1 else {}),
        "energy_total_j": _total(per_step["energy_j"]),
        "recomputed": _first(figures["recomputed"], predicted.get("recomputed")),
        "page_ins": _first(figures["page_ins"], predicted.get("page_ins")),
        "page_outs": _first(figures["page_outs"], predicted.get("page_outs")),
        "paged_bytes": predicted.get("paged_bytes"),
        "home_reads": predicted.get("home_reads") or 0,  # param nodes read ahead from home
        "solver": (plan or {}).get("solver", {}).get("name"),
        "profile": profile or {"name": None, "source": None, "modelled": False},
        "grad_check": (result or {}).get("grad_check") if grad_check is None else grad_check,
        "memory_by_class": (result or {}).get("memory_by_class"),
        # the job's starts, where its board's daemon restarted it (executor.report.job_starts)
        "job_starts": ((result or {}).get("checkpoint") or {}).get("starts"),
        "optimizer": optimizer_of(result),
        "lr_history": changed_lr(result),
        "plots": [],
        **(paths or {}),
        **({"resumed_after_step": resumed_after_step} if resumed_after_step else {}),
    }
    report["misses"] = misses(report)
    return report


def optimizer_of(result: Optional[dict]) -> Optional[dict]:
    """The optimizer and every setting it stepped with (QA: only the board's report said it,
    and without AdamW's weight decay); a plain run's result names it, with its --lr."""
    described = (result or {}).get("optimizer")
    if isinstance(described, dict):
        return described
    from edge_remat_agent.capture.optimizer import TORCH_OPTIMIZERS, optimizer_settings
    if not isinstance(described, str) or described not in TORCH_OPTIMIZERS:
        return None
    return {"name": described, **optimizer_settings(described),
            **({"lr": result["lr"]} if result.get("lr") is not None else {})}


def changed_lr(result: Optional[dict]) -> Optional[list]:
    """The base learning rate by step, where --lr changed on a --resume (a planned run's
    optimizer says it: lr_schedule.lr_history); None where it did not (plain training's
    result names its optimizer alone)."""
    optimizer = (result or {}).get("optimizer")
    return optimizer.get("lr_history") if isinstance(optimizer, dict) else None


def board_nonfinite(result: Optional[dict]) -> Optional[dict]:
    """The board's own `nonfinite_loss` (plain training's result, a run report's summary,
    a killed job's last progress): it counts by the run's own steps and says what to try."""
    result = result or {}
    summary = result.get("summary") if isinstance(result.get("summary"), dict) else {}
    return result.get("nonfinite_loss") or summary.get("nonfinite_loss")


def _peak_spans_training(baseline: Optional[dict]) -> bool:
    """Whether the kernel's peak starts at the runtime baseline, so that the peak less the
    baseline is training's: not where the board could not restart it (QA: emulated-arm64's
    peak, since its group began, held the profile job's, and the line said 517 MiB of
    training against 2.19 MiB planned, 236.75x). A job that does not say is taken as it
    reads."""
    return not isinstance(baseline, dict) or baseline.get("peak_restarted") is not False


def _difference(a, b):
    """a - b where both are known and a is the larger (a kernel peak below the runtime
    baseline measured nothing: QA read '-33.18 MiB' under a limit past the machine's RAM)."""
    return a - b if isinstance(a, int) and isinstance(b, int) and a >= b else None


def _first(*values):
    return next((v for v in values if v is not None), None)


def misses(report: dict) -> list[str]:
    """Where the prediction missed, and by how much (plain runs have no prediction)."""
    out = []
    predicted_peak, ledger = report.get("predicted_peak_bytes"), report.get("tensor_peak_bytes")
    tensors = report.get("predicted_tensor_peak_bytes") or predicted_peak
    if tensors and ledger:
        warm = f" (the plan's {fmt_bytes(predicted_peak - tensors)} of runtime warm-up memory " \
               "left out: no tensor holds it)" if tensors != predicted_peak else ""
        out.append(f"tensor peak: measured {fmt_bytes(ledger)} against {fmt_bytes(tensors)}"
                   f" predicted ({(ledger / tensors - 1) * 100:+.1f}%){warm}")
    physical = report.get("training_physical_bytes")
    if physical and predicted_peak:
        # QA: tinyllama-2l-lora under 889 MiB read 250 MiB ahead beside a 267 MiB plan, and
        # the line said 1.66x the plan with no word of it
        ahead = report.get("read_ahead_bytes") or 0
        against = f"{fmt_bytes(predicted_peak)} predicted" + (
            f" and {fmt_bytes(ahead)} read ahead from the weight page store beside it, "
            "outside the plan" if ahead else "")
        footprint = report.get("arena_footprint_bytes")
        laid_out = f"; the arena laid out, with fixed memory, {fmt_bytes(footprint)}: " \
            f"{physical / (footprint + ahead):.2f}x" if footprint else ""
        out.append(f"physical memory of training (kernel peak - runtime baseline of "
                   f"{fmt_bytes(report['runtime_baseline_bytes'])}): {fmt_bytes(physical)} "
                   f"against {against} ({physical / (predicted_peak + ahead):.2f}x, "
                   f"{report.get('executor_allocator')} executor{laid_out})"
                   + _heap_slack(report, physical - predicted_peak - ahead))
    measured = report.get("measured_peak_bytes")
    if measured and ledger:
        out.append(f"resident peak {fmt_bytes(measured)} is {fmt_bytes(measured - ledger)} above "
                   "the tensors: interpreter, torch, allocator slack (not in the plan's model)")
    after = report.get("resumed_after_step") or 0
    typical, which = steady_median(report.get("step_time_s", []), report.get("job_start"),
                                   after)
    predicted_time = report.get("predicted_time_s")
    if typical and predicted_time:
        source = "" if (report.get("profile") or {}).get("name") else \
            " (no operator profile: times are the graph's FLOP estimate)"
        out.append(f"step time: {which} {typical:.3g} s against {predicted_time:.3g} s "
                   f"predicted ({typical / predicted_time:.2f}x){source}")
    typical, which = steady_median(report.get("energy_j") or [], report.get("job_start"),
                                   after)
    predicted_energy = report.get("predicted_energy_j")
    if typical and predicted_energy:
        out.append(f"energy: {which} {typical:.3g} J a step against {predicted_energy:.3g} J "
                   f"predicted ({typical / predicted_energy:.2f}x)")
    return out


def _heap_slack(report: dict, above: int) -> str:
    """What the glibc executor's physical memory above the plan is (QA: a 4-layer hf:gpt2 at
    operator level read 1.27-2.78x a 12 MiB plan, the ledger within 0.1% of it): glibc's heap
    keeps the freed chunks of tensors below its 1 MiB mmap threshold resident and reuses them
    only where they fit, so a graph of small tensors pays a slack that no plan counts, about
    the same MiB at any budget (docs/memory.md, "The glibc executor's heap slack")."""
    if report.get("executor_allocator") != "glibc" or above <= 0:
        return ""
    return (f"; the {fmt_bytes(above)} above the plan is most likely the C heap's slack "
            "beyond the tensors: glibc keeps freed tensors under its 1 MiB mmap threshold "
            "resident, not in the plan; --allocator arena lays them out in the plan's arena")


def steady_median(values: list, starts: Optional[list] = None,
                  after: int = 0) -> tuple[Optional[float], str]:
    """The median of the steps after the first, and words that say so: the first step pays
    what later ones do not (the ops' first calls, page files made, the runner's warm-up),
    and a plan predicts the steady step. With one step, that step. `starts`: the steps'
    job_start, where the board's daemon restarted the job: each start's first step pays the
    warm-up again (and the gradient check), and is left out too. `after`: the step the run
    resumed after, so that the words name absolute steps (QA: a run resumed after step 2
    said "step 1" of its step 3)."""
    numbers = [v for v in values if isinstance(v, (int, float))]
    if not numbers:
        return None, ""
    firsts = first_steps_of_starts(list(starts or []))
    if len(firsts) > 1:
        kept = [i for i, v in enumerate(values)
                if i not in firsts and isinstance(v, (int, float))]
        if kept:
            return statistics.median(values[i] for i in kept), (
                f"median of steps {_ranges([after + i + 1 for i in kept])} (the first step of "
                f"each of the job's {len(firsts)} starts left out)")
    if len(numbers) == 1:
        return numbers[0], f"step {after + 1}"
    steady = numbers[1:]
    which = f"step {after + 2}" if len(steady) == 1 else \
        f"median of steps {after + 2}-{after + len(numbers)}"
    return statistics.median(steady), which


def _ranges(steps: list[int]) -> str:
    """[2, 3, 4, 6, 7] as "2-4, 6-7"."""
    runs: list[list[int]] = []
    for step in steps:
        if runs and step == runs[-1][1] + 1:
            runs[-1][1] = step
        else:
            runs.append([step, step])
    return ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in runs)


def starts_text(starts: Optional[list]) -> str:
    """Which start of the board's job trained which steps, where its daemon restarted it
    (executor.report.job_starts's list); "" where the job ran in one start."""
    if not starts or len(starts) < 2:
        return ""
    ran = [f"{_ranges(list(range(s['after_step'] + 1, s['after_step'] + s['steps'] + 1)))} "
           f"in start {s['start']}" for s in starts if s["steps"]]
    text = "the board's daemon restarted the job: steps " + ", ".join(ran)
    if not starts[-1]["steps"]:
        text += (f"; start {starts[-1]['start']} trained nothing (the checkpoint after step "
                 f"{starts[-1]['after_step']} was the last step's) and saved the outputs "
                 "from it")
    return text


def _cell(value, fmt: str) -> str:
    if value is None:
        return "-"
    return fmt.format(value)


def loss_text(value) -> str:
    """A loss in at most 8 characters: four decimals, or three digits where it is 1000 or
    more (QA: --lr 1e6 gave 953731366778830848.0000, and the table's columns broke)."""
    if not isinstance(value, (int, float)):
        return "-" if value is None else str(value)
    return f"{value:.4f}" if abs(value) < 1000 else f"{value:.3g}"


def _mib(value) -> str:
    return "-" if value is None else f"{value / 2**20:.1f}"


def _arena_footprint(plan: Optional[dict], allocator: Optional[str]) -> dict:
    """What the arena executor allocates: the plan's arena and its fixed memory, the figure
    its physical memory is held against beside the plan's peak (QA: digits-cnn at 30% read
    1.11x the plan, its arena 6.49 MiB of fragmentation past the plan's tensor peak)."""
    arena = (plan or {}).get("arena")
    if allocator != "arena" or not arena or not arena.get("size_bytes"):
        return {}
    from .report import arena_footprint
    return {"arena_footprint_bytes": arena_footprint(plan)}


def _arena_over(plan: Optional[dict]) -> dict:
    """How far the plan's arena (--allocator arena) passes the budget where no schedule tried
    fits it: the board may need that much more (QA: said once while planning, then in neither
    the table nor report.txt)."""
    fit = (((plan or {}).get("arena") or {}).get("details") or {}).get("fit") or {}
    if fit.get("fits", True) or not fit.get("footprint_bytes"):
        return {}
    return {"arena_over_budget_bytes": fit["footprint_bytes"] - fit["budget_bytes"]}


def report_text(report: dict) -> str:
    """The table a person reads: header, one line per step, the kernel's peak, the misses."""
    limit = report.get("memory_limit_bytes")
    where = report["device"] + (f" ({fmt_bytes(limit)} memory limit)" if limit else "")
    what = "plain PyTorch" if report["mode"] == "plain" else "planned"
    lines = [f"{what} run of {report['model']} on {where}: {report['message'] or report['status']}"]
    profile = report.get("profile") or {}
    if profile.get("name"):
        label = "MODELLED (published figures, not measured on this board)" \
            if profile.get("modelled") else profile.get("source")
        lines.append(f"profile   {profile['name']}: {label}"
                     + ("; power is a model estimate" if profile.get("power_estimate") else ""))
    if report["mode"] == "planned" and report.get("budget_bytes"):
        plain = report.get("plain_peak_bytes")
        budget = budget_against_plain(report["budget_bytes"], plain) if plain else \
            f"budget {fmt_bytes(report['budget_bytes'])}"
        if report.get("planned_at_bytes"):
            budget += (f", the schedule planned at {fmt_bytes(report['planned_at_bytes'])} so "
                       "that the arena fits it")
        lines.append(f"plan      {budget}, solver "
                     f"{report.get('solver')}, "
                     f"{counted(report.get('recomputed'), 'recomputation')}, "
                     f"{counted(report.get('page_outs'), 'page-out')} / "
                     f"{counted(report.get('page_ins'), 'page-in')}"
                     + (f", {counted(report['home_reads'], 'parameter read')} from home ahead"
                        if report.get("home_reads") else ""))
    if report.get("arena_over_budget_bytes"):
        over = fmt_bytes(report["arena_over_budget_bytes"])
        lines.append(f"arena     passes the budget by {over} (fragmentation; no schedule "
                     "tried fits it): the board may need that much more")
    if report.get("micro_batches"):
        k = report["micro_batches"]
        lines.append(f"step      {k} micro-batches a step (--accumulate): the plan {k} times, "
                     "one optimizer step; the loss is their mean")
    pred_t = report.get("predicted_time_s")
    pred_tensors = report.get("predicted_tensor_peak_bytes") or report.get("predicted_peak_bytes")
    pred_e = report.get("predicted_energy_j")
    head = (f"{'step':>4}  {'loss':>8}  {'time s':>15}  {'tensor peak MiB':>17}  "
            f"{'RSS peak MiB':>12}  {'energy J':>15}")
    lines += ["", head, f"{'':>4}  {'':>8}  {'plan / meas':>15}  {'plan / meas':>17}  "
                        f"{'meas':>12}  {'plan / meas':>15}"]
    before = report.get("resumed_after_step") or 0  # a resumed run's steps go on from there
    for k in range(len(report.get("loss", []))):
        lines.append(
            f"{before + k + 1:>4}  {loss_text(report['loss'][k]):>8}  "
            f"{_cell(pred_t, '{:.3g}') + ' / ' + _cell(report['step_time_s'][k], '{:.3g}'):>15}  "
            f"{_mib(pred_tensors) + ' / ' + _mib(report['ledger_peak_bytes'][k]):>17}  "
            f"{_mib(report['rss_peak_bytes'][k]):>12}  "
            f"{_cell(pred_e, '{:.3g}') + ' / ' + _cell(report['energy_j'][k], '{:.3g}'):>15}")
    if report.get("killed_at_step"):
        lines.append(f"{report['killed_at_step']:>4}  "
                     f"{report.get('killed_by') or 'killed by the memory limit'}")
    starts = starts_text(report.get("job_starts"))
    if starts:
        lines.append(f"starts    {starts} (medians leave each start's first step out)")
    changed = lr_history_text(report.get("lr_history"))
    if changed:
        lines.append(f"lr        {changed} (--resume with another --lr)")
    lines.append("")
    if report.get("kernel_peak_bytes") is not None:
        share = f" of the {fmt_bytes(limit)} limit" if limit else ""
        lines.append(f"kernel peak   {fmt_bytes(report['kernel_peak_bytes'])}{share} "
                     f"({report.get('kernel_peak_source')})")
    if report["mode"] == "plain" and report.get("training_physical_bytes"):
        # a planned run's is set against its plan (misses); a plain run's is the figure the
        # planned run's compares with
        lines.append(f"training      {fmt_bytes(report['training_physical_bytes'])} physical "
                     "(kernel peak - runtime baseline of "
                     f"{fmt_bytes(report['runtime_baseline_bytes'])})")
    if report.get("measured_peak_bytes") is not None:
        above = report.get("kernel_peak_bytes") is not None and \
            report["measured_peak_bytes"] > report["kernel_peak_bytes"]
        lines.append(f"process peak  {fmt_bytes(report['measured_peak_bytes'])} resident "
                     "(the training process alone" + (
                         "; above the kernel peak because the resident set counts pages of "
                         "shared files, torch's libraries, which the kernel charged to the "
                         "group that read them first" if above else "") + ")")
    lines += _classes_text(report)
    device = device_memory_line([{"device_peak_bytes": a, "device_reserved_peak_bytes": r}
                                 for a, r in zip(report.get("device_peak_bytes") or [],
                                                 report.get("device_reserved_peak_bytes") or [])])
    if device:
        lines.append(f"device peak   {device}")
    if report.get("grad_check") is not None:
        lines.append(f"gradients     {_grad_text(report['grad_check'])}")
    losses = [v for v in report.get("loss", []) if isinstance(v, (int, float))]
    if len(losses) >= 2:
        trend = "down" if losses[-1] < losses[0] else "NOT down"
        lines.append(f"loss          {loss_text(losses[0])} -> {loss_text(losses[-1])} "
                     f"({trend}, data: {report.get('data')})")
    if report.get("nonfinite_loss"):
        lines.append(f"warning       {nonfinite_loss_warning(report['nonfinite_loss'])}")
    for miss in report.get("misses", []):
        lines.append(f"miss          {miss}")
    malloc = malloc_warning(report)
    if malloc:
        lines.append(f"warning       {malloc}")
    for path in report.get("plots", []):
        lines.append(f"plot          {path}")
    if report.get("weights"):
        weights = report["weights"]
        lines.append(f"weights       {weights['file']} ({weights['save']}: "
                     f"{weights['tensors']} tensors, {weights['bytes'] / 2**20:.2f} MiB; "
                     "torch.load gives the model's state_dict names)")
        if weights.get("peft_adapter"):
            lines.append(f"adapter       {weights['peft_adapter']} (PeftModel.from_pretrained "
                         "reads it)")
    if report.get("report"):
        lines.append(f"report        {report['report']}")
    return "\n".join(lines)


def malloc_warning(report: dict) -> Optional[str]:
    """Where the board could not run under the malloc --malloc asked for (its library is not
    installed there, say), what it ran under and why: said as a `warning:` on the terminal
    and in report.txt, not only in report.json."""
    malloc = report.get("malloc") or {}
    if not malloc.get("note"):
        return None
    return f"--malloc {malloc.get('requested')}: {malloc['note']}"


def _classes_text(report: dict) -> list[str]:
    """Where the memory went, by class (agent memory_classes): plan / ledger at their peaks,
    and what the process held beyond the tensors (the runtime: not a planned tensor)."""
    split = report.get("memory_by_class")
    if not split:
        return []
    # each at its own peak: two moments of the step, whose splits may differ wholly (QA: a
    # plan's 18 MiB of optimizer state beside the ledger's 0 read as a ledger that missed it;
    # its 0.1 MiB of gradients beside the ledger's 16.3 as a plan that forgot them), so also
    # both at one moment, where the plan peaks (its predicted peak_at: the board watches the
    # ledger there, so the plan's split is the same in both lines)
    lines = ["memory        MiB, plan / ledger, each at its own peak: "
             + _class_cells(split["classes"], split["planned"], split["measured"])]
    if (moment := split.get("at_plan_peak")) is not None:
        stage, position = moment["at"]
        unseen = " (the ledger sees no workspace)" \
            if (moment["planned"].get("workspace") or 0) >= 2**20 / 20 else ""  # shown 0.1+
        lines.append(f"              both at stage {stage}, instruction {position} of step "
                     f"{moment['step']}, where the plan peaks: "
                     + _class_cells(split["classes"], moment["planned"], moment["measured"])
                     + unseen)
    resident, tensors = report.get("measured_peak_bytes"), report.get("tensor_peak_bytes")
    if resident and tensors:
        lines.append(f"              runtime and allocator slack {_mib(resident - tensors)} "
                     "(process peak minus tensors: not planned)")
    return lines


def _class_cells(classes: list, planned: dict, measured: dict) -> str:
    """"activations 3.1 / 3.0, ...": each class either side holds, plan / ledger (MiB)."""
    return ", ".join(f"{name.replace('_', ' ')} {_mib(planned.get(name))} / "
                     f"{_mib(measured.get(name))}" for name in classes
                     if planned.get(name) or measured.get(name))


def _grad_text(check: Any) -> str:
    if not isinstance(check, dict):
        return str(check)
    verdict = next((check[k] for k in ("bitwise_equal", "ok", "equal") if k in check), None)
    against = reference_words(check)
    words = {True: f"equal to {against}" + (" bit for bit" if "bitwise_equal" in check
                                             else ""),
             False: f"DIFFERENT from {against}",
             None: check.get("status", "not checked")}[verdict if verdict in (True, False)
                                                       else None]
    detail = ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                       for k, v in check.items() if k in ("max_abs_diff", "compared", "where",
                                                          "why"))
    return words + (f" ({detail})" if detail else "")
