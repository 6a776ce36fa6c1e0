"""Plain PyTorch training, the comparison: what a user runs without edge-remat.

Eager autograd and a torch optimizer over the same model, weights and data as a planned run;
each step is reported (loss, time, resident peak) the moment it is done, so that a run the
kernel kills for memory still says how far it got. The daemon runs it as the job kind
"train-plain" with params `model`, `steps` and optionally `batch`, `image`, `seq`, `seed`,
`optimizer`, `lr`, `lr_schedule`, `warmup`, `clip_grad_norm`, `dtype`, `trainable_dtype`,
`data` (a data spec, see edge_remat_agent.data), `accumulate` (K micro-batches a step, each
loss divided by K, one optimizer step: accumulation.py), `malloc` (as the planned run's job
takes it: executor/jobs.py), `stop_on_nonfinite` (stop after the first step whose loss is not
finite: diverged.py). Its result says `nonfinite_loss` and `stopped_at_step`.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Optional

from .diverged import LossTally, remedy_for


def train_plain(model: str, steps: int, batch: Optional[int] = None,
                image: Optional[int] = None, seq: Optional[int] = None, seed: int = 0,
                optimizer: str = "sgd", lr: Optional[float] = None, data: Optional[str] = None,
                on_step: Optional[Callable[[dict], None]] = None,
                train: Optional[list[str]] = None, lr_schedule: str = "constant",
                warmup: int = 0, clip_grad_norm: Optional[float] = None,
                accumulate: int = 1, dtype: Optional[str] = None,
                trainable_dtype: Optional[str] = None,
                stop_on_nonfinite: bool = False,
                on_trained: Optional[Callable[[Any], None]] = None) -> dict[str, Any]:
    """Train `steps` steps eagerly; `on_step(report so far)` after each. `train`: parameter
    name patterns to train (the rest frozen), `dtype` the model's (fp32 | bf16 | fp16) and
    `trainable_dtype` the trained parameters' (None: `dtype`), as the planned run's graph
    was captured; `lr_schedule`, `warmup` (lr_schedule.py) and
    `clip_grad_norm` (grad_clip.py) as the planned run's. `accumulate`: micro-batches per
    step, their gradients summed into `.grad`. `stop_on_nonfinite`: stop after the first step
    whose loss is not finite (the report's `stopped_at_step`; None: it took every step).
    `on_trained(module)` after the last step (not after a stop at a loss that is not finite,
    whose weights are diverged): the planned run's job saves its weights so."""
    import torch

    from .accumulation import check_micro_batches, mean_loss, scaled
    from .diverged import is_nonfinite
    check_micro_batches(accumulate)
    from .capture.models import load_model
    from .capture.optimizer import torch_optimizer
    from .data import DataError, batches
    from .executor.baseline import group_peak, runtime_baseline
    from .executor.batches import _data_errors
    from .executor.errors import BadBatch
    from .grad_clip import check_max_norm, clip_all
    from .lr_schedule import ScheduledLr
    from .profiler.memory import PeakRssSampler, current_rss_bytes

    module, example_args = load_model(model, batch, image, seq, seed, dtype, train,
                                      trainable_dtype)
    # In the mode the model's factory gave it, as the planned run's capture traced it (a
    # factory's eval() model: no dropout, batch norm's running statistics used and kept).
    # The optimizer (and --lr) and the batches a planned run uses too (executor/run.py):
    # both runs take the same steps on the same data.
    opt = torch_optimizer(optimizer, module, lr)
    schedule = ScheduledLr([opt], lr_schedule, warmup, steps)
    clip = None if clip_grad_norm is None else check_max_norm(clip_grad_norm)
    # data that cannot feed the model (its function's error before a first batch too) is
    # the job's bad input, as the planned run's (executor/batches.py)
    try:
        feed = _data_errors(batches(data, example_args, seed, module), DataError)
    except DataError as error:
        raise BadBatch(str(error)) from None
    # the generator as the planned run seeds it before its first step: dropout draws alike
    torch.manual_seed(seed)
    # what the kernel charges before step 1, and its peak restarted there, as the planned
    # run reads them (executor/baseline.py): the two runs' physical memory compares alike
    baseline = runtime_baseline(module)
    report: dict[str, Any] = {"model": model, "optimizer": optimizer,
                              "lr": opt.param_groups[0]["lr"], "data": data or "example",
                              "steps": 0, "loss": [], "step_time_s": [], "rss_peak_bytes": [],
                              "rss_start_bytes": current_rss_bytes(),
                              "runtime_baseline_bytes": baseline["bytes"],
                              "runtime_baseline": baseline, "stopped_at_step": None}
    for step in range(1, steps + 1):
        args = next(feed)
        schedule.at(step - 1)
        with PeakRssSampler(period_s=0.005) as rss:
            start = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            losses = []
            for micro in range(accumulate):  # the next micro-batch, one at a time
                if micro:
                    args = next(feed)
                loss = module(*args)
                scaled(loss, accumulate).backward()
                losses.append(float(loss.detach()))
            if clip is not None:
                clip_all(module.parameters(), clip)
            opt.step()
            elapsed = time.perf_counter() - start
        report["steps"] = step
        report["loss"].append(mean_loss(losses))
        report["step_time_s"].append(elapsed)
        report["rss_peak_bytes"].append(rss.peak_bytes)
        del loss
        if on_step is not None:
            on_step(report)
        # the loss is a Python float already: one isfinite a step, nothing more
        if stop_on_nonfinite and is_nonfinite(report["loss"][-1]):
            report["stopped_at_step"] = step
            break
    report["torch_threads"] = torch.get_num_threads()
    # the board's own kernel peak, for a host that holds no cgroup of it (an SSH board's)
    if (kernel_peak := group_peak(baseline)) is not None:
        report["kernel_peak"] = kernel_peak
    if on_trained is not None and report["stopped_at_step"] is None:  # not diverged weights
        on_trained(module)
    return report


def plain_train_params(read) -> dict:
    """The train-plain job's params as it reads them first, before torch and the model (a
    JobParams; registry.refuse_bad_params reads them where the job is submitted): each that
    is wrong is bad input (BadParam, exit 2), not a failed job's ValueError."""
    from .daemon.registry import BadParam
    from .executor.jobs import SEED_RANGE, refuse_bad_schedule, requested_malloc
    from .executor.save_choice import DEFAULT_SAVE, check_save_choice
    from .grad_clip import check_max_norm
    from .lr_schedule import MAX_STEPS
    given = {"model": str(read.required("model", "a model")),
             "steps": read.integer("steps", 10, minimum=1, maximum=MAX_STEPS),
             "seed": read.integer("seed", 0, **SEED_RANGE),
             "lr": read.number("lr", minimum=0),
             **{name: read.integer(name, minimum=1) for name in ("batch", "image", "seq")},
             "warmup": read.integer("warmup", 0, minimum=0),
             "accumulate": read.integer("accumulate", 1, minimum=1),
             "clip_grad_norm": read.number("clip_grad_norm"),
             "lr_schedule": str(read.params.get("lr_schedule") or "constant")}
    refuse_bad_schedule(given["lr_schedule"], given["warmup"], given["steps"])
    try:
        if given["clip_grad_norm"] is not None:
            check_max_norm(given["clip_grad_norm"])
    except ValueError as error:
        raise BadParam(str(error)) from None
    return {**given, "malloc": requested_malloc(read.params),
            "save": check_save_choice(str(read.params.get("save") or DEFAULT_SAVE))}


def plain_train_job(ctx, params: dict) -> dict:
    from .daemon.registry import JobCancelled, JobParams
    from .executor.jobs import param_flag, start_under
    given = plain_train_params(JobParams(params, ctx, "train-plain"))
    model, steps, seed, lr = given["model"], given["steps"], given["seed"], given["lr"]
    batch, image, seq = given["batch"], given["image"], given["seq"]
    warmup, accumulate = given["warmup"], given["accumulate"]
    clip_grad_norm, lr_schedule = given["clip_grad_norm"], given["lr_schedule"]
    # under the malloc asked for, as a planned run is: the comparison is like for like
    malloc = start_under(given["malloc"], ctx)
    losses = LossTally(remedy_for(params, lr))

    def on_step(report: dict) -> None:
        step = report["steps"]
        losses.see(step, report["loss"][-1])
        ctx.progress(step / steps, f"step {step}/{steps}: loss {report['loss'][-1]:.4f}",
                     step=step, loss=report["loss"], step_time_s=report["step_time_s"],
                     rss_peak_bytes=report["rss_peak_bytes"], nonfinite_loss=losses.found)
        ctx.flush()  # now, not in 0.2 s: the next step may be killed before then
        if ctx.cancelled:
            raise JobCancelled()

    from .executor.save_choice import WEIGHTS_FILE
    from .executor.saved_weights import WeightsSaver
    saved = WeightsSaver(ctx.files_dir / WEIGHTS_FILE, given["save"])
    report = train_plain(model, steps, batch, image, seq, seed,
                         str(params.get("optimizer", "sgd")), lr,
                         params.get("data"), on_step, params.get("train"),
                         lr_schedule, warmup, clip_grad_norm, accumulate, params.get("dtype"),
                         params.get("trainable_dtype"),
                         param_flag(params.get("stop_on_nonfinite", False)), saved.save)
    # the trained weights as a planned run saves them (QA: --plain kept none to compare)
    return {**report, "malloc": malloc, "nonfinite_loss": losses.found,
            "saved_weights": saved.figures, "saved_weights_error": saved.error,
            "files": [WEIGHTS_FILE] if saved.figures else []}
