"""The daemon's "run" job: what `edge-remat deploy PLAN --graph G --steps N` starts on the board.

params: plan, graph (board paths of the pushed files), steps (default 10); optional page_dir
(default: <workdir>/pages), check_gradients (default true), sensor (default "auto": the
board's own sensor if it has one), device (default "cpu"), seed, keep_malloc_defaults,
data (a data spec, see edge_remat_agent.data: "example" (default), "digits",
"MODULE:FUNCTION"; shuffled with `seed`, as plain training shuffles it), lr (overrides the
optimizer's learning rate), lr_schedule ("constant" (default), "linear", "cosine") and
warmup (steps, default 0: edge_remat_agent.lr_schedule), optimizer (checked against the one the graph was captured for:
its update node stands for that optimizer, so the run cannot change it), host_pages
("HOST:PORT" of the host's page service, seen from the board: a plan's `host` pages go there
instead of staying in this process; the host starts the service and passes this),
host_pages_wait_s (how long a page request waits for a dropped link to the service to come
back, default 150 s; the host passes its board's reconnect window), allocator
("glibc" (default) or "arena": every planned tensor at its offset in the plan's arena layout),
malloc ("glibc", "jemalloc", "tcmalloc"; default jemalloc with the arena allocator, else
glibc: the job process starts again at once under it, preloaded, where its library is
installed; elsewhere it runs under glibc's and the report's `malloc` says so), save
("trained" (default), "all", "none": the trained weights written to weights.pt, see
saved_weights.py), init (a pushed weights file loaded into the model before it trains),
checkpoint_every (write checkpoint.pt after every N-th step and the last: checkpoint.py),
stop_after (stop after that step of `steps`, whose schedule it keeps), resume (a checkpoint's
path on the board, pushed or an earlier job's files/checkpoint.pt, to go on from), identity
(the options a resume must match, written into each checkpoint; lr may differ from the
checkpoint's), stop_on_nonfinite (stop after the first step whose loss is not finite:
diverged.py; the result's stopped_at_step names it, and the last checkpoint before it stays),
out (the host's folder of the run's outputs, which its --resume names: what to try after a
stop names it), traced and traced_key (the host's own trace of the graph, kept where it is this
board's: capture/handed.py). A job its daemon starts again
(stopped or killed mid-job) goes on from its own newest files/checkpoint.pt where it wrote one,
and its progress then says resumed_from_step (the host says so); its report holds every step
of the job, each record's job_start saying which start trained it. Started again after its
last step's checkpoint, it trains nothing: it saves the weights from that checkpoint and
reports its steps (its progress says completed_before_restart).
Writes run_report.json (fetched by the host) and returns its summary; both say which data the
run trained on and with which optimizer settings.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from ..allocator import MALLOCS, missing_malloc, preload_environment, running_malloc
from ..daemon.layout import job_page_dir
from ..daemon.registry import BadParam, JobContext, JobParams
from ..diverged import LossTally, remedy_for
from ..lr_schedule import MAX_STEPS
from ..units import format_size

# Set in the environment of a job process started again under a malloc: it is not restarted
# twice, even where the preload did not take.
RESTARTED_UNDER = "EDGE_REMAT_RESTARTED_UNDER"
CAPTURING = "capturing the graph on the board"  # the run job's progress until it trains
# the seeds torch.manual_seed takes (1e30 was its RuntimeError, a failed job)
SEED_RANGE = {"minimum": -2 ** 63, "maximum": 2 ** 64 - 1}


def run_job(ctx: JobContext, params: dict) -> dict:
    from ..formats import load_graph, load_plan
    read = JobParams(params, ctx, "run")
    given = run_params(read)
    steps, plan_path, graph_path = given.steps, given.plan, given.graph
    seed, lr, warmup, lr_schedule = given.seed, given.lr, given.warmup, given.lr_schedule
    time_nodes, init, stop_after = given.time_nodes, given.init, given.stop_after
    every, resume_path, save = given.checkpoint_every, given.resume, given.save
    malloc = start_under(given.malloc, ctx)
    graph = load_graph(graph_path)
    plan = load_plan(plan_path)
    captured_for = graph.capture.get("optimizer", "sgd")
    if params.get("optimizer") and str(params["optimizer"]) != captured_for:
        raise BadParam(f"the graph was captured for the {captured_for} optimizer, not "
                       f"{params['optimizer']}: its update node (memory, cost) is that "
                       "optimizer's. Capture again with that optimizer and plan again")
    if "host" in plan.tiers_used() and not params.get("host_pages"):
        # stores (torch and the page stores) only here: imported before every capture, on a
        # board with no room to spare it moved the out-of-memory kill (test_run_e2e)
        from .stores import host_pages_refusal
        if (unhosted := host_pages_refusal(plan, None, params.get("device", "cpu"))) is not None:
            raise BadParam(unhosted)  # before the capture: nothing ran, nothing held in RAM
    page_dir = job_page_dir(params.get("page_dir"), ctx.workdir)
    from .save_choice import CHECKPOINT_FILE, WEIGHTS_FILE

    picked_up = _picked_up_step(ctx, steps, stop_after)
    completed = picked_up is not None and picked_up == (stop_after or steps)
    resumed = {} if picked_up is None else {"resumed_from_step": picked_up,
                                            **({"completed_before_restart": True}
                                               if completed else {})}
    stop_on_nonfinite = param_flag(params.get("stop_on_nonfinite", False))
    remedy = remedy_for(graph.capture, lr, resume_out=_resume_out(
        params, stop_on_nonfinite and bool(every or resume_path)))
    losses = LossTally(remedy)  # the progress's; the report's tally has the same remedy
    checkpointed = {"step": None}

    def progress(index: int, total: int, record: dict) -> None:
        ctx.check_cancelled()
        losses.see_record(index + 1, record)
        if "checkpoint_s" in record:
            checkpointed["step"] = index + 1
        ctx.progress((index + 1) / total,
                     f"step {index + 1}/{total}: loss {record['loss']:.4g}, "
                     f"{record['step_time_s']:.3g} s, ledger peak "
                     f"{format_size(record['ledger_peak_bytes'])}",
                     step=index + 1, loss=record["loss"], step_time_s=record["step_time_s"],
                     ledger_peak_bytes=record["ledger_peak_bytes"],
                     rss_peak_bytes=record["rss_peak_bytes"],
                     # the host may see only the latest step's progress: the first kept here
                     nonfinite_loss=losses.found,
                     checkpoint_step=checkpointed["step"], **resumed)

    _check_page_dir(plan, page_dir)
    ctx.progress(0.0, CAPTURING + (
        f" (to save the outputs of its {picked_up} steps, trained before the restart)"
        if completed else f" (to resume after step {picked_up})" if resumed else ""),
        **resumed)
    from ..capture.handed import keep_handed
    keep_handed(read, graph_path)  # the host's own trace, where it is this board's
    captured = _capture_before_torch(graph, graph_path)
    if init is not None and captured is not None:
        from .saved_weights import load_weights
        load_weights(captured.module, init)
    checkpointing = _checkpointing(ctx, every, stop_after, resume_path,
                                   dict(params.get("identity") or {}), picked_up is not None)
    if checkpointing is not None:  # the job's earlier starts' steps: their divergence counts
        history = checkpointing.history()
        if history["after_step"]:  # the checkpoint it began after (--resume's)
            losses.checkpointed(history["after_step"])
        for step, record in enumerate(history["steps"], start=history["after_step"] + 1):
            losses.see_record(step, record)
    # a kill from here on is in a step
    ctx.progress(0.0, "the graph captured; " + ("saving its outputs" if completed
                                                  else "training"), **resumed)
    from .run import run_plan
    from .stores import host_link_store
    host = host_link_store(plan, params.get("host_pages"), params.get("host_pages_wait_s"))
    from .saved_weights import WeightsSaver
    saved = WeightsSaver(ctx.files_dir / WEIGHTS_FILE, save)
    try:
        report = run_plan(graph, plan, steps, page_dir, captured=captured,
                          check_gradients=param_flag(params.get("check_gradients", True)),
                          progress=progress, sensor=params.get("sensor", "auto"),
                          device=params.get("device", "cpu"), seed=seed,
                          data=params.get("data"), lr=lr,
                          lr_schedule=lr_schedule,
                          warmup=warmup,
                          stores=None if host is None else {"host": host},
                          allocator=str(params.get("allocator") or "glibc"),
                          on_trained=saved.save, checkpointing=checkpointing,
                          stop_on_nonfinite=stop_on_nonfinite, remedy=remedy,
                          time_nodes=time_nodes,
                          map_large_allocations=not param_flag(params.get("keep_malloc_defaults",
                                                                     False)))
    finally:
        if host is not None:
            host.close()
    report["malloc"] = malloc
    report["saved_weights"] = saved.figures
    report["saved_weights_error"] = saved.error
    ctx.write_json("run_report.json", report)
    files = ["run_report.json"] + ([WEIGHTS_FILE] if saved.figures else []) + \
        ([CHECKPOINT_FILE] if checkpointing is not None and (checkpointing.written or
                                                            checkpointing.own) else [])
    return {"malloc": malloc, "files": files, "summary": report["summary"],
            "saved_weights": saved.figures, "checkpoint": report.get("checkpoint"),
            "grad_check": report["grad_check"], "steps": len(report["steps"]),
            "stopped_at_step": report["stopped_at_step"],
            "data": report["data"], "optimizer": report["optimizer"]}


@dataclass
class RunParams:
    """The run job's params as it reads them first, before its files and torch."""
    steps: int
    plan: "Path | None"  # None where read off the board (the files are the board's)
    graph: "Path | None"
    seed: "int | None"
    lr: "float | None"
    warmup: int
    lr_schedule: str
    time_nodes: int
    init: "Path | None"
    stop_after: "int | None"
    checkpoint_every: int
    resume: "Path | None"
    malloc: str
    save: str


