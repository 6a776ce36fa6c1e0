#!/usr/bin/env python3
"""Our planned schedule against PyTorch's own memory savers, at equal measured memory.

For ResNet-18 and BERT-mini, at budgets of 50% and 30% of plain eager PyTorch's activation peak:
our plan's step time against `torch.utils.checkpoint.checkpoint_sequential` and against
`torch.compile` with `torch._functorch.config.activation_memory_budget`, each tuned to the
activation peak our plan measured, all timed in the same invocation, interleaved.

Activation peak (one measure, applied identically to every method)
------------------------------------------------------------------
Over one steady-state training step (zero grads, forward, backward, optimizer step, zero grads),
the largest number of bytes that the CPU allocator handed out *during the step* and had not yet
taken back, leaving out the storages that end up as parameter gradients. What exists before the
step (parameters, buffers, optimizer state, the batch) is not counted; neither are the gradients,
which the planner counts as fixed memory (a trainer's .grad buffers) and every method must
produce. Everything else is: saved activations, recomputed ones, backward temporaries, kernel
workspaces, inductor's buffers, the optimizer's temporaries.

It is read with torch.profiler's memory events (profile_memory=True): c10's CPU allocator
reports every allocation and free, with a running total, whoever asked for the memory (eager
ops, inductor's generated code, our executor) — a dispatch-mode ledger would miss inductor's
buffers, which are not allocated through the dispatcher. Gradient storages are recognised by
pointer: a global optimizer step pre-hook records every parameter's .grad storage when the
optimizer steps, and drops one marker allocation so that the profile shows when that was; the
last allocation at each such pointer before the marker is that gradient, excluded while live.
The column "+grads MiB" is the same peak with gradients counted. Memory taken without c10's
allocator (glibc's slack, the Python heap, a library allocating on its own) is in no column.
Our executor also reports its own ledger (the tensors it holds: what the plan predicts); the
allocator sees more where an ATen op allocates scratch inside itself (convolution_backward on
the CPU: measured here, tens of MiB at the full ResNet size), so ours can measure above its
budget: the baselines are tuned to what ours measured, not to the budget.

The profiled step is a separate step, not a timed one (the profiler costs time).

Methods
-------
ours         capture the zoo model (capture_model, update="step": one optimizer step after the
             backward, gradients as .grad buffers, as the peers train), time every planner node
             on this machine (profiler.ops), plan at budget = fixed + f x (eager activation
             peak) with the time objective (solve "auto": CP-SAT; below the planner's smallest
             feasible budget, or where no plan is found in the time limit, at the lowest budget
             raised from there that plans: the lowest ours reaches, said so), run it with run_plan (check_gradients=False;
             map_large_allocations=False, so glibc is as the other methods have it; its step
             meter reads the kernel's RSS high-water mark, no sampling thread, so ours is
             timed like the other methods). --granularity best (the default) plans both the
             module-level graph and the operator-level one (a node per ATen op: a plan can keep
             a matmul's output and recompute the gelu after it) and takes, per budget, the plan
             predicted to recompute least; the row says which and what the other predicted.
             --paging flash lets the plans page to flash, overlapped with compute; --paging
             best (the default) plans both ways and takes the least predicted step overhead,
             the best plan of the other way timed beside it; --paging none: recompute only.
             In the `lowest` row ours is the variant that measured least memory (that row is
             the lowest memory ours reaches).
             Each timed sample is the median of the steps
             after the first two of one run_plan call (the first makes the optimizer's
             momentum; glibc's heap grows into its steady size over the first two, as eager's
             does before its timed rounds: a run's second step page-faulted the 31 MiB of
             bert-mini's word-embedding gradient afresh in every run). Its gradients
             are checked bit for bit against eager in a separate one-step run_plan.
ours, no limit
             the plan of an unlimited budget (nothing recomputed) through the same executor:
             the executor's own cost, apart from what a plan recomputes.
checkpoint_sequential
             the zoo model as a sequence (ResNet: stem, 8 blocks, pool+fc; BERT: embeddings, 4
             layers or 8 half-layers (attention, feed-forward), pooler+classifier), verified to
             give the zoo model's loss and gradients bit for bit. Configurations: c checkpointed
             segments of `size` modules each, `checkpoint_sequential(modules[:(c+1)size], c+1)`
             (its last segment runs plain) then the remaining modules plain: every prefix and
             segment size, use_reentrant=False. Each configuration's peak is measured; those at
             or under ours are ranked by their recompute (the forward time of the checkpointed
             modules) and the best --candidates go into the timed rounds.
torch.compile
             the loss function compiled (fullgraph; inductor, or aot_eager_decomp_partition when
             inductor cannot build here) under activation_memory_budget = knob, one compilation
             per knob (a fresh code object each, so no knob reuses another's graph). The knob is
             searched for each target: 1.0, then 0.0, 0.5, 0.25, 0.75 until one fits (the peak
             is not monotone in the knob: measured here, 0.5-0.75 beat both ends), then
             bisection towards larger knobs --knob-steps times; at most --max-compiles per
             model. Compile time is excluded (two warm-up steps). The largest knobs that fit
             (least recompute) go into the timed rounds; if none fits, the lowest peak's.
offload to flash
             torch.autograd.graph.saved_tensors_hooks (the "saving tensors to disk" recipe of
             PyTorch's autograd notes): every saved activation of at least a threshold (0, 256
             KiB, 1 MiB, 4 MiB) is written through our flash page store (fsync, page cache
             dropped: the bytes leave RAM, as our own pages do) and read back when backward
             unpacks it; parameters stay. The thresholds that fit, least offloaded first.
save_on_cpu  torch.autograd.graph.save_on_cpu: it moves saved tensors to the host, and on a
             CPU-only machine they are there already (its pack hook's `tensor.cpu()` is the
             tensor itself), so it keeps what eager keeps: measured and shown, never fits.
sac_ilp      PyTorch's selective-checkpointing ILP (torch.distributed._tools.sac_ilp) takes its
             costs from RuntimeEstimator / SACEstimator, which time ops with CUDA events or a
             CUDA roofline: the benchmark probes them on this machine (in a child process) and
             prints the errors instead of a row.
eager        plain eager PyTorch, no memory limit: the reference the budgets are fractions of.

Figures per budget: ratio_best_peer = our median step time / the fastest peer's among those
measured at equal or lower activation peak (below 1: ours faster; target <= 0.90); our plan's
predicted step time (the simulator with the op profiler's in-context times, the profile every
plan here is made with) against its measured median (target within 10%), and beside it the
miss beyond the keep-all plan's in the same rounds (on a shared host the load moves between the
profile and the timing: the keep-all plan's measured / predicted, `keep_all_drift`, takes that
out, with the executor's own overhead; `prediction_miss_beyond_keep_all`); and per model the
executor's own overhead, the keep-all plan's step time / eager's, median over rounds (target
<= 1.03), in wall time and in the process's CPU time (user + system: on a shared machine wall
time swings with the others' load, CPU time far less). --json carries them (ratio_best_peer,
best_peer, predicted_step_s, prediction_miss, executor_overhead, executor_overhead_cpu). The
overhead is measured once more in --paired N adjacent pairs of steps in one run (one eager step
after each keep-all step, median of the per-pair CPU ratios, executor_overhead.py --paired):
the per-round ratio of three steps each moves by several percent at these shapes, the paired
one far less (`executor_overhead_cpu_paired`).

Timing: --rounds rounds; in each, every method runs one step, in an order rotated each round,
so that drift on a shared machine hits all alike. Reported: the median step time, and the ratio
to ours as the median of the per-round ratios (method / ours, so > 1 means ours is faster) and
in how many rounds ours was faster. For each method the candidate with the lowest median wins.

    python benchmarks/end_to_end.py --quick       # small sizes, fewer compilations
    python benchmarks/end_to_end.py --fractions 0.5,0.3,0   # 0: the lowest budget ours reaches
    python benchmarks/end_to_end.py               # ResNet-18 b16 64x64, BERT-mini b16 seq 128
"""

