"""Jobs every agent build has. They exercise the plumbing (queue, progress, checkpoints,
resume, output files) without needing torch, except `torch-check`, which proves torch works."""

from __future__ import annotations

import hashlib
import json
import time

from .registry import JobCancelled, JobContext, JobParams


def sysinfo_job(ctx: JobContext, params: dict) -> dict:
    from .sysinfo import collect
    return collect(ctx.workdir)


def echo_job(ctx: JobContext, params: dict) -> dict:
    """Returns its params; with "file" it also reports that pushed file's size and sha256 and
    writes echo.json as an output; with "fail" it fails with that message."""
    if params.get("fail"):
        raise RuntimeError(str(params["fail"]))
    result = {"params": params, "files": ["echo.json"]}
    file = JobParams(params, ctx, "echo").input_path("file")
    if file is not None:
        data = file.read_bytes()
        result["file_bytes"] = len(data)
        result["file_sha256"] = hashlib.sha256(data).hexdigest()
    ctx.write_json("echo.json", result)
    ctx.progress(1.0, "echoed")
    return result


SLEEP_MAX_S = 7 * 24 * 3600  # a week: the sleep job is a test of the plumbing
SLEEP_MAX_STEPS = 100_000  # each step writes a checkpoint


def sleep_params(read: JobParams) -> "tuple[float, int]":
    """The sleep's seconds and steps (registry.refuse_bad_params reads them where the job is
    submitted). Bounded: -5 was time.sleep's ValueError and 1e300 its OverflowError, a failed
    job."""
    return (read.number("seconds", 1.0, minimum=0, maximum=SLEEP_MAX_S),
            read.integer("steps", 10, minimum=1, maximum=SLEEP_MAX_STEPS))


def sleep_job(ctx: JobContext, params: dict) -> dict:
    """Sleeps `seconds` (0 to a week) in `steps` steps (1 to 100,000), checkpointing each step, so it resumes (not restarts)
    after the agent itself was stopped. `starts` counts how often the job process began it:
    a dropped link must leave it at 1."""
    seconds, steps = sleep_params(JobParams(params, ctx, "sleep"))
    checkpoint = ctx.state_dir / "sleep.json"
    state = {"step": 0, "starts": 0}
    if checkpoint.exists():
        state = json.loads(checkpoint.read_text())
    resumed_from = state["step"]
    state["starts"] += 1
    checkpoint.write_text(json.dumps(state))
    for step in range(resumed_from, steps):
        if ctx.cancelled:
            raise JobCancelled()
        time.sleep(seconds / steps)
        state["step"] = step + 1
        checkpoint.write_text(json.dumps(state))
        ctx.progress((step + 1) / steps, f"step {step + 1}/{steps}", step=step + 1,
                     **({"resumed_from_step": resumed_from} if resumed_from else {}))
    return {"steps": steps, "seconds": seconds, "resumed_from": resumed_from,
            "starts": state["starts"]}


def torch_check_job(ctx: JobContext, params: dict) -> dict:
    import torch
    a = torch.ones(64, 64)
    return {"torch": torch.__version__, "matmul_sum": float((a @ a).sum()),
            "threads": torch.get_num_threads()}