def run_params(read: JobParams) -> RunParams:
    """Read the run job's params; each that is wrong is refused (BadParam), on the board and
    where the job is submitted alike (registry.refuse_bad_params)."""
    from .save_choice import DEFAULT_SAVE, check_save_choice
    steps = read.integer("steps", 10, minimum=1, maximum=MAX_STEPS)  # 1e20: trained forever
    plan, graph = read.input_path("plan", "a plan file"), read.input_path("graph", "a graph file")
    seed, lr = read.integer("seed", **SEED_RANGE), read.number("lr", minimum=0)
    warmup = read.integer("warmup", 0, minimum=0)
    lr_schedule = str(read.params.get("lr_schedule") or "constant")
    refuse_bad_schedule(lr_schedule, warmup, steps)
    return RunParams(steps=steps, plan=plan, graph=graph, seed=seed, lr=lr, warmup=warmup,
                     lr_schedule=lr_schedule,
                     time_nodes=read.integer("time_nodes", 0, minimum=0),
                     init=read.input_path("init"),
                     stop_after=read.integer("stop_after", minimum=1),
                     checkpoint_every=read.integer("checkpoint_every", 0, minimum=0),
                     resume=read.input_path("resume"),
                     malloc=requested_malloc(read.params),
                     save=check_save_choice(str(read.params.get("save") or DEFAULT_SAVE)))