from __future__ import annotations

import argparse
import copy
import json
import importlib
import os
import statistics
import sys
import tempfile
import textwrap
import time
import types
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from edge_remat_agent.profiler.allocations import quiet_native_stderr

from arguments import (comma_list, existing_folder, names_among,  # this script's neighbour
                       non_negative_float, non_negative_int, positive_float, positive_int)

MODELS = [("resnet18", {"batch": 16, "image": 64}), ("bert-mini", {"batch": 16, "seq": 128})]
QUICK = [("resnet18", {"batch": 8, "image": 32}), ("bert-mini", {"batch": 8, "seq": 64})]
FRACTIONS = (0.5, 0.3, 0.0)  # 0.0: the lowest budget ours reaches (the planner's floor)
MARKER_BYTES = 999_983  # a prime-sized allocation marks "the optimizer step starts" in a profile
MiB = 2**20
OFFLOAD_THRESHOLDS = (0, 256 * 2**10, 2**20, 4 * 2**20)  # bytes: offload tensors this big
OVERHEAD_TARGET, PREDICTION_TARGET, BEST_PEER_TARGET = 1.03, 0.10, 0.90
PEERS = ("checkpoint_sequential", "torch.compile", "offload to flash", "save_on_cpu")
CONFIG_WIDTH = 50
# Ours per timed sample: one run_plan of warm-up steps (momentum made, the heap at its steady
# size, as eager's is when timed) then timed steps, their median (see the docstring).
OURS_WARM_STEPS, OURS_TIMED_STEPS = 2, 3


# -- the activation peak ------------------------------------------------------------------------

@dataclass
class Peak:
    activation: int  # bytes: the measure above (gradients left out)
    with_grads: int  # the same peak with gradient storages counted
    grads: int  # bytes of gradient storages recognised
    events: int  # allocator events in the window


class ActivationMeter:
    """`with ActivationMeter() as meter: step()` then `meter.peak` (see the module docstring)."""

    active: ActivationMeter | None = None
    _hook = None

    def __init__(self):
        self.grad_storages: dict[int, int] = {}  # data_ptr -> nbytes, at the optimizer step
        self.markers: list[int] = []
        self.peak: Peak | None = None
        self._profile = None
        self._marker_tensors: list[torch.Tensor] = []

    def start(self) -> None:
        from torch.profiler import ProfilerActivity, profile
        if ActivationMeter._hook is None:
            from torch.optim.optimizer import register_optimizer_step_pre_hook
            ActivationMeter._hook = register_optimizer_step_pre_hook(_before_optimizer_step)
        self._profile = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        with quiet_native_stderr():  # kineto's profiler_start line, not ours
            self._profile.__enter__()
        ActivationMeter.active = self

    def stop(self) -> Peak:
        ActivationMeter.active = None
        with quiet_native_stderr():
            self._profile.__exit__(None, None, None)
        self.peak = self._analyse()
        return self.peak

    def __enter__(self) -> ActivationMeter:
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            ActivationMeter.active = None
            with quiet_native_stderr():
                self._profile.__exit__(exc_type, exc, tb)
            return
        self.stop()

    def _analyse(self) -> Peak:
        from edge_remat_agent.profiler.allocations import allocation_events
        events = allocation_events(self._profile)  # (time ns, ptr, +-bytes, running total)
        if not events:
            return Peak(0, 0, 0, 0)
        base = events[0][3] - events[0][2]  # the total before the window's first event
        marker_ptrs = set(self.markers)
        marker = next((i for i, e in enumerate(events)
                       if e[2] == MARKER_BYTES and e[1] in marker_ptrs), len(events))
        excluded: set[int] = set()  # indices of allocation events left out while live
        last_alloc: dict[int, int] = {}
        for i, (_, ptr, size, _) in enumerate(events[:marker]):
            if size > 0:
                last_alloc[ptr] = i
        grads = 0
        for ptr, nbytes in self.grad_storages.items():
            if ptr in last_alloc:
                excluded.add(last_alloc[ptr])
                grads += events[last_alloc[ptr]][2]
        excluded.update(i for i, e in enumerate(events)
                        if e[2] == MARKER_BYTES and e[1] in marker_ptrs)
        open_excluded: dict[int, int] = {}
        live_excluded = peak = peak_all = 0
        for i, (_, ptr, size, total) in enumerate(events):
            if i in excluded:
                open_excluded[ptr] = size
                live_excluded += size
            elif size < 0 and ptr in open_excluded:
                live_excluded -= open_excluded.pop(ptr)
            live = total - base
            peak_all = max(peak_all, live)
            peak = max(peak, live - live_excluded)
        return Peak(peak, peak_all, grads, len(events))


def _before_optimizer_step(optimizer, args, kwargs) -> None:
    meter = ActivationMeter.active
    if meter is None:
        return
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.grad is not None:
                storage = p.grad.untyped_storage()
                meter.grad_storages[storage.data_ptr()] = storage.nbytes()
    marker = torch.empty(MARKER_BYTES, dtype=torch.uint8)
    meter.markers.append(marker.data_ptr())
    del marker


# -- models as sequences (for checkpoint_sequential) ------------------------------------------

class _ResNetHead(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.fc = model.fc

    def forward(self, x):
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class _BertEmbeddings(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.m = model  # shares the model's modules (not copied)

    def forward(self, input_ids):
        m = self.m
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = m.word(input_ids) + m.position(positions) + m.token_type(torch.zeros_like(input_ids))
        return m.drop(m.embed_norm(x))


class _BertAttention(nn.Module):
    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x):
        layer = self.layer
        return layer.attention_norm(x + layer.drop(layer.attention(x)))


class _BertFeedForward(nn.Module):
    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x):
        layer = self.layer
        return layer.output_norm(x + layer.drop(layer.output(F.gelu(layer.intermediate(x)))))


