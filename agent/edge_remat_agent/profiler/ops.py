"""The op profiler: every planner node of a captured graph, timed on real inputs on this board.

Two passes, both through capture.replay.StepRunner (the executor's engine):

1. Isolated. One plain training step runs node by node. After a node's first run, while its
   inputs are still in memory, it is run again and again until the timed runs add up to a
   window the clock and the power sensor can resolve (10 ms at least; with a sensor, at least
   10 sensor periods), exactly as the executor recomputes it (random state replayed, batch-norm
   statistics not applied again); of three such windows the fastest counts. Its output and
   workspace bytes come from the real tensors, through a live-tensor ledger; its energy from
   the sensor. The update node times the optimizer's step.
   The ledger sees only the tensors the step runner holds, not the scratch an ATen kernel
   allocates inside itself and frees before returning (convolution_backward on the CPU: ~9 MiB
   at ResNet-18 batch 8 32x32, ~27 MiB at batch 16 64x64, so a plan made with the ledger's
   workspace used 58-69% of eager's allocator peak at a budget of 50%). So each node runs once
   more, untimed, under the allocator's own meter (allocations.AllocatorPeak: torch.profiler's
   memory events on the CPU, the caching allocator's peak on CUDA): the bytes it allocated at
   its peak, above what was allocated when it started, less its outputs and the gradients it
   makes (fixed memory), are its allocator workspace. On the CPU it runs once more with the
   kernel's resident high-water mark reset (memory.resident_peak_bytes): the rise, less its
   outputs and gradients, is its resident workspace, which counts scratch that bypasses c10's
   allocator and whole pages (resnet18 b16: a layer-4 convolution_backward rose 10.4 MiB
   beyond its outputs where the allocator saw 9.0, a layer-3 one 7.0 where it saw 4.5).
   `workspace_bytes` is the largest of the three; the profile's op carries it to the planner.
   Before any of that, one plain step runs node by node, untimed, as a run's first step does
   (first_step_memory): what it left in the process's anonymous resident memory (heap
   trimmed), beyond the optimizer state it made, is what the ops' first calls leave for the
   life of the process (oneDNN's primitives and their scratch, kernel caches, the runner's
   prepared ops), `persistent_bytes`, split over the nodes in proportion to the rise each
   one's call left beyond the tensors the runner holds. The runtime baseline is taken before
   the first step, so no plan counted it: mobilenet_v2 b8 32x32, 2.9 MiB, a tenth of its
   planned peak. `runtime_warm_bytes` sums it, the fixed memory a run pays from its first
   step on. Only a process where these ops have not run yet sees it. Each node's rise alone,
   clipped at zero and summed, was no measure of it: a call's reading moves by a few heap
   pages either way, so the sum grew with the nodes, and it missed what no single call shows
   (gpt-tiny in run's profile job: 0.78 MiB over 61 nodes, 1.18 MiB over 185 operator-level
   ones, where the first step, taken right after the job's capture, left 2.35 and 2.76 MiB).
   `measure_workspace` is this memory half alone, one plain step, nothing timed.
2. In context. CONTEXT_STEPS whole plain steps run node by node, each node timed once per
   step; the median counts as the node's `time_s`. A node repeated on its own finds its inputs,
   weights and workspace hot in the caches; in a step it follows other nodes that evicted
   them, as it does when the executor runs a plan. Measured here: isolated times summed to
   0.72 s of a 0.93 s digits-cnn step (in context: 0.87 s), so isolated times alone predicted
   steps 20-25% short. The isolated time stays in each node's record (`isolated_time_s`), and
   the energy per run is scaled by in-context / isolated time (the same power for longer).

Measurements become the profile's `ops`, keyed the way `costs.build_costs` looks them up
(`node.signature or node.op`); nodes that share a signature (identical layers) share the mean.
An op's `energy_j` is its energy above idle (the profile format's convention), and is only
given when a sensor and the idle power are.
"""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any, Callable

import torch

from ..allocator import map_large_blocks, steady_heap
from ..capture import Captured
from ..capture.replay import StepRunner
from ..devices import synchronize
from ..executor.updates import FusedUpdates, make_optimizer
from ..formats import Node
from ..formats.profile import OpCost
from ..sensors import EnergyMeter, PowerSensor
from .allocations import AllocatorPeak
from .first_step import FirstStepMemory, split_in_proportion, storage_bytes
from .memory import LiveTensorLedger, resident_peak_bytes
from .tiers import MIN_WINDOW_S, time_repeated

