"""A whole run: check the plan against the graph captured here, then N measured training steps.

run_plan   the plan's schedule (recomputation, paging), with the first step's gradients checked
           against plain eager PyTorch
run_plain  plain eager training, measured the same way (the baseline a plan is compared with)
"""

from __future__ import annotations

import contextlib
import itertools
from typing import Any, Callable

import torch

from ..accumulated_step import step_figure
from ..accumulation import GradientBuffers, micro_batches_of
from ..allocator import give_back_freed_memory, map_large_blocks, steady_heap
from ..capture import CaptureError, Captured
from ..capture.errors import GraphMismatch
from ..capture.optimizer import TORCH_OPTIMIZERS, optimizer_settings, torch_optimizer
from ..capture.replay import StepRunner
from ..costs import plan_costs
from ..devices import (allocated_peak, release_cached, reserved_peak, reset_peaks,
                       synchronize, unavailable)
from ..diverged import Remedy, is_nonfinite, remedy_for
from ..formats import HOME, Graph, Plan
from ..lr_schedule import ScheduledLr, lr_factor, lr_history
from ..memory_classes import CLASSES, ledger_classifier, planned_at, planned_by_class
from ..pages import PageStore
from ..profiler import LiveTensorLedger, StepMeter
from ..profiler.allocations import AllocatorPeak
from ..profiler.first_step import FirstStepMemory
from ..sensors import PowerSensor
from ..simulate import IO_MODES, PlanError, SimResult, simulate
from .batches import batch_source, data_name, is_example
from .checkpoint import (Checkpointing, check_resumable, restore_optimizer, restore_rng,
                         restore_weights, write_checkpoint)
from .arena import Arena, ArenaPlacement
from .baseline import group_peak, runtime_baseline
from .errors import OOM_REMEDY, BadInput, ExecutorError, PlanMismatch, first_line, \
    is_out_of_memory
from .gradcheck import compare, deterministic, eager_reference, replay_reference
from .python_heap import set_up_frozen
from .report import FORMAT, job_starts, step_record, summarize
from .step import PlannedStep, plain_step
from .stores import describe_stores, open_parameter_home, open_stores
from .updates import ParameterHome, make_optimizer, optimizers_of

ALLOCATORS = ("glibc", "arena")
Progress = Callable[[int, int, dict], None]  # (step index from 0, steps, that step's record)