class _BertHead(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.m = model

    def forward(self, x):
        return self.m.classifier(self.m.drop(torch.tanh(self.m.pooler(x[:, 0]))))


@dataclass
class SequentialForm:
    unit: str  # what one module of the sequence is
    modules: list[nn.Module]

    def loss(self, batch: tuple, size: int = 0, checkpointed: int = 0) -> torch.Tensor:
        """The training loss; `checkpointed` segments of `size` modules through
        checkpoint_sequential (0: plain)."""
        from torch.utils.checkpoint import checkpoint_sequential
        x, rest = batch[0], self.modules
        if checkpointed:
            k = (checkpointed + 1) * size
            x = checkpoint_sequential(self.modules[:k], checkpointed + 1, x,
                                      use_reentrant=False)
            rest = self.modules[k:]
        for module in rest:
            x = module(x)
        return F.cross_entropy(x, batch[1])


def sequential_forms(name: str, model: nn.Module) -> list[SequentialForm]:
    if name.startswith("resnet"):
        return [SequentialForm("blocks", [model.stem, *model.stages, _ResNetHead(model)])]
    if name.startswith("bert"):
        layers = [_BertEmbeddings(model), *model.layers, _BertHead(model)]
        halves = [_BertEmbeddings(model)]
        for layer in model.layers:
            halves += [_BertAttention(layer), _BertFeedForward(layer)]
        return [SequentialForm("layers", layers),
                SequentialForm("half-layers", halves + [_BertHead(model)])]
    raise SystemExit(f"no sequential form for {name}")


def check_forms(name: str, options: dict) -> str:
    """Each sequential form gives the zoo model's loss and gradients bit for bit."""
    from edge_remat_agent.capture.models import load_model
    model, batch = load_model(name, **options)
    reference = copy.deepcopy(model)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        reference(*batch).backward()
    want = {n: p.grad for n, p in reference.named_parameters()}
    bad = []
    for index in range(len(sequential_forms(name, model))):
        copied = copy.deepcopy(model)
        form = sequential_forms(name, copied)[index]
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(1)
            form.loss(batch).backward()
        if not all(torch.equal(p.grad, want[n]) for n, p in copied.named_parameters()):
            bad.append(form.unit)
    return "bitwise equal" if not bad else f"DIFFER ({', '.join(bad)})"


# -- methods ------------------------------------------------------------------------------------

@dataclass
class Method:
    kind: str  # "ours", "checkpoint_sequential", "torch.compile", "eager"
    config: str
    run: Callable[[], float]  # one timed step -> seconds
    measure: Callable[[], Peak]  # one profiled step -> its peak
    peak: Peak | None = None
    times: list[float] = field(default_factory=list)
    rank: float = 0.0  # lower is expected faster (candidate selection)
    info: dict[str, Any] = field(default_factory=dict)
    last_cpu_s: float | None = None  # the process's CPU time in the last run()'s step
    cpu_times: list[float] = field(default_factory=list)  # per round, as `times`

    @property
    def median(self) -> float:
        return statistics.median(self.times)


def training_step(module: nn.Module, optimizer, loss_fn: Callable[[], torch.Tensor]) -> float:
    start = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    loss = loss_fn()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    float(loss.detach())
    return time.perf_counter() - start


def eager_like(kind: str, config: str, module, optimizer, loss_fn) -> Method:
    def run() -> float:
        cpu = time.process_time()
        wall = training_step(module, optimizer, loss_fn)
        method.last_cpu_s = time.process_time() - cpu
        return wall

    def measure() -> Peak:
        with ActivationMeter() as meter:
            run()
        return meter.peak
    method = Method(kind, config, run, measure)
    return method


def new_model(name: str, options: dict, optimizer_name: str):
    from edge_remat_agent.capture.models import load_model
    from edge_remat_agent.capture.optimizer import torch_optimizer
    module, batch = load_model(name, **options)
    return module, batch, torch_optimizer(optimizer_name, module)


def ours(graph, plan, captured, page_dir: str, label: str) -> Method:
    from edge_remat_agent.executor import run_plan

    def run() -> float:
        report = run_plan(graph, plan, OURS_WARM_STEPS + OURS_TIMED_STEPS, page_dir,
                          check_gradients=False, captured=captured, map_large_allocations=False)
        timed = report["steps"][OURS_WARM_STEPS:]
        # paging: the IO thread's busy time and what the step waited on it (overlapped)
        method.io.extend((s.get("page_in_s", 0.0) + s.get("page_out_s", 0.0),
                          s.get("io_wait_s", 0.0)) for s in timed)
        method.last_cpu_s = statistics.median(s["cpu_time_s"] for s in timed)
        return statistics.median(s["step_time_s"] for s in timed)

    def measure() -> Peak:
        meter = ActivationMeter()

        def progress(i, steps, record):  # profile the second step only
            if i == 0:
                meter.start()
            elif i == 1:
                meter.stop()
        report = run_plan(graph, plan, 2, page_dir, check_gradients=False, captured=captured,
                          map_large_allocations=False, progress=progress)
        method.info["ledger_peak"] = report["steps"][1]["ledger_peak_bytes"] - graph.fixed_bytes
        return meter.peak
    method = Method("ours", label, run, measure)
    method.io = []  # (IO busy s, IO wait s) per timed step
    return method


def gradient_check(graph, plan, captured, page_dir: str) -> str:
    from edge_remat_agent.executor import run_plan
    report = run_plan(graph, plan, 1, page_dir, check_gradients=True, captured=captured,
                      map_large_allocations=False)
    check = report["grad_check"]
    if check["bitwise_equal"]:
        return f"bitwise equal to eager ({check['compared']} gradients and the loss)"
    return (f"DIFFER from eager: max |diff| {check['max_abs_diff']:.3g}, "
            f"{len(check['differing'])} gradients, loss equal {check['loss_equal']}")


# -- activation offloading through saved-tensor hooks -------------------------------------------

class FlashOffload:
    """PyTorch's saved-tensor hooks (torch.autograd.graph.saved_tensors_hooks, the "saving
    tensors to disk" recipe of its autograd notes) writing every saved activation of at least
    `min_bytes` to files in page_dir through our flash page store (fsync, page cache dropped, as
    our own pages), read back when backward unpacks it. Parameters stay in RAM (they are there
    anyway)."""

    def __init__(self, module: nn.Module, page_dir: str, min_bytes: int):
        from edge_remat_agent.pages.flash import FlashStore
        self.store = FlashStore(page_dir, fsync=True, drop_cache=True)
        self.params = {p.untyped_storage().data_ptr() for p in module.parameters()}
        self.min_bytes = min_bytes
        self.serial = 0
        self.written = 0

    def pack(self, tensor: torch.Tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() in self.params or storage.nbytes() < self.min_bytes:
            return tensor
        self.serial += 1
        self.store.put(self.serial, tensor)
        self.written += 1
        return (FlashOffload, self.serial)

    def unpack(self, packed):
        if isinstance(packed, tuple) and packed and packed[0] is FlashOffload:
            return self.store.pop(packed[1])
        return packed

    def loss(self, module: nn.Module, batch: tuple) -> torch.Tensor:
        with torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack):
            return module(*batch)


def offload_methods(name: str, options: dict, optimizer_name: str, page_dir: str) -> list[Method]:
    """Flash offloading at several size thresholds (smaller ones offload more: less memory,
    more I/O), and torch.autograd.graph.save_on_cpu: on a CPU-only machine its pack hook's
    `tensor.cpu()` returns the tensor itself, so it keeps what eager keeps (measured, shown)."""
    module, batch, optimizer = new_model(name, options, optimizer_name)
    methods = []
    for min_bytes in OFFLOAD_THRESHOLDS:
        hooks = FlashOffload(module, page_dir, min_bytes)
        method = eager_like("offload to flash", f"saved_tensors_hooks to files, tensors >= "
                            f"{min_bytes / 2**10:.0f} KiB", module, optimizer,
                            lambda hooks=hooks: hooks.loss(module, batch))
        method.rank = -min_bytes  # offloading less is faster
        methods.append(method)

    def save_on_cpu_loss():
        with torch.autograd.graph.save_on_cpu(pin_memory=False):
            return module(*batch)
    methods.append(eager_like("save_on_cpu", "torch.autograd.graph.save_on_cpu (CPU tensors: "
                              "kept as they are)", module, optimizer, save_on_cpu_loss))
    return methods


def sac_ilp_probe(name: str) -> str:
    """Whether PyTorch's selective-checkpointing ILP (torch.distributed._tools.sac_ilp) can be
    fed on this machine: its inputs come from RuntimeEstimator and SACEstimator under
    FakeTensorMode (as PyTorch's own tests run them), in either runtime mode. Run in a child
    process (a failure inside backward can abort the interpreter). The answer is each mode's
    first error, or "runs"."""
    import subprocess
    done = subprocess.run([sys.executable, __file__, "--sac-probe", name], capture_output=True,
                          text=True, timeout=600)
    if done.returncode != 0:
        tail = " ".join(line.strip() for line in done.stderr.splitlines()
                        if line.strip())[-200:]
        return f"the probe process died (exit {done.returncode}): {tail}"
    return done.stdout.strip().splitlines()[-1]


def _sac_ilp_probe_here(name: str) -> str:
    try:
        importlib.import_module("torch.distributed._tools.sac_ilp")  # needs PuLP
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.distributed._tools.runtime_estimator import RuntimeEstimator
        from torch.distributed._tools.sac_estimator import SACEstimator
    except Exception as error:  # noqa: BLE001 - reported as found
        return f"cannot import: {type(error).__name__}: {error}"
    from edge_remat_agent.capture.models import load_model
    errors = []
    for mode in ("operator-level-benchmark", "operator-level-cost-model"):
        try:
            with FakeTensorMode():
                model, batch = load_model(name, batch=2, seq=8, image=32)
                with RuntimeEstimator()(mode):
                    model(*batch).backward()
                with SACEstimator()(mode):
                    model(*batch).backward()
        except Exception as error:  # noqa: BLE001 - reported as found
            errors.append(f"{mode}: {type(error).__name__}: {str(error).splitlines()[0]}")
    return "runs" if not errors else "; ".join(errors)


# -- torch.compile ------------------------------------------------------------------------------

def _compiled_loss(module, *batch):
    return module(*batch)


class CompileSweep:
    """Compiled variants by knob, made on demand (each compilation is minutes on a small CPU)."""

    def __init__(self, name: str, options: dict, optimizer_name: str, backend: str,
                 max_compiles: int, log: Callable[[str], None]):
        self.name, self.options, self.optimizer_name = name, options, optimizer_name
        self.backend, self.max_compiles, self.log = backend, max_compiles, log
        self.methods: dict[float, Method] = {}
        self.notes: list[str] = []

    def get(self, knob: float) -> Method | None:
        if knob in self.methods:
            return self.methods[knob]
        if len(self.methods) >= self.max_compiles:
            return None
        import torch._functorch.config as functorch_config
        module, batch, optimizer = new_model(self.name, self.options, self.optimizer_name)
        code = _compiled_loss.__code__.replace(co_name=f"loss_{len(self.methods)}")
        function = types.FunctionType(code, globals(), code.co_name)
        start = time.perf_counter()
        while True:
            compiled = torch.compile(function, backend=self.backend, fullgraph=True)

            def loss_fn(compiled=compiled):
                return compiled(module, *batch)
            try:
                with functorch_config.patch(activation_memory_budget=knob):
                    for _ in range(2):  # compiles forward and backward; the second is warm
                        training_step(module, optimizer, loss_fn)
                break
            except Exception as error:  # noqa: BLE001 - inductor cannot build: say so, fall back
                if self.backend != "inductor":
                    raise
                message = str(error).strip().splitlines()[0][:200] if str(error) else ""
                self.notes.append(f"inductor failed here ({type(error).__name__}: {message}); "
                                  "fell back to backend aot_eager_decomp_partition (the same "
                                  "min-cut partitioner and knob, no code generation)")
                self.backend = "aot_eager_decomp_partition"
                torch._dynamo.reset()
        compile_s = time.perf_counter() - start
        method = eager_like("torch.compile", f"{self.backend}, budget knob {knob:.3f}", module,
                            optimizer, loss_fn)
        method.peak = method.measure()
        method.rank = -knob  # less recompute first
        method.info.update(knob=knob, compile_s=compile_s, backend=self.backend)
        self.methods[knob] = method
        self.log(f"  torch.compile knob {knob:.3f}: compiled in {compile_s:.0f} s, activation "
                 f"peak {method.peak.activation / MiB:.1f} MiB")
        return method

    def search(self, target: int, steps: int) -> list[Method]:
        """Evaluate knobs until one's peak is at most `target`: 1.0 (no recompute), then 0.0,
        0.5, 0.25, 0.75 (the peak need not fall with the knob); then bisect between the largest
        knob that fits and the next larger one tried, `steps` times. All evaluated knobs."""
        for knob in (1.0, 0.0, 0.5, 0.25, 0.75):
            if self._fitting(target) or self.get(knob) is None:
                break
        for _ in range(steps):
            fits = self._fitting(target)
            if not fits:
                break
            low = max(fits)
            higher = [k for k in self.methods if k > low]
            if not higher:
                break
            if self.get((low + min(higher)) / 2) is None:
                break
        return list(self.methods.values())

    def _fitting(self, target: int) -> list[float]:
        return [k for k, m in self.methods.items() if m.peak.activation <= target]


# -- one model ----------------------------------------------------------------------------------

@dataclass
class Budget:
    fraction: float  # of eager's activation peak; 0.0: the lowest budget ours reaches
    budget_bytes: int
    ours: Method | None = None
    plan_note: str = ""
    grad_check: str = ""
    candidates: dict[str, list[Method]] = field(default_factory=dict)
    closest: dict[str, bool] = field(default_factory=dict)  # kind -> none fits: closest shown
    other_way: Method | None = None  # --paging best: the best plan of the way not chosen


@dataclass
class Variant:
    """One granularity of ours (the captured graph, its op profile) and how it may save
    memory: "none" (recompute only) or "flash" (recompute or page, overlapped)."""
    label: str
    captured: Any
    profile: Any
    paging: str = "none"

    @property
    def graph(self):
        return self.captured.graph


def _profile(captured, args, log):
    """This machine's op costs for a captured graph (the profile every plan here is made with)."""
    from edge_remat_agent.formats import Profile
    from edge_remat_agent.profiler.ops import measure_nodes, ops_from
    start = time.perf_counter()
    ops = ops_from(measure_nodes(captured, map_large_allocations=False,
                                 context_steps=args.context_steps))
    tiers = {}
    if args.paging != "none":
        from edge_remat_agent.profiler import measure_flash
        # fsync, as the executor writes (run_plan's flash_fsync): without it the plan took
        # paging for free (predicted 0.14 s, measured 0.34 s on bert-mini at 50%).
        # Its compute_share too, on this run's torch threads: what the IO thread's CPU costs
        # the step where no core is spare (planned 91% hidden, measured 45% without it).
        flash = measure_flash(args.page_dir, (64 * 2**10, 2**20, 16 * 2**20), fsync=True)
        tiers["flash"] = flash.fit()
        log(f"  flash: write {tiers['flash'].write_cost(MiB)[0] * 1e3:.2f} ms, read "
            f"{tiers['flash'].read_cost(MiB)[0] * 1e3:.2f} ms a MiB; compute share "
            f"{tiers['flash'].compute_share:.2f} (the IO thread's CPU "
            f"{flash.contention.io_cpu_per_io_s or 0:.2f} s per IO second"
            # where the pairs were too noisy, the share is that CPU figure: said (contention.py)
            + (f"; {flash.contention.note}" if flash.contention.source != "measured" else "")
            + ")")
    log(f"  op profiler: {len(captured.graph)} planner nodes "
        f"({'operator' if captured.graph.capture.get('operator_level') else 'module'}-level) "
        f"timed in {time.perf_counter() - start:.0f} s")
    return Profile("measured", {}, idle_w=0.0, active_w=1.0, tiers=tiers, ops=ops)


def plan_variant(variant: Variant, budget: Budget, fraction: float, plain: int, args,
                 log) -> Method | None:
    """Ours on one granularity at one budget: planned, measured, its gradients checked."""
    from edge_remat.planner.problem import ProblemError
    from edge_remat.planner.solve import NoPlan
    from edge_remat_agent.costs import build_costs
    graph, captured = variant.graph, variant.captured
    try:
        solved, budget_bytes, fallback = plan_at_or_above(
            graph, variant.profile, budget.budget_bytes, fraction, plain, args, variant.paging)
    except (ProblemError, NoPlan) as error:
        budget.plan_note = f"no plan: {str(error).splitlines()[0]}"
        log(f"  {_label(fraction)} ({variant.label}): {budget.plan_note}")
        return None
    plan = solved.plan
    predicted = plan.predicted
    # The step predicted over the graph's own plain step (every node once, nothing paged),
    # recompute and the paging that does not hide behind compute both counted.
    plain_s = sum(build_costs(graph, variant.profile).time_s)
    overhead = 100.0 * (predicted["time_s"] / plain_s - 1.0) if plain_s > 0 else 0.0
    method = ours(graph, plan, captured, args.page_dir, f"plan at {_label(fraction)}")
    method.run()  # warm-up
    method.io.clear()
    method.peak = method.measure()
    grad_check = gradient_check(graph, plan, captured, args.page_dir)
    paged = _count(plan, "page_out")
    hidden = predicted.get("paging_hidden_share")
    method.config = (f"{variant.label} ({len(graph)} nodes), {plan.solver.get('name')} "
                     f"{plan.solver.get('status')}, {_recomputes(plan)} recomputes"
                     + (f", {paged} page-outs" if variant.paging != "none" else ""))
    method.info.update(
        predicted_s=predicted.get("time_s"), granularity=variant.label, nodes=len(graph),
        paging=variant.paging, page_outs=paged,
        tdi_percent=predicted.get("tdi_percent", 0.0), predicted_overhead_percent=overhead,
        planned_hidden_share=hidden if paged else None,
        planned_io_busy_s=predicted.get("io_busy_s"), planned_io_wait_s=predicted.get("io_wait_s"),
        planned_io_slowed_s=predicted.get("io_slowed_s"),
        budget_bytes=budget_bytes, grad_check=grad_check,
        plan_note=(f"{fallback}plan: {variant.label} ({len(graph)} nodes), "
                   f"{plan.solver.get('name')} ({plan.solver.get('status')}), predicted "
                   f"{predicted.get('tdi_percent', 0.0):+.1f}% recompute time"
                   + (f", {paged} page-outs ({hidden:.0%} of paging hidden), "
                      f"{overhead:+.1f}% step time" if paged else "")))
    allowed = budget_bytes - graph.fixed_bytes
    log(f"  {_label(fraction)} ({variant.label}): budget fixed + {allowed / MiB:.1f} MiB; "
        f"{method.info['plan_note']}; measured activation peak "
        f"{method.peak.activation / MiB:.1f} MiB (executor's ledger "
        f"{method.info['ledger_peak'] / MiB:.1f} MiB); gradients {grad_check}")
    return method


def choose_granularity(tried: list[Method], lowest: bool = False) -> Method:
    """Of ours' variants (granularity, paging or not) at one budget, the plan with the least
    predicted step overhead (recompute, and paging not hidden behind compute, relative to its
    own graph's plain step, both from the same in-context profile). Chosen by prediction, not
    by timing steps: on this shared machine a handful of steps chose by the load of the moment
    (seen: the plan predicted 4 points dearer chosen, 1.18x the best peer).
    `lowest`: the row of the lowest memory ours reaches, so the variant that measured least
    memory (each variant's floor differs: on bert-mini the module-level graph's lumped attention
    node stops it at 46 MiB, where the operator-level one plans at 29; choosing the module-level
    plan there by its overhead compared ours with peers at 46 MiB, not at the lowest ours
    reaches)."""
    if len(tried) == 1:
        return tried[0]
    if lowest:
        chosen = min(tried, key=lambda m: (m.peak.activation,
                                           m.info["predicted_overhead_percent"]))
        why = "least memory measured"
    else:
        chosen = min(tried, key=lambda m: m.info["predicted_overhead_percent"])
        why = "least predicted step overhead"
    chosen.info["choice"] = (
        f"{chosen.info['granularity']} chosen ({why}; predicted step overhead "
        + ", ".join(f"{m.info['granularity']} {m.info['predicted_overhead_percent']:+.1f}% at "
                    f"{m.peak.activation / MiB:.1f} MiB measured" for m in tried) + ")")
    chosen.info["alternatives"] = [
        {"granularity": m.info["granularity"], "paging": m.info["paging"],
         "nodes": m.info["nodes"], "tdi_percent": m.info["tdi_percent"],
         "predicted_overhead_percent": m.info["predicted_overhead_percent"],
         "page_outs": m.info["page_outs"], "activation_peak_bytes": m.peak.activation,
         "predicted_step_s": m.info["predicted_s"], "grad_check": m.info["grad_check"]}
        for m in tried]
    return chosen


def bench_model(name: str, options: dict, args, log) -> dict:
    from edge_remat.planner.build import build_problem, plain_peak_bytes
    from edge_remat.planner.solve import solve
    from edge_remat_agent.capture import capture_model

    title = f"{name} ({', '.join(f'{k} {v}' for k, v in options.items())})"
    log(f"\n== {title}")
    # update="step": one optimizer.step() after the backward, gradients as .grad buffers (fixed
    # memory), as every peer trains; the measure leaves gradients out for all alike. (A fused
    # graph would spend our activation budget on gradients that the peers' figure omits.)
    captured = capture_model(name, update="step", **options)
    graph = captured.graph
    optimizer_name = graph.capture.get("optimizer", "sgd")

    # Plain eager: the reference peak.
    module, batch, optimizer = new_model(name, options, optimizer_name)
    eager = eager_like("eager", "no memory limit", module, optimizer, lambda: module(*batch))
    eager.run()
    eager.peak = eager.measure()
    plain = eager.peak.activation
    model_plain = plain_peak_bytes(graph) - graph.fixed_bytes
    log(f"  eager activation peak {plain / MiB:.1f} MiB (planner's model of the plain schedule: "
        f"{model_plain / MiB:.1f} MiB); fixed memory {graph.fixed_bytes / MiB:.1f} MiB")

    # Ours: this machine's op costs, a plan per budget, its measured peak; per granularity.
    variants = []
    if args.granularity in ("module", "best"):
        variants.append(Variant("module-level", captured, _profile(captured, args, log)))
    if args.granularity in ("operator", "best"):
        fine = capture_model(name, update="step", operator_level=True, **options)
        variants.append(Variant("operator-level", fine, _profile(fine, args, log)))
    # --paging flash: every plan may page; best: each granularity planned both ways.
    pagings = {"none": ["none"], "flash": ["flash"], "best": ["none", "flash"]}[args.paging]
    variants = [Variant(v.label + (", paging to flash" if paging == "flash" else ""),
                        v.captured, v.profile, paging) for v in variants for paging in pagings]
    # The executor without a memory limit (every node once, nothing recomputed): what running
    # through our executor costs by itself, apart from what the plan recomputes.
    first = variants[0]
    unlimited = solve(build_problem(first.graph, f"{2**50}B", first.profile, "time", None,
                                    "none"), "auto", time_limit=args.time_limit).plan
    keep_all = ours(first.graph, unlimited, first.captured, args.page_dir, "no memory limit")
    keep_all.kind = "ours, no limit"
    keep_all.info["predicted_s"] = unlimited.predicted.get("time_s")
    keep_all.config = (f"{_recomputes(unlimited)} recomputes (the executor's own overhead, "
                       f"{first.label})")
    keep_all.run()
    keep_all.peak = keep_all.measure()
    budgets: list[Budget] = []
    for fraction in args.fractions:
        budget = Budget(fraction, int(graph.fixed_bytes + fraction * plain))
        budgets.append(budget)
        tried = []
        for variant in variants:
            method = plan_variant(variant, budget, fraction, plain, args, log)
            if method is not None:
                tried.append(method)
        if not tried:
            continue
        budget.ours = choose_granularity(tried, lowest=fraction <= 0)
        others = [m for m in tried if m.info["paging"] != budget.ours.info["paging"]]
        if others:  # timed too, so the row shows what the choice by prediction was worth
            budget.other_way = min(others, key=lambda m: m.info["predicted_overhead_percent"])
            budget.other_way.kind = ("ours, recompute only" if budget.other_way.info["paging"]
                                     == "none" else "ours, with paging")
        budget.plan_note = budget.ours.info["plan_note"]
        budget.grad_check = budget.ours.info["grad_check"]
        budget.budget_bytes = budget.ours.info["budget_bytes"]
        if len(tried) > 1:
            budget.plan_note += "; " + budget.ours.info["choice"]
            log(f"  {_label(fraction)}: {budget.ours.info['choice']}")

    # checkpoint_sequential: every configuration's peak.
    ck_module, ck_batch, ck_optimizer = new_model(name, options, optimizer_name)
    forms_ok = check_forms(name, options)
    checkpoints: list[Method] = []
    for form in sequential_forms(name, ck_module):
        forward_s = _forward_times(form, ck_batch)
        n = len(form.modules)
        for size in range(1, n):
            for c in range(1, n):
                if (c + 1) * size > n:
                    break
                config = f"{c}x{size} of {n} {form.unit} (first {(c + 1) * size}, segments={c + 1})"
                method = eager_like("checkpoint_sequential", config, ck_module, ck_optimizer,
                                    lambda form=form, size=size, c=c:
                                    form.loss(ck_batch, size, c))
                method.rank = sum(forward_s[: c * size])
                checkpoints.append(method)
    checkpoints[0].run()  # warm-up (and the optimizer's momentum)
    for method in checkpoints:
        method.peak = method.measure()
    low = min(checkpoints, key=lambda m: m.peak.activation)
    log(f"  checkpoint_sequential: {len(checkpoints)} configurations (sequential forms: loss and "
        f"gradients {forms_ok} vs the zoo model); lowest activation peak "
        f"{low.peak.activation / MiB:.1f} MiB ({low.config})")

    # Activation offloading (saved-tensor hooks to flash) and save_on_cpu: every threshold's peak.
    offloads = offload_methods(name, options, optimizer_name, args.page_dir)
    offloads[0].run()  # warm-up (and the optimizer's momentum)
    for method in offloads:
        method.peak = method.measure()
    log("  offload: " + ", ".join(f"{m.config.split(', ')[-1]}: {m.peak.activation / MiB:.1f} "
                                  "MiB" for m in offloads))
    sac_note = sac_ilp_probe(name)
    log(f"  torch.distributed._tools.sac_ilp on this machine: {sac_note}")

    # torch.compile: the knob searched per target.
    sweep = CompileSweep(name, options, optimizer_name, args.compile_backend, args.max_compiles,
                         log)
    for budget in budgets:
        if budget.ours is None:
            continue
        target = budget.ours.peak.activation
        evaluated = sweep.search(target, args.knob_steps)
        pools = {"checkpoint_sequential": checkpoints, "torch.compile": evaluated,
                 "offload to flash": [m for m in offloads if m.kind == "offload to flash"],
                 "save_on_cpu": [m for m in offloads if m.kind == "save_on_cpu"]}
        for kind, pool in pools.items():
            fits = sorted((m for m in pool if m.peak.activation <= target),
                          key=lambda m: m.rank)
            budget.closest[kind] = not fits
            if not fits:
                fits = [min(pool, key=lambda m: m.peak.activation)] if pool else []
            budget.candidates[kind] = fits[: args.candidates]
    for note in sweep.notes:
        log(f"  note: {note}")
    knobs = ", ".join(f"{k:.3f}: {m.peak.activation / MiB:.1f}"
                      for k, m in sorted(sweep.methods.items()))
    log(f"  torch.compile ({sweep.backend}) knob: activation peak MiB -- {knobs}")

    # Timed rounds, interleaved.
    methods: list[Method] = [eager, keep_all]
    for budget in budgets:
        if budget.ours is not None:
            methods.append(budget.ours)
        if budget.other_way is not None:
            methods.append(budget.other_way)
        for pool in budget.candidates.values():
            methods.extend(m for m in pool if all(m is not o for o in methods))
    log(f"  timing {len(methods)} methods x {args.rounds} rounds ...")
    load = [os.getloadavg()[0]]  # the machine is shared: wall times move with its load
    for r in range(args.rounds):
        order = methods[r % len(methods):] + methods[: r % len(methods)]
        for method in order:
            method.times.append(method.run())
            method.cpu_times.append(method.last_cpu_s)
    load.append(os.getloadavg()[0])
    paired = None
    if args.paired:
        log(f"  the executor's own overhead in {args.paired} adjacent pairs of steps ...")
        import executor_overhead  # this script's neighbour (its directory is on sys.path)
        with tempfile.TemporaryDirectory() as paired_dir:
            paired = executor_overhead.paired(name, args.paired, paired_dir, options)
    return _report(title, graph, plain, model_plain, budgets, eager, [keep_all],
                   forms_ok, sweep, args, sac_note, load, paired)


def plan_at_or_above(graph, profile, budget_bytes: int, fraction: float, plain: int, args,
                     paging: str = "none"):
    """(solved, the budget it was planned at, a note saying why that is not the one asked for).
    Below the planner's floor (one node's inputs, output and workspace at
    once), and where no solver finds a schedule within the time limit (the floor is necessary,
    not sufficient), the budget is raised until a plan is found: the lowest budget ours
    reaches, which the peers are then measured against."""
    from edge_remat.planner.build import build_problem
    from edge_remat.planner.problem import InfeasibleBudget, ProblemError
    from edge_remat.planner.solve import NoPlan, solve

    def attempt(nbytes: int):
        return solve(build_problem(graph, f"{nbytes}B", profile, "time", None, paging),
                     "auto", time_limit=args.time_limit)
    try:
        return attempt(budget_bytes), budget_bytes, ""
    except InfeasibleBudget as error:
        if error.smallest_bytes is None:
            raise
        smallest = error.smallest_bytes
        text = str(error)
        floor = (f"the planner's floor (fixed + "
                 f"{(smallest - graph.fixed_bytes) / MiB:.1f} MiB = "
                 f"{(smallest - graph.fixed_bytes) / plain:.0%} of eager's peak: "
                 f"{text[text.find('node '):].split(' needs')[0]} needs it)")
        note = (f"the lowest budget ours reaches, from {floor}; " if fraction <= 0 else
                f"{_label(fraction)} is below {floor}; ")
        # then in steps of eager's peak: near the floor a plan may take more than the limit
        tries = ([smallest + int(extra * (smallest - graph.fixed_bytes))
                  for extra in (0.0, 0.05, 0.1, 0.2)]
                 + [smallest + int(extra * plain) for extra in (0.05, 0.1, 0.15, 0.2, 0.3)])
    except NoPlan:
        note = f"no plan found at {_label(fraction)} within {args.time_limit:g} s; "
        tries = [budget_bytes + int(extra * plain) for extra in (0.05, 0.1, 0.2, 0.35, 0.5)]
    for nbytes in tries:
        try:
            solved = attempt(nbytes)
        except (ProblemError, NoPlan):
            if nbytes == tries[-1]:
                raise
            continue
        allowed = nbytes - graph.fixed_bytes
        return solved, nbytes, note + (f"planned at fixed + {allowed / MiB:.1f} MiB "
                                       f"({allowed / plain:.0%} of eager's peak) instead. ")
    raise AssertionError("unreachable: the last try raises")


def _label(fraction: float) -> str:
    return f"{fraction:.0%}" if fraction > 0 else "lowest"


def _count(plan, op: str) -> int:
    return sum(1 for stage in plan.stages for ins in stage if ins.op == op)


def _recomputes(plan) -> int:
    computes: dict = {}
    for stage in plan.stages:
        for ins in stage:
            if ins.op == "compute":
                computes[ins.node] = computes.get(ins.node, 0) + 1
    return sum(n - 1 for n in computes.values())


def _forward_times(form: SequentialForm, batch: tuple, repeats: int = 3) -> list[float]:
    """Each module's forward time (grad mode, as a checkpoint recomputes it): the median."""
    times: list[list[float]] = [[] for _ in form.modules]
    for _ in range(repeats):
        x = batch[0]
        for i, module in enumerate(form.modules):
            start = time.perf_counter()
            x = module(x)
            times[i].append(time.perf_counter() - start)
        del x
    return [statistics.median(t) for t in times]


# -- the report ---------------------------------------------------------------------------------

def _report(title, graph, plain, model_plain, budgets, eager, references, forms_ok, sweep,
            args, sac_note, load, paired) -> dict:
    out = {"model": title, "eager_activation_peak_bytes": plain,
           "model_plain_activation_bytes": model_plain, "fixed_bytes": graph.fixed_bytes,
           "compile_backend": sweep.backend, "compile_notes": sweep.notes,
           "sequential_forms": forms_ok, "sac_ilp": sac_note, "budgets": []}
    keep_all = references[0]
    overhead = statistics.median([k / e for k, e in zip(keep_all.times, eager.times)])
    # CPU time (user + system, the process's): on a shared machine wall time swings with
    # the other jobs' load, CPU time far less.
    overhead_cpu = statistics.median([k / e for k, e in zip(keep_all.cpu_times,
                                                              eager.cpu_times)])
    out["executor_overhead"], out["executor_overhead_cpu"] = overhead, overhead_cpu
    out["load_average"] = load
    print(f"\n{title}: eager activation peak {plain / MiB:.1f} MiB, fixed memory "
          f"{graph.fixed_bytes / MiB:.1f} MiB, {args.rounds} rounds; load average "
          f"{load[0]:.1f} before timing, {load[1]:.1f} after (on {os.cpu_count()} cores)")
    print(f"  the executor's own overhead (keep-all plan / eager, median over rounds): "
          f"{overhead:.3f}x wall, {overhead_cpu:.3f}x CPU time (target <= "
          f"{OVERHEAD_TARGET:.2f}x)")
    if paired is not None:
        out["executor_overhead_cpu_paired"] = paired["ratio_cpu"]
        print(f"  the same in adjacent pairs (one eager step after each keep-all step, one run, "
              f"executor_overhead.py --paired): {paired['ratio_cpu']:.3f}x CPU time, median of "
              f"{paired['pairs']} per-pair ratios")
    print(f"  torch.distributed._tools.sac_ilp (PyTorch's selective-checkpointing ILP): "
          f"{sac_note}")
    for budget in budgets:
        row = {"fraction": budget.fraction, "budget_bytes": budget.budget_bytes,
               "plan": budget.plan_note, "grad_check": budget.grad_check, "methods": []}
        out["budgets"].append(row)
        print(f"\n  budget {_label(budget.fraction)} of eager's activation peak "
              f"({(budget.budget_bytes - graph.fixed_bytes) / MiB:.1f} MiB): {budget.plan_note}")
        if budget.ours is None:
            continue
        ours_m = budget.ours
        target = ours_m.peak.activation
        print(f"  ours measured: activation peak {target / MiB:.1f} MiB = {target / plain:.0%} "
              f"of eager's (the executor's own ledger: {ours_m.info['ledger_peak'] / MiB:.1f} "
              f"MiB); gradients {budget.grad_check}")
        print(f"  {'method':<22} {'configuration':<{CONFIG_WIDTH}} {'act. MiB':>9} {'/ours':>5} "
              f"{'+grads MiB':>10} {'step s':>7} {'ratio':>6} {'ours faster':>11}")
        rows = [("ours", ours_m, False)]
        for kind in PEERS:
            pool = budget.candidates.get(kind, [])
            if pool:
                rows.append((kind, min(pool, key=lambda m: m.median),
                             budget.closest.get(kind, False)))
        rows += [(m.kind, m, False) for m in
                 ([budget.other_way] if budget.other_way else []) + references]
        rows += [("eager", eager, False)]
        fitting: list[tuple[str, Method]] = []  # peers at equal or lower measured memory
        for kind, method, closest in rows:
            ratios = [t / o for t, o in zip(method.times, ours_m.times)]
            ratio = statistics.median(ratios)
            wins = sum(1 for t, o in zip(method.times, ours_m.times) if o < t)
            over = method.peak.activation > target
            config = method.config + (" [none fits: closest]" if closest else "")
            lines = textwrap.wrap(config, CONFIG_WIDTH) or [""]
            print(f"  {kind:<22} {lines[0]:<{CONFIG_WIDTH}} "
                  f"{method.peak.activation / MiB:>8.1f}{'!' if over else ' '} "
                  f"{method.peak.activation / target:>5.2f} "
                  f"{method.peak.with_grads / MiB:>10.1f} {method.median:>7.3f} {ratio:>6.2f} "
                  f"{'-' if method is ours_m else f'{wins}/{len(ratios)}':>11}")
            for line in lines[1:]:
                print(f"  {'':<22} {line}")
            if method is not ours_m and kind in PEERS and not over and not closest:
                fitting.append((kind, method))
            row["methods"].append({
                "kind": kind, "config": config, "activation_peak_bytes": method.peak.activation,
                "peak_with_grads_bytes": method.peak.with_grads, "over_ours": over,
                "step_times_s": method.times, "median_s": method.median,
                "ratio_to_ours": ratio, "ours_faster_rounds": wins, **{
                    k: v for k, v in method.info.items() if isinstance(v, (int, float, str))}})
        predicted = ours_m.info.get("predicted_s")
        miss = ours_m.median / predicted - 1 if predicted else None
        row.update(predicted_step_s=predicted, prediction_miss=miss)
        row.update(granularity=ours_m.info.get("granularity"),
                   granularity_alternatives=ours_m.info.get("alternatives", []))
        # The machine's own drift (a shared host's load between the profile and the timing
        # rounds; the executor's own overhead too) is what the keep-all plan, timed in the
        # same rounds, misses by: the model's own miss is what ours misses beyond it.
        keep_predicted = keep_all.info.get("predicted_s")
        drift = keep_all.median / keep_predicted if keep_predicted else None
        model_miss = ours_m.median / (predicted * drift) - 1 if predicted and drift else None
        row.update(keep_all_drift=drift, prediction_miss_beyond_keep_all=model_miss)
        if predicted:
            print(f"  ours predicted {predicted:.3f} s per step, measured {ours_m.median:.3f} s "
                  f"({miss:+.1%}; target within {PREDICTION_TARGET:.0%})"
                  + (f"; the keep-all plan measured {drift:.2f}x its prediction in the same "
                     f"rounds, ours {model_miss:+.1%} beyond that" if model_miss is not None
                     else ""))
        row.update(paging=ours_m.info.get("paging", "none"))
        if ours_m.info.get("page_outs"):
            busy = statistics.median(b for b, _ in ours_m.io)
            wait = statistics.median(w for _, w in ours_m.io)
            measured_hidden = 1.0 - wait / busy if busy > 0 else None
            info = ours_m.info
            planned_busy, planned_wait = info["planned_io_busy_s"], info["planned_io_wait_s"]
            # The share of IO compute did not wait for, planned as measured (the plan's hidden
            # share also counts the compute lost to the IO's CPU, which no clock separates).
            planned_unwaited = 1.0 - planned_wait / planned_busy if planned_busy else None
            row.update(planned_hidden_share=info["planned_hidden_share"],
                       planned_unwaited_share=planned_unwaited, planned_io_busy_s=planned_busy,
                       planned_io_wait_s=planned_wait,
                       planned_io_slowed_s=info["planned_io_slowed_s"],
                       measured_hidden_share=measured_hidden, measured_io_busy_s=busy,
                       measured_io_wait_s=wait)
            print(f"  paging hidden behind compute: planned {info['planned_hidden_share']:.0%} "
                  f"(of {planned_busy:.3f} s of IO, compute waits {planned_wait:.3f} s and "
                  f"loses {info['planned_io_slowed_s'] or 0.0:.3f} s to the IO's CPU); not "
                  f"waited for: planned "
                  + (f"{planned_unwaited:.0%}" if planned_unwaited is not None else "n/a")
                  + ", measured "
                  + (f"{measured_hidden:.0%}" if measured_hidden is not None else "n/a")
                  + f" (the step waited {wait:.3f} s of the IO thread's {busy:.3f} s, medians)")
        if fitting:
            best_kind, best = min(fitting, key=lambda km: km[1].median)
            row.update(ratio_best_peer=ours_m.median / best.median, best_peer=best_kind,
                       best_peer_config=best.config)
            print(f"  ratio_best_peer {row['ratio_best_peer']:.3f} (ours / {best_kind} "
                  f"{best.config}, medians; target <= {BEST_PEER_TARGET:.2f})")
        else:
            row.update(ratio_best_peer=None, best_peer=None, best_peer_config=None)
            print("  ratio_best_peer: none (no peer reached our measured memory)")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, fewer compilations")
    parser.add_argument("--models", type=names_among((name for name, _ in MODELS), "model"),
                        help="comma-separated subset: resnet18,bert-mini")
    parser.add_argument("--fractions", type=comma_list(non_negative_float),
                        help="budget fractions of eager's activation peak, 0 "
                        "for the lowest ours reaches, e.g. 0.5,0.3,0 (the default)")
    parser.add_argument("--rounds", type=positive_int, help="timed rounds (default 7; --quick 5)")
    parser.add_argument("--paired", type=non_negative_int, default=30, metavar="N",
                        help="the executor's own overhead measured again in N adjacent pairs "
                             "of steps, keep-all then eager (default 30; 0: not)")
    parser.add_argument("--candidates", type=positive_int, default=2,
                        help="configurations per baseline that are timed in the rounds")
    parser.add_argument("--knob-steps", type=non_negative_int,
                        help="bisection steps of the compile knob (default 2; --quick 1)")
    parser.add_argument("--max-compiles", type=non_negative_int,
                        help="compilations per model at most (default 5; --quick 3)")
    parser.add_argument("--compile-backend", default="inductor",
                        choices=("inductor", "aot_eager_decomp_partition"))
    parser.add_argument("--time-limit", type=positive_float,
                        help="solver seconds (default 20; quick 5)")
    parser.add_argument("--context-steps", type=positive_int, help="op profiler steps (default 3)")
    parser.add_argument("--granularity", default="best",
                        choices=("module", "operator", "best"),
                        help="ours on the module-level graph, the operator-level one (a node "
                        "per ATen op), or both, per budget the plan predicted to recompute least "
                        "(default)")
    parser.add_argument("--paging", default="best", choices=("none", "flash", "best"),
                        help="recompute only (none), let our plan page to flash too, "
                        "overlapped with compute (flash), or plan both ways and take per "
                        "budget the plan predicted faster (best, the default)")
    parser.add_argument("--page-dir", type=existing_folder, default=tempfile.gettempdir())
    parser.add_argument("--threads", type=positive_int,
                        help="torch's intra-op threads for every method (default: torch's own; "
                             "1 on a loaded machine, where spinning threads wait on each other)")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--sac-probe", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sac_probe:
        print(_sac_ilp_probe_here(args.sac_probe))
        return 0
    quick = args.quick
    args.fractions = args.fractions or list(FRACTIONS)
    args.rounds = args.rounds or (5 if quick else 7)
    args.knob_steps = args.knob_steps if args.knob_steps is not None else (1 if quick else 2)
    if args.max_compiles is None:
        args.max_compiles = 3 if quick else 5
    args.time_limit = args.time_limit or (5.0 if quick else 20.0)
    args.context_steps = args.context_steps or (2 if quick else 3)
    import torch._dynamo  # noqa: F401 - torch.compile's configuration
    import torch._functorch.config  # noqa: F401
    if args.threads:
        torch.set_num_threads(args.threads)

    from edge_remat_agent.profiler import board_identity
    identity = board_identity()
    log = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731 - progress
    print(f"# {identity['cpu']}, {identity['cpu_usable']} cores, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; budgets "
          f"{', '.join(_label(f) for f in args.fractions)} of eager's activation peak")
    print("# activation peak: bytes the CPU allocator handed out during one steady-state "
          "training step and still held, at the step's worst moment, gradients left out "
          "(profiler memory events; see the docstring); +grads: with them")
    print("# step s: median over the rounds; ratio: median over rounds of method / ours (> 1: "
          "ours faster); ours faster: rounds where ours was faster; ! over our peak")
    print("# checkpoint_sequential cxs of n: c checkpointed segments of s modules = "
          "checkpoint_sequential(first (c+1)s modules, segments=c+1), the rest plain")
    results = []
    for name, options in (QUICK if quick else MODELS):
        if args.models and name not in args.models:
            continue
        results.append(bench_model(name, options, args, log))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