SENSOR_PERIODS = 10  # a window spans at least this many sensor samples
SENSOR_PERIOD_S = 0.01
WINDOWS = 3  # each node is timed in this many windows; the fastest counts
CONTEXT_STEPS = 5  # whole plain steps timed node by node; each node's median counts


@dataclass
class NodeMeasurement:
    id: Any
    name: str
    kind: str
    key: str  # the profile key: node.signature or node.op
    time_s: float  # seconds per run inside plain steps (median), else the isolated time
    runs: int  # isolated runs timed, all windows
    out_bytes: int
    workspace_bytes: int  # transient bytes beyond its outputs: max(ledger's, allocator's)
    energy_j: float | None = None  # per run, above idle
    isolated_time_s: float | None = None  # seconds per run, in the fastest isolated window
    context_runs: int = 0  # plain steps it was timed in
    ledger_workspace_bytes: int | None = None  # peak of the tensors the runner holds, beyond
    # what it holds after the node (its outputs)
    allocator_peak_bytes: int | None = None  # allocator bytes at the node's peak above its
    # start (None: not measured, e.g. no allocator meter for the device, or the update node)
    allocator_workspace_bytes: int | None = None  # that peak less its outputs and gradients
    resident_workspace_bytes: int | None = None  # the process's resident rise during the node
    # less its outputs and gradients (memory.resident_peak_bytes; None: not measured)
    persistent_bytes: int | None = None  # its share of what the first step left (first_step_memory)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def profile_key(node: Node) -> str:
    return node.signature or node.op


def window_s(min_window_s: float = MIN_WINDOW_S, sensor: PowerSensor | None = None) -> float:
    if sensor is None:
        return max(min_window_s, MIN_WINDOW_S)
    return max(min_window_s, MIN_WINDOW_S, SENSOR_PERIODS * SENSOR_PERIOD_S)


def measure_nodes(captured: Captured, min_window_s: float = MIN_WINDOW_S,
                  sensor: PowerSensor | None = None, idle_w: float | None = None,
                  device: str | torch.device | None = None,
                  progress: Callable[[int, int, NodeMeasurement], None] | None = None,
                  map_large_allocations: bool = True,
                  context_steps: int = CONTEXT_STEPS,
                  allocator_pass: bool = True,
                  first_step: dict[Any, int] | None = None) -> list[NodeMeasurement]:
    """Time every node of `captured.graph` (the module's parameters change: the update node
    steps the optimizer; profile a throwaway copy). `map_large_allocations`: the allocator
    setting the executor runs with (allocator.py), so that the times are the executor's.
    `context_steps`: plain steps for the in-context pass (0: isolated times only).
    `allocator_pass`: one more untimed run of each node under the allocator's meter, for the
    scratch its kernels allocate inside themselves (False: the ledger's workspace only).
    `first_step`: what first_step_left measured before this process did anything else (the
    profile job's board measurements warm part of it up); None: measured here first."""
    graph = captured.graph
    runner, module, ledger, meter = _runner_for(captured, device, map_large_allocations,
                                                allocator_pass)
    window = window_s(min_window_s, sensor)
    optimizer = make_optimizer(graph, module, None, None, None)
    left = first_step if first_step is not None else first_step_memory(
        runner, module, optimizer, captured.example_args)
    out: list[NodeMeasurement] = []
    runner.start_step(module, captured.example_args)
    for index, node in enumerate(graph.nodes):
        if node.kind == "update":
            measured = _measure_update(node, runner, module, optimizer, window, sensor, idle_w)
            if isinstance(optimizer, FusedUpdates):
                optimizer.release(node)
        else:
            measured = _measure_node(node, runner, ledger, window, sensor, idle_w, meter)
            runner.free_inputs_read_last(node.id)
        if left is not None:
            measured.persistent_bytes = left.get(node.id, 0)
        out.append(measured)
        if progress is not None:
            progress(index, len(graph), measured)
    runner.release_all()
    if context_steps > 0:
        in_context = time_in_context(runner, module, optimizer, captured.example_args,
                                     context_steps)
        for measured in out:
            isolated = measured.time_s
            measured.isolated_time_s, measured.context_runs = isolated, context_steps
            measured.time_s = in_context[measured.id]
            if measured.energy_j is not None and isolated > 0:
                measured.energy_j *= measured.time_s / isolated
    return out