def run_plan(graph: Graph, plan: Plan, steps: int, page_dir: str | None = None, data: Any = None,
             check_gradients: bool = True, progress: Progress | None = None,
             sensor: PowerSensor | str | None = None, *, device: str | torch.device = "cpu",
             captured: Captured | None = None, stores: dict[str, PageStore] | None = None,
             seed: int | None = None, flash_fsync: bool = True,
             flash_capacity_bytes: int | None = None,
             map_large_allocations: bool = True, lr: float | None = None,
             keep_parameters: bool = False, paging_io: str | None = None,
             allocator: str = "glibc", count_allocations: bool = False,
             lr_schedule: str = "constant", warmup: int = 0,
             on_trained: Callable[[torch.nn.Module, ParameterHome | None], None] | None = None,
             checkpointing: Checkpointing | None = None,
             stop_on_nonfinite: bool = False,
             remedy: Remedy | str | None = None, time_nodes: int = 0) -> dict[str, Any]:
    """Run `plan` for `steps` training steps; return the run report (see executor/__init__).
    `lr_schedule`, `warmup`: the learning rate's schedule over the steps (lr_schedule.py).
    `allocator`: "glibc" (tensors from the CPU allocator) or "arena" (every planned tensor in
    the plan's arena layout, executor/arena.py). `count_allocations`: run the last step under
    the CPU allocator's event stream and record what it allocated (the profiler slows that
    step: leave it out of timings).
    `keep_parameters`: afterwards, read the parameters homed on a page tier back into
    `captured.module` (it then holds the trained model; a board too small for the whole model
    leaves this off). `paging_io`: "overlap" (page on an IO thread beside compute) or "sync";
    None: as the plan was planned (`problem.io`). The arena pages synchronously: a page being
    written behind would still read a slot that the layout gives the next tensor.
    `on_trained(module, home)`: called after the last step while the parameter home is open
    (saving the trained weights from where they live, executor/saved_weights.py).
    `checkpointing`: checkpoints written after steps, a stop before `steps`, and a start
    from a checkpoint (checkpoint.py); the learning rate's schedule spans `steps` all the
    same, and `lr` may differ from the checkpoint's run's: its steps train at the new base
    rate (times the schedule's factor), the optimizer state going on unchanged, and the
    checkpoints and the report's optimizer keep which steps took which (`lr_history`). From
    the job's own checkpoint (its daemon started it again) the report holds the
    job's earlier steps too, and from one after its last step the run trains nothing: it
    saves the weights (on_trained) and reports the steps that checkpoint holds.
    `stop_on_nonfinite`: stop after the first step whose loss is not finite (NaN, inf:
    diverged.py), writing no checkpoint of it and not calling `on_trained`; the report's
    `stopped_at_step` names it (None: the run took every step). `remedy`: what the report
    says to try should a loss not be finite (diverged.remedy_for, as the caller's progress
    says it; None: remedy_for the graph and `lr`). `time_nodes`: time each node in that many
    steps after this start's first, and measure what its first step leaves (without a
    gradient check on it: node_timing.py); the report's `node_times` has them."""
    if steps < 1:
        raise BadInput(f"steps must be at least 1, got {steps}")
    if (why := unavailable(device)) is not None:  # the board's torch, not the input: as
        raise ExecutorError(why)  # the profile job's, a failed job
    check_lr_schedule(lr_schedule, warmup, steps)
    checkpointing = checkpointing or Checkpointing()
    resume = checkpointing.resume
    start, last = resume.steps_done if resume else 0, checkpointing.stop_after or steps
    if resume is not None:
        check_resumable(resume, checkpointing.identity, steps, checkpointing.stop_after,
                        own=checkpointing.own)
    earlier = checkpointing.history()  # the job's steps before this start
    this_start = 1 + max((r.get("job_start") or 1 for r in earlier["steps"]), default=0)
    paging_io = paging_io or plan.problem.get("io") or "sync"
    if paging_io not in IO_MODES:
        raise BadInput(f"paging IO must be one of {', '.join(IO_MODES)}, got {paging_io!r}")
    if graph.planning_only:
        raise BadInput(f"graph '{graph.name}' is for planning only (imported, not captured): "
                       "capture the model with `edge-remat graph` to run it")
    check_plan_is_for(graph, plan, "the graph file")
    check_allocator(plan, allocator)
    if captured is None:
        captured = capture_here(graph)
    check_plan_is_for(captured.graph, plan, "the graph captured on this machine")
    optimizer_description = _optimizer_description(captured.graph, lr, lr_schedule, warmup)
    # the base rate by step: the restored optimizer state holds no rate (restore_optimizer
    # sets each parameter's state, not the param groups), so this run's steps take `lr`
    lrs = lr_history(resume.lr_history if resume else None, start + 1,
                     optimizer_description["lr"])
    sim = validate(captured.graph, plan)
    pages = sim.page_ins + sim.page_outs + sim.home_reads > 0
    overlap = (sim.memory_trace, sim.peak_bytes) \
        if paging_io == "overlap" and pages and allocator != "arena" else None
    device = torch.device(device)
    module = _on_device(captured.module, device)
    power = open_power_sensor(sensor)
    batches = batch_source(data, captured.example_args, device, 0 if seed is None else seed,
                           module, skip=resume.batches_taken if resume else 0)
    if resume is not None:  # before the parameters move to their home
        restore_weights(resume, module)
    ledger = LiveTensorLedger(classify=ledger_classifier(captured.trace))
    malloc = map_large_blocks() if map_large_allocations else steady_heap()
    records: list[dict] = []
    grad_check: dict | None = None
    stopped_at: int | None = None
    if seed is not None:
        torch.manual_seed(seed)
    k = micro_batches_of(captured.graph)
    sums = GradientBuffers(k, ledger) if k > 1 else None  # the ledger counts them as made
    with deterministic(device), open_stores(plan, captured.graph, page_dir, stores,
                                            flash_fsync, flash_capacity_bytes,
                                            device) as opened, \
            open_parameter_home(captured.graph, module, page_dir, flash_fsync, plan) as home, \
            set_up_frozen() as before_step:
        optimizer = make_optimizer(captured.graph, module, lr, home, ledger, sums)
        schedule = ScheduledLr(optimizers_of(optimizer), lr_schedule, warmup, steps)
        if resume is not None and start < last:  # nothing to train: the weights alone
            restore_optimizer(resume, module, optimizer, device)
            restore_rng(resume, device)
        runner = StepRunner(captured.trace, captured.graph, module,
                            batches(0) if is_example(data) else captured.example_args,
                            device, ledger, home.load if home else None,
                            home.load_many if home else None)
        # What the kernel charges before the first step, before the arena exists.
        baseline = runtime_baseline(module)
        arena = open_arena(plan, captured.graph, device) if allocator == "arena" else None
        placement = None if arena is None else ArenaPlacement(arena, runner, captured.graph)
        planned = PlannedStep(runner, captured.graph, plan, module, optimizer, opened, ledger,
                              overlap, placement, sums, time_nodes)
        planned.interpreter.watch_at = flat_index(plan.stages, plan_peak_at(plan, sim))
        for i in range(start, last):
            schedule.at(i)
            planned.timing = planned.node_times.wanted(i - start)
            # K micro-batches a step when accumulating, fetched as each pass starts
            micro = (batches(i * k + j) for j in range(k))
            batch = next(micro)
            if check_gradients and i == start:
                micro = tuple(micro)  # the reference trains on them first
                reference = plain_reference(captured, home, module, batch, device, micro)

                def check(loss, grads, reference=reference):
                    nonlocal grad_check
                    grad_check = compare(reference, loss, grads, module)
            else:
                check = None
            reset_peaks(device)
            if arena is not None:
                arena.start_step()
            counted = AllocatorPeak(device) if count_allocations and i == last - 1 else None
            before_step(i)
            # what the ops' first calls keep, for a profile that lacks it (node_timing.py): in
            # a first step no eager reference ran before
            if time_nodes and i == start and check is None:
                planned.first_step = FirstStepMemory(runner, optimizer)
            with StepMeter(ledger, power) as meter, counted or contextlib.nullcontext():
                result = planned.run(batch, check) if sums is None else \
                    planned.run_accumulated(itertools.chain((batch,), micro), check)
                synchronize(device)  # the step ends when the device's queue does
            if planned.first_step is not None:
                planned.node_times.first_step_left = planned.first_step.shares()
                planned.first_step = None
            if check is not None:
                check = reference = None  # the reference's gradients go before step 2
                give_back_freed_memory()
                release_cached(device)
            records.append(step_record(i + 1, result.loss, meter.result, result.counts,
                                       allocated_peak(device), reserved_peak(device)))
            records[-1]["job_start"] = this_start
            records[-1]["ledger_peak_by_class"] = dict(ledger.peak_by_class)
            if (held := planned.interpreter.held_at_watch) is not None:  # the first step's
                records[-1]["ledger_at_plan_peak_by_class"] = held
                planned.interpreter.watch_at = planned.interpreter.held_at_watch = None
            if arena is not None:
                records[-1]["arena"] = arena.counts.to_dict()
            if counted is not None and counted.measured:
                records[-1]["cpu_allocations"] = {
                    "count": counted.allocations, "bytes": counted.allocated_bytes,
                    "peak_bytes": counted.peak_bytes}
            # the loss is a Python float already: one isfinite a step, nothing more
            diverged = stop_on_nonfinite and is_nonfinite(result.loss)
            if checkpointing.due(i + 1, last) and not diverged:  # no resuming from NaN
                checkpointing.written.append(write_checkpoint(
                    checkpointing.path, module, home, optimizer, i + 1, (i + 1) * k, steps,
                    checkpointing.identity, device,
                    {**earlier, "steps": earlier["steps"] + records,
                     "grad_check": _latest(grad_check, earlier["grad_check"])}, lrs))
                records[-1]["checkpoint_s"] = checkpointing.written[-1]["save_s"]
            if progress is not None:
                progress(i, steps, records[-1])
            if diverged:
                stopped_at = i + 1
                break
        tiers = describe_stores(opened)
        weights = _weight_figures(home)
        if on_trained is not None and stopped_at is None:  # diverged weights are not kept
            on_trained(module, home)
        if keep_parameters and home is not None:
            home.bring_back()
    # The board's own kernel peak, for a host that holds no cgroup of it (an SSH board's)
    kernel_peak = group_peak(baseline)
    # Peak, times and energies are the plan's (its profile's op costs and workspaces; the
    # replay here has only the graph's), so that a run's report and its plan file agree.
    predicted = {**sim.summary(), **{k: v for k, v in plan.predicted.items()
                                     if k in ("peak_bytes", "peak_at", "time_s", "tdi_percent",
                                              "compute_time_s", "paging_time_s", "energy_j",
                                              "energy_compute_j", "energy_paging_j",
                                              "energy_static_j", "io", "step_time_s",
                                              "io_busy_s", "io_wait_s", "paging_hidden_share",
                                              "io_slowed_s", "accumulated_step")}}
    predicted["peak_at"] = list(predicted["peak_at"])  # JSON has no tuples
    records = earlier["steps"] + records
    grad_check = _latest(grad_check, earlier["grad_check"])
    first = records[0]
    figures = checkpointing.figures()
    node_times = planned.node_times.report(captured.graph)
    if figures is not None and checkpointing.own:  # which start trained which steps
        figures["starts"] = job_starts(records, finished_after=start if start == last else None)
    return {
        "format": FORMAT, "version": 1, "mode": "plan", "model": captured.graph.name,
        "graph_fingerprint": captured.graph.fingerprint(), "plan_fingerprint": plan.fingerprint,
        "device": str(device), "torch": torch.__version__, "deterministic": True, "seed": seed,
        "data": data_name(data),
        "optimizer": {**optimizer_description,
                      **({"lr_history": lrs} if len(lrs) > 1 else {})},
        "sensor": getattr(power, "name", None), "tiers": tiers, "allocator": malloc,
        "paging_io": "overlap" if overlap else "sync",
        "executor_allocator": allocator, "arena": describe_arena(arena, plan),
        "runtime_baseline_bytes": baseline["bytes"], "runtime_baseline": baseline,
        "budget_bytes": plan.budget_bytes, "fixed_bytes": captured.graph.fixed_bytes,
        "predicted_peak_bytes": predicted["peak_bytes"],
        "predicted_time_s": step_figure(predicted, "time_s"),
        "predicted": predicted,
        "recomputed": first["recomputed"], "page_ins": first["page_ins"],
        "page_outs": first["page_outs"],
        "grad_check": grad_check, "steps": records, "stopped_at_step": stopped_at,
        "memory_by_class": memory_by_class(captured.graph, plan, sim, records),
        "summary": summarize(records, predicted,
                             remedy or remedy_for(captured.graph.capture, lr)),
        **({"weights": weights} if weights else {}),
        **({"checkpoint": figures} if figures else {}),
        **({"node_times": node_times} if node_times else {}),
        **({"kernel_peak": kernel_peak} if kernel_peak else {}),
    }