def refuse_bad_schedule(schedule: str, warmup: int, steps: int) -> None:
    """The learning-rate schedule's params, checked before the job captures or trains (that
    takes seconds to a minute on a board): a refusal is bad input (BadParam)."""
    from ..lr_schedule import check_schedule
    try:
        check_schedule(schedule, warmup, steps)
    except ValueError as error:
        raise BadParam(str(error)) from None


def _resume_out(params: dict, keeps_the_checkpoint: bool) -> "str | None":
    """The folder a resume from this job's checkpoints names (the host's `out`, else OUT),
    where a stop at a non-finite loss keeps the checkpoint before it (`keeps_the_checkpoint`:
    the job stops there, and checkpoints every N steps or goes on from one). Without the stop
    its newest checkpoint is of the diverged weights: None."""
    return str(params.get("out") or "OUT") if keeps_the_checkpoint else None


def _picked_up_step(ctx: JobContext, steps: int, stop_after) -> "int | None":
    """The step of the checkpoint an earlier start of this job left in its files (its daemon
    was stopped or killed mid-job and started it again): the job goes on after it, or, where
    it is the last step, saves its outputs from it. None: no such checkpoint (the job starts
    as submitted)."""
    from .checkpoint_step import checkpoint_step
    from .save_choice import CHECKPOINT_FILE
    step = checkpoint_step(ctx.files_dir / CHECKPOINT_FILE)
    return step if step is not None and 0 < step <= int(stop_after or steps) else None