def _runner_for(captured: Captured, device, map_large_allocations: bool, allocator_pass: bool):
    """(a step runner over the captured model, the module, its ledger, the allocator's meter
    or None), the executor's allocator setting applied."""
    if map_large_allocations:
        map_large_blocks()
    else:
        steady_heap()
    module = captured.module
    from ..weights.deferred import make_missing
    make_missing(module)  # a model built on meta: nodes run on real values
    if device is not None:
        module = module.to(device)
    ledger = LiveTensorLedger()
    runner = StepRunner(captured.trace, captured.graph, module, captured.example_args, device,
                        ledger)
    meter = AllocatorPeak(device) if allocator_pass and AllocatorPeak.supported(device) else None
    return runner, module, ledger, meter


def time_in_context(runner: StepRunner, module: torch.nn.Module,
                    optimizer: torch.optim.Optimizer, example_args,
                    steps: int) -> dict[Any, float]:
    """Each node's median seconds over `steps` plain steps run node by node, its frees (and,
    for the update node, handing the gradients to the optimizer) included, as in the executor."""
    graph = runner.graph
    times: dict[Any, list[float]] = {node.id: [] for node in graph.nodes}
    for _ in range(steps):
        runner.start_step(module, example_args)
        for node in graph.nodes:
            start = time.perf_counter()
            _plain_node(node, runner, module, optimizer)
            times[node.id].append(time.perf_counter() - start)
        runner.release_all()
    return {node_id: statistics.median(runs) for node_id, runs in times.items()}


def _plain_node(node: Node, runner: StepRunner, module: torch.nn.Module,
                optimizer: torch.optim.Optimizer | FusedUpdates) -> None:
    """One node of a plain step as the executor runs it: its frees (and, for the update node,
    handing the gradients to the optimizer) included."""
    if node.kind == "update":
        _update_step(node, runner, module, optimizer)()
        if isinstance(optimizer, FusedUpdates):
            runner.free_inputs_read_last(node.id)
            optimizer.release(node)
        else:
            optimizer.zero_grad(set_to_none=True)
    else:
        runner.compute(node.id)
        runner.free_inputs_read_last(node.id)
    synchronize(runner.device)


def first_step_memory(runner: StepRunner, module: torch.nn.Module,
                      optimizer: torch.optim.Optimizer | FusedUpdates,
                      example_args) -> dict[Any, int] | None:
    """What one plain step, run node by node in a process where the graph's ops have not run
    yet, left in its anonymous resident memory beyond the optimizer state it made (fixed memory
    the graph counts): a run's first step pays it, no later one (gpt-tiny: 1.4-1.6 MB, then
    -20..+45 KB a step). Node id -> its share: the whole split in proportion to the rise each
    node's call left beyond what the runner then holds (its outputs, gradients), so that the
    shares of a graph's nodes add up to what its step left. None off Linux."""
    meter = FirstStepMemory(runner, optimizer)
    if not meter.supported:
        return None
    runner.start_step(module, example_args)
    for node in runner.graph.nodes:
        meter.around(node.id, lambda node=node: _plain_node(node, runner, module, optimizer))
    runner.release_all()
    return meter.shares()


def first_step_left(captured: Captured, device: str | torch.device | None = None,
                    map_large_allocations: bool = True) -> dict[Any, int] | None:
    """first_step_memory on a runner of its own (the module's parameters take one step)."""
    runner, module, _, _ = _runner_for(captured, device, map_large_allocations, False)
    optimizer = make_optimizer(captured.graph, module, None, None, None)
    return first_step_memory(runner, module, optimizer, captured.example_args)


def ops_from(measurements: list[NodeMeasurement]) -> dict[str, OpCost]:
    """Profile `ops`: one entry per key, the mean over the nodes that share it; their shares
    of what the first step left summed (first_step_memory), so the ops of a graph sum to what
    its profiled step left."""
    groups: dict[str, list[NodeMeasurement]] = {}
    for m in measurements:
        groups.setdefault(m.key, []).append(m)
    ops = {}
    for key, rows in groups.items():  # workspace: the larger of ledger's and allocator's
        energies = [r.energy_j for r in rows]
        persistent = [r.persistent_bytes for r in rows if r.persistent_bytes is not None]
        ops[key] = OpCost(
            time_s=statistics.fmean(r.time_s for r in rows),
            energy_j=None if any(e is None for e in energies) else statistics.fmean(energies),
            out_bytes=max(r.out_bytes for r in rows),
            workspace_bytes=max(r.workspace_bytes for r in rows),
            persistent_bytes=sum(persistent) if persistent else None)
    return ops