def _latest(check: dict | None, earlier: dict | None) -> dict | None:
    """This start's gradient check (made on its first step), else an earlier start's."""
    return check if check is not None else earlier


def _on_device(module: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """The module on `device`; a model built on `meta` (its weights made or read from the
    weight page store when the parameter home opens) stays as it is, on the CPU only."""
    from ..weights import is_deferred
    if not is_deferred(module):
        return module.to(device)
    if device.type != "cpu":
        raise BadInput(f"'{type(module).__name__}' reads its weights from a weight page store, "
                       "which this executor does on the CPU only: run it with --device cpu")
    return module


def _weight_figures(home: ParameterHome | None) -> dict | None:
    """The weight page store's figures (frozen parameters read from flash), when it served."""
    paged = getattr(home, "frozen", None)
    if paged is None:
        return None
    return {**paged.figures(), "written": paged.written}


def run_plain(graph: Graph, steps: int, data: Any = None, progress: Progress | None = None,
              sensor: PowerSensor | str | None = None, *, device: str | torch.device = "cpu",
              model: tuple | None = None, seed: int | None = None,
              map_large_allocations: bool = True, lr: float | None = None,
              lr_schedule: str = "constant", warmup: int = 0) -> dict[str, Any]:
    """Plain eager training of the graph's model (rebuilt from `graph.capture`, or `model` as
    (module, example_args)), measured like run_plan, clipping the gradients as the graph says;
    the ledger is not kept (None)."""
    if steps < 1:
        raise BadInput(f"steps must be at least 1, got {steps}")
    if (why := unavailable(device)) is not None:  # the board's torch, not the input: as
        raise ExecutorError(why)  # the profile job's, a failed job
    check_lr_schedule(lr_schedule, warmup, steps)
    if model is None:
        from ..capture.models import load_source_model
        source = graph.capture.get("source") or {}
        if "model" not in source:
            raise BadInput(f"graph '{graph.name}' does not say which model it was "
                           "captured from")
        try:
            model = load_source_model(source)
        except CaptureError as error:
            raise BadInput(str(error)) from error
    device = torch.device(device)
    module, example_args = model[0].to(device), tuple(model[1])
    optimizer = torch_optimizer(graph.capture.get("optimizer", "sgd"), module, lr)
    schedule = ScheduledLr([optimizer], lr_schedule, warmup, steps)
    clip = graph.capture.get("clip_grad_norm")
    k = micro_batches_of(graph)
    power = open_power_sensor(sensor)
    batches = batch_source(data, example_args, device, 0 if seed is None else seed, module)
    ledger = LiveTensorLedger()  # StepMeter wants one; eager tensors are not registered
    allocator = map_large_blocks() if map_large_allocations else steady_heap()
    records: list[dict] = []
    if seed is not None:
        torch.manual_seed(seed)
    with deterministic(device):
        for i in range(steps):
            schedule.at(i)
            reset_peaks(device)
            try:
                with StepMeter(ledger, power) as meter:
                    loss = plain_step(module, optimizer,
                                      *(batches(i * k + j) for j in range(k)),
                                      clip_grad_norm=clip)
                    synchronize(device)
            except Exception as error:
                if is_out_of_memory(error):
                    raise ExecutorError(f"plain training ran out of memory at step {i + 1} "
                                        f"({first_line(error)})") from error
                raise
            records.append(step_record(i + 1, loss, meter.result, None, allocated_peak(device),
                                       reserved_peak(device)))
            if progress is not None:
                progress(i, steps, records[-1])
    return {"format": FORMAT, "version": 1, "mode": "plain", "model": graph.name,
            "graph_fingerprint": graph.fingerprint(), "device": str(device),
            "torch": torch.__version__, "deterministic": True, "seed": seed,
            "data": data_name(data),
            "optimizer": _optimizer_description(graph, lr, lr_schedule, warmup),
            "sensor": getattr(power, "name", None),
            "allocator": allocator, "fixed_bytes": graph.fixed_bytes, "steps": records,
            "summary": summarize(records)}


# -- before the first step ---------------------------------------------------------------------

def plain_reference(captured: Captured, home: ParameterHome | None, module: torch.nn.Module,
                    batch, device: torch.device, more: tuple = ()):
    """The gradient check's plain step (gradcheck.py says which): eager PyTorch on the CPU,
    with parameters homed on a tier read back for it; on a device, the captured step's ops
    replayed plainly, its param nodes loading from the home as the planned step's do.
    `more`: the step's further micro-batches (gradient accumulation)."""
    if device.type != "cpu":
        return replay_reference(captured, module, batch, device, more,
                                home.load if home else None)
    if home is None:
        return eager_reference(module, batch, device, more)
    home.bring_back()
    try:
        return eager_reference(module, batch, device, more)
    finally:
        home.release()


def check_allocator(plan: Plan, allocator: str) -> None:
    if allocator not in ALLOCATORS:
        raise BadInput(f"unknown allocator {allocator!r}: use {' or '.join(ALLOCATORS)}")
    if allocator == "arena" and plan.arena is None:
        raise BadInput("the plan has no arena layout, so it cannot run with the arena "
                       "allocator: plan it with `edge-remat plan --arena best-fit` (or cpsat)")


def open_arena(plan: Plan, graph: Graph, device: torch.device) -> Arena:
    try:
        return Arena(plan.arena, graph, plan, device)
    except ValueError as error:
        raise BadInput(str(error)) from error
    except RuntimeError as error:
        if is_out_of_memory(error):
            raise ExecutorError(f"cannot allocate the plan's arena of {plan.arena.size_bytes} "
                                f"bytes ({first_line(error)}). Remedy: {OOM_REMEDY}") from error
        raise


def describe_arena(arena: Arena | None, plan: Plan) -> dict[str, Any] | None:
    if arena is None:
        return None
    return {"size_bytes": arena.nbytes, "method": plan.arena.method, "device": str(arena.device),
            # Measured on the CPU; on CUDA the path runs but nothing here has measured it.
            "measured": arena.device.type == "cpu", **plan.arena.details}


def check_plan_is_for(graph: Graph, plan: Plan, what: str) -> None:
    if not plan.graph_fingerprint:
        raise PlanMismatch("the plan does not say which graph it was made for (no "
                           "graph_fingerprint): make it with `edge-remat plan --graph`")
    if plan.graph_fingerprint != graph.fingerprint():
        raise PlanMismatch(f"the plan was made for graph {plan.graph_fingerprint}, but {what} "
                           f"('{graph.name}') is {graph.fingerprint()}: refusing to run it. "
                           "Remedy: plan again from this graph (`edge-remat plan --graph`)")


def capture_here(graph: Graph, traced: bytes | None = None, in_ram: bool = False) -> Captured:
    """The graph's model captured again on this machine (in a child process, so that tracing's
    memory is not this process's); refused when it differs from the graph file. `traced`: the
    child's answer when the caller ran it already (capture.isolated.trace_in_child); `in_ram`:
    with its parameters in RAM, the graph's compute nodes (pipeline.recapture_in_ram)."""
    from ..capture.isolated import capture_isolated
    if "model" not in (graph.capture.get("source") or {}):
        raise BadInput(f"graph '{graph.name}' does not say which model it was captured from: "
                       "capture it with `edge-remat graph`")
    try:
        return capture_isolated(graph, traced=traced, in_ram=in_ram)
    except GraphMismatch as error:
        raise PlanMismatch(f"{error}. Remedy: capture the graph with the same torch and model "
                           "code as this board, and plan again") from error
    except CaptureError as error:
        raise BadInput(str(error)) from error
    except RuntimeError as error:
        raise ExecutorError(str(error)) from error


def memory_by_class(graph: Graph, plan: Plan, sim: SimResult, records: list[dict]) -> dict:
    """Where the memory went: the plan's peak and the ledger's highest step peak, by class
    (memory_classes), and both just after the instruction where the plan peaks (plan_peak_at)
    (`at_plan_peak`, from the first step, run instruction by instruction as every first step
    is: compiled steps keep no such moment). The runtime is the kernel's figure (the host's report), not a tensor."""
    top = max(records, key=lambda r: r.get("ledger_peak_bytes") or 0)
    measured = top.get("ledger_peak_by_class") or {}
    costs = plan_costs(graph, plan)
    split = {"classes": list(CLASSES),  # replayed as validate replays it
             "planned": planned_by_class(graph, plan, costs, sim),
             "measured": {name: measured.get(name, 0) for name in CLASSES},
             "measured_step": top["step"]}
    held = [r for r in records if "ledger_at_plan_peak_by_class" in r]
    if held:
        at = plan_peak_at(plan, sim)
        split["at_plan_peak"] = {
            "at": list(at), "step": held[0]["step"],
            "planned": planned_at(graph, plan.stages, at, costs.workspace(graph),
                                  plan.runtime_warm_bytes),
            "measured": {name: held[0]["ledger_at_plan_peak_by_class"].get(name, 0)
                         for name in CLASSES}}
    return split


def plan_peak_at(plan: Plan, sim: SimResult) -> tuple[int, int]:
    """Where the plan peaks: its own `predicted.peak_at` (the planner's replay, with the
    profile's costs: a measured op's workspace moves the peak), else where the board's replay
    with the graph's costs does. The ledger is watched there, so the report's plan split at
    its peak and at the watched moment are one (QA: digits-cnn, the plan's peak at a
    convolution backward with 18.0 MiB of workspace, the board watched two instructions before
    it, where the plan holds 216.0 MiB of activations and no workspace)."""
    at = plan.predicted.get("peak_at")
    if isinstance(at, (list, tuple)) and len(at) == 2 and 0 <= at[0] < len(plan.stages) \
            and 0 <= at[1] < len(plan.stages[at[0]]):
        return int(at[0]), int(at[1])
    return sim.peak_at


def flat_index(stages, at: tuple[int, int]) -> int:
    """Instruction (stage, position) as its index in the step's one run of instructions."""
    return sum(len(stage) for stage in stages[:at[0]]) + at[1]


def validate(graph: Graph, plan: Plan) -> SimResult:
    """The simulator's replay of the plan (its reference semantics) on the captured graph."""
    missing = sorted({ins.tier for ins in plan.instructions()  # home: the param node's costs
                      if ins.tier not in (None, HOME) and ins.tier not in plan.tiers})
    if missing:  # its figures are what the plan's time was costed with: never made up here
        raise BadInput(f"the plan pages to {' and '.join(missing)} but carries no figures for "
                       "it (the plan's `tiers`): plan again with `edge-remat plan`, which "
                       "writes the figures of every tier it pages to")
    try:
        return simulate(graph, plan_costs(graph, plan), plan.stages, plan.budget_bytes)
    except PlanError as error:
        raise BadInput(f"the plan cannot run: {error}") from error


def open_power_sensor(sensor: PowerSensor | str | None) -> PowerSensor | None:
    """A sensor object, a name, "auto" (the board's own sensor if it has one), or None/"none"."""
    if sensor is None or isinstance(sensor, PowerSensor):
        return sensor
    from ..profiler import choose_sensor
    from ..sensors import SensorError
    try:
        return choose_sensor(sensor, fallback="none")[0]
    except SensorError as error:
        raise BadInput(str(error)) from error


def _optimizer_description(graph: Graph, lr: float | None, lr_schedule: str = "constant",
                           warmup: int = 0) -> dict[str, Any]:
    """The optimizer's name and options as it steps (an `lr` given to the run included, its
    schedule, the gradients' clipping), and whether it steps group by group as gradients
    complete (fused) or once after the backward."""
    name = graph.capture.get("optimizer", "sgd")
    options = optimizer_settings(name) if name in TORCH_OPTIMIZERS else {}
    return {"name": name, **options, "lr": float(lr) if lr is not None else options.get("lr"),
            "lr_schedule": lr_schedule, "warmup": warmup,
            "clip_grad_norm": graph.capture.get("clip_grad_norm"),
            "update": graph.capture.get("update", "step")}


def check_lr_schedule(schedule: str, warmup: int, steps: int) -> None:
    try:
        lr_factor(schedule, warmup, steps)
    except ValueError as error:
        raise BadInput(str(error)) from None