def _checkpointing(ctx: JobContext, every: int, stop_after: "int | None",
                   resume_path: "Path | None", identity: dict, own: bool = False):
    """The job's checkpoints (files/checkpoint.pt) and the checkpoint it resumes from (`own`:
    its own newest, else `resume_path`); None without checkpoint_every, stop_after and
    resume. Read after the capture (torch)."""
    if not (every or stop_after or resume_path):
        return None
    from .checkpoint import Checkpointing, read_checkpoint
    from .save_choice import CHECKPOINT_FILE
    resume = read_checkpoint(ctx.files_dir / CHECKPOINT_FILE) if own else \
        read_checkpoint(resume_path) if resume_path is not None else None
    return Checkpointing(path=ctx.files_dir / CHECKPOINT_FILE, every=every,
                         identity=identity, resume=resume,
                         stop_after=stop_after, own=own)


def _check_page_dir(plan, page_dir: str) -> None:
    """A plan that pages to flash needs a page folder it can write: refused before the capture
    (tens of seconds on a board), not at the first page-out."""
    # torch-free, like everything before the capture (_capture_before_torch)
    from ..daemon.sysinfo import page_dir_status
    from ..pages.errors import PAGE_DIR_REMEDY
    if "flash" not in plan.tiers_used():
        return
    status = page_dir_status(Path(page_dir))
    if not status["ok"]:
        raise ValueError(f"the page folder cannot hold pages: {status['error']}. Remedy: "
                         f"{PAGE_DIR_REMEDY}")


def requested_malloc(params: dict) -> str:
    allocator = str(params.get("allocator") or "glibc")
    malloc = str(params.get("malloc") or ("jemalloc" if allocator == "arena" else "glibc"))
    if malloc not in MALLOCS:
        raise BadParam(f"unknown malloc {malloc!r}: use {', '.join(MALLOCS)}")
    return malloc


def start_under(malloc: str, ctx: JobContext) -> dict:
    """Start this job process again under `malloc` (a preload takes effect only when a process
    starts: exec, same pid, the job's lock taken again by the new image) where it is not
    already running under it; what the report says of it. Under jemalloc the arena executor's
    heap trims purge jemalloc's free pages, which fragment less than glibc's heap
    (docs/memory.md, "Address planning and the arena executor")."""
    running = running_malloc()
    said = {"requested": malloc, "running": running}
    if malloc == running or malloc == "glibc":
        return said
    env, library = preload_environment(malloc)
    if library is None:
        return {**said, "note": f"{missing_malloc(malloc)}: ran under {running}'s malloc"}
    if os.environ.get(RESTARTED_UNDER) == malloc or not _is_job_process(ctx):
        return {**said, "note": f"not started under {library}: ran under {running}'s malloc"}
    env[RESTARTED_UNDER] = malloc
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, sys.orig_argv, env)
    return said  # not reached


def _is_job_process(ctx: JobContext) -> bool:
    """Whether this process is the job's own (the daemon's job runner, which writes its pid into
    the job's lock), not one that called the job function (a test)."""
    try:
        return (ctx.job_dir / "running.lock").read_text().strip() == str(os.getpid())
    except OSError:
        return False


def _capture_before_torch(graph, graph_path):
    """The board's capture of the graph, traced in a child process while this one has not yet
    imported torch: on a small board the child (torch, the tracer, the model) and this
    process's torch would otherwise be resident at once. None: run_plan says what is wrong."""
    from ..capture.isolated import trace_in_child
    from .errors import ExecutorError
    if graph.planning_only or "model" not in (graph.capture.get("source") or {}):
        return None
    try:
        traced = trace_in_child(Path(graph_path).read_text(), graph.name)
    except RuntimeError as error:
        raise ExecutorError(str(error)) from error
    from .run import capture_here
    return capture_here(graph, traced)


def param_flag(value) -> bool:
    """A job's yes/no param, given as a bool or as text ("0", "false", "no", "off": no)."""
    if isinstance(value, str):
        return value.strip().lower() not in ("0", "false", "no", "off")
    return bool(value)