def _measure_node(node: Node, runner: StepRunner, ledger: LiveTensorLedger, window: float,
                  sensor: PowerSensor | None, idle_w: float | None,
                  meter: AllocatorPeak | None = None) -> NodeMeasurement:
    sizes = _node_bytes(node, runner, ledger, meter)
    def computed(i):
        runner.compute(node.id)
        synchronize(runner.device)  # timed to the kernels' end, not their launch

    time_s, runs, energy = _timed(computed, window, sensor, idle_w,
                                  after=lambda i: runner.free(node.id))
    runner.compute(node.id)  # its outputs, for the nodes after it
    return NodeMeasurement(node.id, node.name, node.kind, profile_key(node), time_s, runs,
                           sizes.out_bytes, sizes.workspace_bytes, energy,
                           ledger_workspace_bytes=sizes.ledger_workspace_bytes,
                           allocator_peak_bytes=sizes.allocator_peak_bytes,
                           allocator_workspace_bytes=sizes.allocator_workspace_bytes,
                           resident_workspace_bytes=sizes.resident_workspace_bytes)


@dataclass
class NodeBytes:
    """One node's bytes, three ways (see the module's docstring); its outputs are freed."""

    out_bytes: int
    ledger_workspace_bytes: int
    allocator_peak_bytes: int | None = None
    allocator_workspace_bytes: int | None = None
    resident_workspace_bytes: int | None = None
    persistent_bytes: int | None = None  # its share of what the first step left (measure_workspace)

    @property
    def workspace_bytes(self) -> int:
        return max(self.ledger_workspace_bytes, self.allocator_workspace_bytes or 0,
                   self.resident_workspace_bytes or 0)


def _node_bytes(node: Node, runner: StepRunner, ledger: LiveTensorLedger,
                meter: AllocatorPeak | None) -> NodeBytes:
    ledger.reset_peak()
    runner.compute(node.id)  # sizes, and a warm-up for the runs after it
    held_after = ledger.live_bytes
    outputs = runner.outputs(node.id)
    sizes = NodeBytes(storage_bytes(outputs.values()), max(0, ledger.peak_bytes - held_after))
    del outputs  # freed with the node's below
    # The gradients this node makes: fixed memory in a "step" graph (the first run keeps
    # them; a later run makes them again and drops them at its end); a fused graph's are
    # among the outputs already.
    grad_bytes = 0 if runner.fused else storage_bytes(
        runner.grads[param] for param in set(node.attrs.get("grads", {}).values())
        if param in runner.grads)
    kept = sizes.out_bytes + grad_bytes
    runner.free(node.id)
    if meter is not None:  # untimed: the profiler costs time
        with meter:
            runner.compute(node.id)
        if meter.measured:
            sizes.allocator_peak_bytes = meter.peak_bytes
            sizes.allocator_workspace_bytes = max(
                0, meter.peak_bytes - max(meter.retained_bytes, kept))
        runner.free(node.id)
    if runner.device is None or runner.device.type == "cpu":
        # What the kernel charged: scratch outside c10's allocator (oneDNN's own buffers)
        # included, to the page.
        risen = resident_peak_bytes(lambda: runner.compute(node.id))
        if risen is not None:
            sizes.resident_workspace_bytes = max(0, risen - kept)
        runner.free(node.id)
    return sizes


def measure_workspace(captured: Captured, device: str | torch.device | None = None,
                      map_large_allocations: bool = True) -> dict[Any, NodeBytes]:
    """Each node's bytes (outputs, workspace three ways) over one plain step run node by node,
    nothing timed: the memory half of measure_nodes, in seconds rather than minutes, for a
    plan that counts what the board pays (update nodes are left to the graph's figure; their
    share of what the first step left goes to the others, so that the shares add up to it)."""
    runner, module, ledger, meter = _runner_for(captured, device, map_large_allocations, True)
    graph = captured.graph
    left = first_step_memory(runner, module, make_optimizer(graph, module, None, None, None),
                             captured.example_args)
    found = {}
    runner.start_step(module, captured.example_args)
    for node in graph.nodes:
        if node.kind == "update":
            continue
        found[node.id] = _node_bytes(node, runner, ledger, meter)
        runner.compute(node.id)
        runner.free_inputs_read_last(node.id)
    runner.release_all()
    if left is not None:
        shares = split_in_proportion(sum(left.values()), {key: left[key] for key in found})
        for key, sizes in found.items():
            sizes.persistent_bytes = shares[key]
    return found


