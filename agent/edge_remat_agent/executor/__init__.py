"""The executor: runs a plan over the captured graph for N real training steps, and measures it.

    from edge_remat_agent.executor import run_plan, run_plain
    report = run_plan(graph, plan, steps=3, page_dir="/data/pages")

Modules, one job each:
    interpreter.py  the instruction loop: compute / free / page_out / page_in, one handler each
    step.py         one training step (plan, optimizer step, batch-norm updates once); plain_step
    ledger_replay.py  the ledger's figures of a plan's step, measured twice, then replayed
    compiled_step.py  a replayed step as one straight-line function (no interpreter loop,
                    nothing counted): the same ops, in the same order, dropped at the same points
    gradcheck.py    the eager reference step and the bitwise gradient comparison
    batches.py      each step's batch (the example batch, a callable, an iterable)
    stores.py       the page stores a plan needs (flash: FlashStore; host: given, or in memory)
    report.py       per-step records and the summary
    run.py          run_plan / run_plain: checks, the step loop, the report
    jobs.py         the daemon's "run" job (`edge-remat deploy`, `edge-remat run`): params
                    plan, graph, steps, data, seed, lr, optimizer, page_dir, ...
Planner nodes run through capture.replay.StepRunner, the one engine that executes a graph.

API
---
run_plan(graph, plan, steps, page_dir=None, data=None, check_gradients=True, progress=None,
         sensor=None, *, device="cpu", captured=None, stores=None, seed=None,
         flash_fsync=True, flash_capacity_bytes=None, map_large_allocations=True,
         lr=None) -> dict

    graph     the `Graph` the plan was made for (a file from `edge-remat graph`). Its model is
              captured again here (`capture.recapture`) unless `captured` (a `Captured` for this
              very graph, e.g. from `capture_module`) is given. Refused with `PlanMismatch`
              when the plan's `graph_fingerprint` differs from the graph file's or from the
              graph captured on this machine (another torch or model code).
    plan      a `Plan`; replayed by the simulator first (`ExecutorError` if it cannot run).
    steps     training steps (>= 1); the optimizer (graph.capture["optimizer"]: SGD with
              momentum 0.9, lr 0.01, or AdamW lr 1e-3; foreach=False) steps after each.
    lr        overrides the optimizer's learning rate (capture.optimizer.torch_optimizer, the
              same helper plain training uses).
    page_dir  directory on the board's flash for `flash` pages (required when the plan pages
              to flash). Pages are checksummed files, removed after each step and on exit;
              a killed run's are removed by the next run there (tiers.flash.cleaned_stale).
    data      None or "example": the capture's example batch every step; a data spec
              ("digits", "MODULE:FUNCTION": edge_remat_agent.data, shuffled with `seed` or 0,
              as plain training shuffles it); a callable step -> batch; or an iterable of
              batches. A batch is the model's example_args (same shapes, dtypes).
    check_gradients  on the first step, run a plain step on the same parameters, batch and
              generator state first, and compare every gradient and the loss bit for bit
              (`torch.use_deterministic_algorithms(True)` for the whole run): eager PyTorch on
              the CPU; on a device, the captured ops replayed once each in order (eager's
              kernels differ there: gradcheck.py). Costs one plain step's memory: turn it off
              on a board too small for plain training.
    progress  callable(step_index, steps, record) after each step (raise to stop the run).
    sensor    a `PowerSensor`, a sensor name, "auto" (the board's own sensor, if any) or None.
    device    "cpu" (default) or e.g. "cuda": the module, batch, factories and generators go
              there; pages still go through the CPU. Bitwise equality with eager PyTorch is
              promised on the CPU; on a device, with the captured step replayed plainly.
    stores    {"flash": PageStore, "host": PageStore} to use instead of the defaults; "host"
              defaults to a MemoryStore in this process (the report says it frees no RAM);
              stores.host_link_store(plan, "HOST:PORT") is one over the host's page service
              (pages/service.py), which the run job makes from its `host_pages` param.
    seed      torch.manual_seed(seed) before the first step (None: the generator as it is).
    flash_capacity_bytes / flash_fsync   FlashStore options (a capacity makes a full store
              fail with `InstructionFailed` naming the bytes needed and held). fsync is on
              by default: a page written without it stays in the page cache, which is RAM
              (charged to the board's memory cgroup) until writeback, and the profiler times
              the flash with fsync, so the plan's paging costs are fsync's.
    map_large_allocations  fix glibc's mmap threshold at 1 MiB for the process
              (edge_remat_agent/allocator.py), so that a freed tensor leaves the resident set
              at once; without it glibc keeps freed activations resident and the RSS hides what
              the plan saves. It costs page faults (measured: steps 1.5-2x slower here).
              Without it, glibc's own policy is pinned at its steady state (blocks up to
              32 MiB from the heap, the heap's freed top not trimmed), so that steady steps
              do not fault again what the previous step's end gave back.
    stop_on_nonfinite  stop after the first step whose loss is NaN or infinite (no checkpoint
              of it, no `on_trained`); default False: every step runs, as PyTorch's would.

Returns a JSON-serialisable report:
    steps[]   per step: loss, step_time_s, ledger_peak_bytes (the executor's own ledger of live
              tensor bytes, the figure the plan predicts: fixed memory + held activations +
              each node's workspace; once two measured steps agree on it, later steps of a
              plan without paging replay their rise, ledger_replay.py), rss_peak_bytes (the process's resident peak, measured
              independently: sampled RSS and the kernel's VmHWM), device_peak_bytes (CUDA's
              allocator peak; None on the CPU), energy_j (None without a sensor), computes, recomputed, page_outs, page_ins, pages_written, paged_bytes,
              compute_s, recompute_s, page_out_s, page_in_s
    grad_check  {"bitwise_equal", "max_abs_diff", "compared", "loss_equal", "differing",
              "missing", "reference_bytes", ...}, or None when not checked
    predicted_peak_bytes, predicted_time_s, predicted{...}, budget_bytes, fixed_bytes,
    recomputed, page_ins, page_outs (per step), tiers, device, sensor,
    data (what it trained on: "example", the data spec, or "given by the caller (...)"),
    optimizer ({"name", its options, "lr" as it stepped})
    summary   steady-state medians, ledger vs predicted peak (never above it: the graph's
              fixed memory counts the batch-norm statistics and the loss the executor holds
              to the step's end), measured recompute overhead vs the plan's TDI, paging time
              vs predicted, nonfinite_loss (the first step whose loss is NaN or inf, how many
              were, what to try: diverged.py; None while all are finite)
    stopped_at_step  the step stop_on_nonfinite stopped after; None: every step ran

run_plain(graph, steps, data=None, progress=None, sensor=None, *, device="cpu", model=None,
          seed=None, map_large_allocations=True, lr=None) -> dict
    Plain eager training (`plain_step`) measured the same way, for a `--plain` run: the same
    report shape with "mode": "plain", ledger_peak_bytes None and no plan figures.
plain_step(module, optimizer, batch) -> float   one eager step (zero grads, forward, backward,
    optimizer step); torch_optimizer(name, module) builds the optimizer the plan assumes.

Errors (all `ExecutorError`, one clear line each): `BadInput` (nothing ran: `PlanMismatch`,
`BadBatch`, an invalid plan, a model that cannot be built here),
`InstructionFailed` (which instruction; a full or corrupted page store says so), `OutOfMemory`
(the board ran out of RAM: which instruction, and the remedy).
"""

from .errors import (BadBatch, BadInput, ExecutorError, InstructionFailed, OutOfMemory,
                     PlanMismatch)

__all__ = ["run_plan", "run_plain", "plain_step", "torch_optimizer", "ExecutorError",
           "BadInput", "PlanMismatch", "BadBatch", "InstructionFailed", "OutOfMemory"]


def __getattr__(name):  # torch-heavy parts load on first use
    if name in ("run_plan", "run_plain"):
        from . import run
        return getattr(run, name)
    if name == "plain_step":
        from .step import plain_step
        return plain_step
    if name == "torch_optimizer":
        from ..capture.optimizer import torch_optimizer
        return torch_optimizer
    raise AttributeError(name)