def runtime_warm_bytes(found) -> int | None:
    """What the first step left behind for the life of the process (the nodes'
    `persistent_bytes` summed): fixed memory a run pays from its first step on, beyond the
    runtime baseline taken before it. None where it was not measured."""
    measured = [m.persistent_bytes for m in found if m.persistent_bytes is not None]
    return sum(measured) if measured else None


def _measure_update(node: Node, runner: StepRunner, module: torch.nn.Module,
                    optimizer: torch.optim.Optimizer | FusedUpdates, window: float,
                    sensor: PowerSensor | None, idle_w: float | None) -> NodeMeasurement:
    step = _update_step(node, runner, module, optimizer)
    step()  # makes the optimizer's state: a warm-up, not a step's cost
    def stepped(i):
        step()
        synchronize(runner.device)

    with _steps_undone(_stepping(node, optimizer)):
        time_s, runs, energy = _timed(stepped, window, sensor, idle_w)
    if not isinstance(optimizer, FusedUpdates):
        optimizer.zero_grad(set_to_none=True)
    return NodeMeasurement(node.id, node.name, node.kind, profile_key(node), time_s, runs,
                           0, node.workspace_bytes, energy,
                           ledger_workspace_bytes=node.workspace_bytes)


def _stepping(node: Node, optimizer: torch.optim.Optimizer | FusedUpdates
              ) -> list[torch.optim.Optimizer]:
    """The torch optimizers whose parameters and state the node's compute steps (none for
    clipping's norm nodes)."""
    if isinstance(optimizer, FusedUpdates):
        own = optimizer.optimizers.get(node.id)
        return [own] if own is not None else []
    return [optimizer]


@contextmanager
def _steps_undone(optimizers: list[torch.optim.Optimizer]):
    """Put the optimizers' parameters and state back as they were on entry. A timing window
    repeats the step on the same gradients, a small group's hundreds of times; kept, those
    steps left a model that no run trains (bert-mini b8 seq 64: its classifier saturated,
    the backward's gradients went subnormal, and the in-context pass timed its matmuls
    25-27x slower than a run's, in 3 of 5 profiles). Costs a copy of one group (a "step"
    graph's: of every parameter) while the update is timed."""
    saved = [(opt, [(p, p.detach().clone()) for group in opt.param_groups
                    for p in group["params"]],
              {p: {key: value.clone() if isinstance(value, torch.Tensor) else value
                   for key, value in state.items()} for p, state in opt.state.items()})
             for opt in optimizers]
    try:
        yield
    finally:
        with torch.no_grad():
            for opt, params, state in saved:
                for param, value in params:
                    param.copy_(value)
                opt.state.clear()
                opt.state.update(state)


def _update_step(node: Node, runner: StepRunner, module: torch.nn.Module,
                 optimizer: torch.optim.Optimizer | FusedUpdates):
    """What the node's compute does: its group's step (fused), or the one optimizer step with
    every gradient the runner kept."""
    if isinstance(optimizer, FusedUpdates):
        return lambda: optimizer.step(node, runner)
    params = dict(module.named_parameters(remove_duplicate=False))
    for name, grad in runner.grads.items():
        params[name].grad = grad
    return optimizer.step


def _timed(operation, window: float, sensor: PowerSensor | None, idle_w: float | None,
           after=None) -> tuple[float, int, float | None]:
    """(seconds per run, runs, joules per run above idle): the best of WINDOWS windows, since
    whatever else runs on the board can only add time; energy over all of them."""
    def windows() -> tuple[float, int]:
        timed = [time_repeated(operation, window, after) for _ in range(WINDOWS)]
        return min(t for t, _ in timed), sum(n for _, n in timed)

    if sensor is None:
        return (*windows(), None)
    with EnergyMeter(sensor, SENSOR_PERIOD_S) as meter:
        time_s, runs = windows()
    if idle_w is None:
        return time_s, runs, None
    return time_s, runs, max(0.0, meter.energy_j - idle_w * meter.duration_s) / runs
