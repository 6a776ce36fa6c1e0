"""What `edge-remat run` is asked for (RunOptions) and every check that can be made of it
before any work: options, the data spec, the link's kind, files the board must read."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Optional

from edge_remat_agent.capture import DEFAULT_LR, DTYPE_NAMES

from ..devices import DeviceConfig
from ..errors import UserError
from ..units import Budget

# Data a zoo model trains on when --data is not given (the rest repeat their example batch).
DEFAULT_DATA = {"digits-cnn": "digits", "tinyllama-1.1b-lora": "text",
                "tinyllama-2l-lora": "text", "llama-tiny-lora": "text"}


@dataclass
class RunOptions:
    device: str
    model: str
    budget: Optional[Budget] = None  # text is read once, here (Budget.parse)
    objective: str = "time"
    deadline: Optional[float] = None
    steps: int = 10
    data: Optional[str] = None
    memory_limit: Optional[int] = None
    plain: bool = False
    batch: Optional[int] = None
    image: Optional[int] = None
    seq: Optional[int] = None
    seed: int = 0
    optimizer: str = "sgd"
    dtype: str = "fp32"  # the model's floating dtype (capture/precision.py)
    trainable_dtype: Optional[str] = None  # the trained parameters' (None: dtype's)
    lr: Optional[float] = None
    lr_schedule: str = "constant"  # constant | linear | cosine (edge_remat_agent.lr_schedule)
    warmup: int = 0  # steps of linear warmup
    clip_grad_norm: Optional[float] = None  # the gradients' largest global 2-norm
    accumulate: int = 1  # micro-batches of --batch per optimizer step (gradient accumulation)
    max_nodes: Optional[int] = None  # None: DEFAULT_MAX_NODES, at module level only
    operator_level: bool = False  # one planner node per ATen op (`graph --operator-level`)
    params_home: str = "auto"  # ram | flash | auto (decided against the budget)
    train: Optional[list] = None  # parameter name patterns to train; None: as the model comes
    profile: Optional[str] = None
    reprofile: bool = False
    paging: Optional[str] = None
    solver: str = "auto"
    time_limit: float = 10.0
    sweep: Optional[str] = None
    out: str = "edge-remat-run"
    plots: bool = True
    check_gradients: bool = True
    keep_running: bool = False  # Ctrl-C leaves the board's job running instead of cancelling
    extra: dict = field(default_factory=dict)  # more params for the board's job
    allocator: str = "glibc"  # the executor's: glibc | arena (the plan's arena layout)
    arena: str = "best-fit"  # how the arena is laid out: best-fit | cpsat (planner/arena.py)
    arena_time_limit: float = 10.0  # seconds for the cpsat layout
    save: str = "trained"  # the trained weights fetched to OUT/weights.pt: trained | all | none
    init: Optional[str] = None  # a weights file (a run's weights.pt) the model starts from
    checkpoint_every: Optional[int] = None  # a checkpoint after every N-th step (run/resume.py)
    stop_after: Optional[int] = None  # stop after this step of --steps (its schedule kept)
    resume: Optional[str] = None  # an earlier run's --out folder, to go on from its checkpoint
    stop_on_nonfinite: bool = False  # stop after the first step whose loss is NaN or inf

    def __post_init__(self) -> None:
        if self.budget is not None:
            self.budget = Budget.parse(self.budget)

    @property
    def model_info(self) -> dict:
        info = {"model": self.model, "batch": self.batch, "image": self.image, "seq": self.seq,
                "seed": self.seed, "optimizer": self.optimizer, "train": self.train,
                # the graph has a norm node then (a profile of it has that node measured)
                **({"clip_grad_norm": self.clip_grad_norm}
                   if self.clip_grad_norm is not None else {}),
                # dtype only when not fp32: profiles cached before it existed keep their keys
                **({"dtype": self.dtype} if self.dtype != "fp32" else {}),
                # likewise, only where it makes the graph other than --dtype's
                **({"trainable_dtype": self.trainable_dtype}
                   if self.trainable_dtype not in (None, self.dtype) else {})}
        # part of the profile cache's key: an operator-level graph's nodes are other ops to
        # time (added only when set, so that the module-level profiles cached keep their key)
        return {**info, "operator_level": True} if self.operator_level else info

    @property
    def lr_params(self) -> dict:
        """The board's training jobs' learning-rate params: --lr and its schedule."""
        return {**({} if self.lr is None else {"lr": self.lr}),
                **({} if self.lr_schedule == "constant" and not self.warmup
                   else {"lr_schedule": self.lr_schedule, "warmup": self.warmup})}

    @property
    def nonfinite_params(self) -> dict:
        """The board's training jobs' param for --stop-on-nonfinite (none by default: the
        job goes on as PyTorch's would, and warns)."""
        return {"stop_on_nonfinite": True} if self.stop_on_nonfinite else {}


def run_default(name: str):
    """A RunOptions field's default: `edge-remat run` shows and uses this one value."""
    return RunOptions.__dataclass_fields__[name].default


class RunProblem(UserError):
    """Options that cannot make a run (e.g. a budget nothing is left for); exit status 2."""


def check_dtypes(dtype: str, trainable_dtype: Optional[str]) -> None:
    """--dtype and --trainable-dtype (graph's, run's), before any capture: the names, and the
    pairs precision.py keeps apart (what the model's parameters are is the capture's check)."""
    from edge_remat_agent.capture import mixed_dtype_problem
    for option, name in (("--dtype", dtype), ("--trainable-dtype", trainable_dtype)):
        if name is not None and name not in DTYPE_NAMES:
            raise RunProblem(f"unknown {option} {name!r}: use one of {', '.join(DTYPE_NAMES)}")
    if (problem := mixed_dtype_problem(dtype, trainable_dtype)) is not None:
        raise RunProblem(problem)


def check_learning_rate(opts: RunOptions) -> None:
    """--lr, --lr-schedule and --warmup (run's and deploy's)."""
    import math
    if opts.lr is not None and not (math.isfinite(opts.lr) and opts.lr > 0):
        raise RunProblem(f"--lr must be a positive number, not {opts.lr:g}")
    from edge_remat_agent.lr_schedule import check_schedule
    try:
        check_schedule(opts.lr_schedule, opts.warmup, opts.steps)
    except ValueError as error:
        raise RunProblem(str(error)) from None


def check_options(opts: RunOptions, device: DeviceConfig) -> None:
    """Every option that can be checked before the capture, the profile and the solve (each
    of which takes seconds to minutes) is checked here."""

    from ..checks import check_solver_options
    from ..planner.build import PAGING_CHOICES
    from ..sweep import parse_sweep

    if opts.optimizer not in DEFAULT_LR:
        raise RunProblem(f"unknown optimizer {opts.optimizer!r} ({' | '.join(DEFAULT_LR)})")
    check_dtypes(opts.dtype, opts.trainable_dtype)
    from edge_remat_agent.lr_schedule import steps_refusal
    if (refusal := steps_refusal(opts.steps)) is not None:
        raise RunProblem(refusal)
    from edge_remat_agent.accumulation import check_micro_batches
    try:
        check_micro_batches(opts.accumulate)
    except ValueError as error:
        raise RunProblem(str(error)) from None
    check_learning_rate(opts)
    if opts.clip_grad_norm is not None:
        checked_max_norm(opts.clip_grad_norm)
    if opts.paging is not None and opts.paging not in PAGING_CHOICES:
        raise RunProblem(f"unknown --paging {opts.paging!r}: use one of "
                         f"{', '.join(PAGING_CHOICES)}")
    check_link_pages(opts.paging, device)
    check_data(run_data(opts), device)
    check_weights_options(opts)
    check_checkpoint_options(opts)
    if opts.plain:
        if opts.operator_level:
            raise RunProblem("--operator-level shapes the graph the plan is made for, and "
                             "--plain trains without a plan: give one of them")
        return
    from ..granularity import granularity_mistake
    if (mistake := granularity_mistake(opts.operator_level, opts.max_nodes, None)):
        raise RunProblem(mistake)
    check_solver_options(opts.solver, opts.time_limit, None)
    check_arena_options(opts)
    if opts.params_home == "flash" and not flash_allowed(opts.paging):
        raise RunProblem(f"--params-home flash reads the parameters from flash every step, "
                         f"which is paging, and --paging {opts.paging} rules flash out: use "
                         f"--paging flash (or both), or --params-home ram")
    if opts.budget is None and not device.hardware.memory_limit_bytes:
        raise RunProblem("give --budget (e.g. 30% or 512MiB), or --memory-limit to derive it")
    if opts.sweep:
        parse_sweep(opts.sweep)
    if opts.profile:
        from edge_remat_agent.formats import load_profile
        if load_profile(opts.profile).plan_only:
            raise RunProblem(f"{opts.profile} is a plan-only profile (a board no agent runs "
                             "on): plan with it (`edge-remat plan --profile`), but run with the "
                             "board's own profile, measured or modelled")


def plain_ignores(opts: RunOptions) -> list[str]:
    """The options given that only a plan reads, which --plain (no plan) leaves unused (QA:
    `--plain --allocator arena` or `--paging flash` ran plain PyTorch without a word)."""
    defaults = RunOptions(device=opts.device, model=opts.model)
    return ["--" + name.replace("_", "-") for name in PLAN_ONLY_OPTIONS
            if getattr(opts, name) != getattr(defaults, name)]


# RunOptions fields only a plan reads, each its command line's --name-with-dashes
PLAN_ONLY_OPTIONS = ("budget", "deadline", "objective", "paging", "solver", "time_limit",
                     "sweep", "allocator", "arena", "arena_time_limit", "params_home",
                     "max_nodes", "profile", "reprofile")

# --arena's choices: the arena a run's executor allocates from is laid out, never "none"
RUN_ARENA_METHODS = ("best-fit", "cpsat")


def check_arena_options(opts: RunOptions) -> None:
    """--arena and --arena-time-limit: their values."""
    if opts.arena not in RUN_ARENA_METHODS:
        raise RunProblem(f"unknown --arena {opts.arena!r}: use {' | '.join(RUN_ARENA_METHODS)}")
    if not opts.arena_time_limit > 0:
        raise RunProblem(f"--arena-time-limit must be seconds above 0, not "
                         f"{opts.arena_time_limit:g}")


def arena_ignores(opts: RunOptions) -> list[str]:
    """Warnings for the arena options that the run given leaves unused, as `plan`'s (a run
    with the glibc allocator lays its plan's arena out best-fit, for the report alone)."""
    arena_typed = opts.arena != run_default("arena")
    limit_typed = opts.arena_time_limit != run_default("arena_time_limit")
    if opts.plain or not (arena_typed or limit_typed):
        return []
    if opts.allocator != "arena":
        return ["--arena and --arena-time-limit lay out the arena that --allocator arena runs "
                "in, and this run allocates with glibc: ignored (add --allocator arena)"]
    if limit_typed and opts.arena != "cpsat":
        return [f"--arena-time-limit is unused: it limits --arena cpsat's layout, and --arena "
                f"{opts.arena} solves none"]
    return []


def checked_max_norm(max_norm: float) -> float:
    """--clip-grad-norm's value, or one line saying what it must be (exit status 2)."""
    from edge_remat_agent.grad_clip import check_max_norm
    try:
        return check_max_norm(max_norm)
    except ValueError as error:
        raise RunProblem(str(error)) from None


def check_weights_options(opts: RunOptions) -> None:
    """--save and --init, before the capture (the file's names and shapes are checked against
    the model once it is built: check_init_fits)."""
    from edge_remat_agent.executor.save_choice import SAVE_CHOICES
    if opts.save not in SAVE_CHOICES:
        raise RunProblem(f"unknown --save {opts.save!r}: use {' | '.join(SAVE_CHOICES)}")
    if opts.plain and opts.init:
        raise RunProblem("--init applies to the planned run; leave it out with --plain")
    if opts.init and os.path.isdir(opts.init):  # QA: a folder was "no such file"
        inside = os.path.join(opts.init, "weights.pt")
        raise RunProblem(f"--init {opts.init} is a folder: give the weights file a run saved in "
                         "its --out, " + (inside if os.path.isfile(inside) else "OUT/weights.pt"))
    if opts.init and not os.path.isfile(opts.init):
        raise RunProblem(f"--init {opts.init}: no such file (give a weights file a run saved, "
                         "OUT/weights.pt)")


def check_checkpoint_options(opts: RunOptions) -> None:
    """--checkpoint-every, --stop-after and --resume, before the capture (the checkpoint
    itself is read once the board is reached: run/resume.py)."""
    if opts.checkpoint_every is not None and opts.checkpoint_every < 1:
        raise RunProblem(f"--checkpoint-every must be at least 1 step, not "
                         f"{opts.checkpoint_every}")
    if opts.stop_after is not None and opts.steps < 2:
        raise RunProblem(f"--stop-after {opts.stop_after}: a run of --steps {opts.steps} has no "
                         "step to stop after before its last; give --steps of 2 or more")
    if opts.stop_after is not None and not 1 <= opts.stop_after < opts.steps:
        raise RunProblem(f"--stop-after {opts.stop_after}: give a step before --steps "
                         f"{opts.steps} (1 to {opts.steps - 1}); the run stops there with a "
                         "checkpoint, and --resume goes on")
    if opts.plain and (opts.checkpoint_every or opts.stop_after or opts.resume):
        raise RunProblem("--checkpoint-every, --stop-after and --resume apply to the planned "
                         "run; leave them out with --plain")
    if not opts.resume:
        return
    from .resume import RECORD
    from edge_remat_agent.executor.save_choice import CHECKPOINT_FILE
    folder = opts.resume
    if not os.path.isdir(folder):
        raise RunProblem(f"--resume {folder}: no such folder (give the --out folder of a run "
                         "made with --checkpoint-every)")
    if not any(os.path.isfile(os.path.join(folder, name)) for name in (RECORD, CHECKPOINT_FILE)):
        raise RunProblem(f"--resume {folder}: no checkpoint there (neither {RECORD} nor "
                         f"{CHECKPOINT_FILE}): the run in it was made without "
                         "--checkpoint-every, or they were removed; run again with "
                         "--checkpoint-every")
    if opts.out != run_default("out") and \
            os.path.realpath(opts.out) != os.path.realpath(folder):
        raise RunProblem(f"--resume {folder} writes into that folder, and --out gives "
                         f"{opts.out}: leave out --out")


def check_init_fits(opts: RunOptions, module) -> None:
    """Load --init into this host's capture of the model (the host's gradient check trains
    it): a file of another model is refused, naming its first mismatch, before the profile
    and the plan."""
    if not opts.init:
        return
    from edge_remat_agent.executor.errors import BadInput
    from edge_remat_agent.executor.saved_weights import load_weights
    try:
        load_weights(module, opts.init)
    except BadInput as error:
        raise RunProblem(str(error)) from None


def check_init_against_graph(init: Optional[str], graph) -> None:
    """deploy --init, before anything is sent: the file's names, shapes and dtypes against the
    model the graph recorded (capture["state_dict"]), refused naming the first mismatch as
    the board would refuse it after shipping. A graph captured before it recorded them is
    left to the board's check."""
    record = graph.capture.get("state_dict")
    if not init or not record:
        return
    from edge_remat_agent.executor.errors import BadInput
    from edge_remat_agent.executor.saved_weights import (check_tensors, read_weights_file,
                                                         recorded_targets)
    try:
        check_tensors(recorded_targets(record), read_weights_file(init), f"--init {init}")
    except BadInput as error:
        raise RunProblem(str(error)) from None


def check_link_pages(paging: Optional[str], device: DeviceConfig) -> None:
    """Host pages travel over the board's link, which a serial link cannot carry (it holds
    the agent's frames only; transport/host_pages.py): refused before the capture and the
    plan, from the device config, rather than at the run job after them."""
    from ..planner.build import PAGING_CHOICES
    if "host" in PAGING_CHOICES.get(paging or "none", ()) and \
            device.connection.kind == "serial":
        raise RunProblem(f"--paging {paging} pages to this host over the board's link, and "
                         f"{device.name} is reached over serial, which cannot carry pages: "
                         "use --paging flash (or none), or reach the board over SSH")


def run_data(opts: RunOptions) -> str:
    """The data spec the run trains on: --data, else the model's default."""
    return opts.data or DEFAULT_DATA.get(opts.model, "example")


def check_data(spec: str, device: DeviceConfig) -> None:
    """A data spec the board cannot read is refused here, not after the capture, the profile
    and the plan: the agent's own table of data names, and data this host reads as the board
    does (a file, or a module: QA, `--data nomod:fn` failed on the board after all of them;
    over SSH, `--data mine.py:nofn` and `--data mymod:fn` of this folder did)."""
    from edge_remat_agent.data import DataError, check_data_spec, load_data_function
    try:
        check_data_spec(spec)
        if _data_read_here(spec, device):
            load_data_function(spec)  # imported, not called: the module and the function exist
    except DataError as exc:
        raise RunProblem(str(exc)) from None


def check_data_fits(spec: str, example_args: tuple, model=None,
                    device: Optional[DeviceConfig] = None) -> None:
    """Bundled data that cannot feed the model (digits for a 3x32x32 model, text for images)
    is refused once the capture has the model's example arguments, before the profile and the
    plan, rather than on the board after them; a MODULE:FUNCTION too where the board reads
    this host's code (QA: one that gave 1 argument for a model of 2 failed on the board, after
    the profile and the plan). On a board with a disk of its own (SSH, serial) the function
    may read data only that board has: its own error here is left to the board, whose job
    refuses it as bad input in the same words; a batch that cannot feed the model is refused."""
    from edge_remat_agent.data import DataError, DataFunctionFailed
    from edge_remat_agent.data import check_data_fits as first_batch_fits
    here = device is not None and _data_read_here(spec, device)
    try:
        first_batch_fits(spec, example_args, model=model, user_data=here)
    except DataError as error:
        if isinstance(error, DataFunctionFailed) and not shares_files(device):
            return  # the board draws its own first batch, and says so if it fails
        raise RunProblem(f"--data {spec} cannot feed this model: {error}") from None


def _data_read_here(spec: str, device: DeviceConfig) -> bool:
    """Whether `spec` is the user's data (MODULE:FUNCTION) that this host reads as the board
    does: any on a board that shares this host's files; on any other, one whose file is here
    (a file, or a module of the current folder: for_board names it by its file), which is
    pushed with the job, the board running this host's copy (transport/pushed_files.py). A
    module installed elsewhere, or a path only the board has, is the board's to check."""
    from edge_remat_agent.data import NAMED_DATA
    from edge_remat_agent.user_code import module_file_spec, spec_file
    if spec in NAMED_DATA:
        return False
    if shares_files(device):
        return True
    path = spec_file(module_file_spec(spec))
    return path is not None and os.path.isfile(path)


def shares_files(device: Optional[DeviceConfig]) -> bool:
    """A local board (emulated ones included) reads this host's files; others have their own."""
    return device is not None and device.connection.kind == "local"


def flash_allowed(paging: Optional[str]) -> bool:
    """Whether --paging lets anything live on flash (by default the profile's tiers decide)."""
    from ..planner.build import PAGING_CHOICES
    return paging is None or "flash" in PAGING_CHOICES.get(paging, ())


def paging_with_flash(paging: Optional[str]) -> str:
    """The --paging choice that adds flash to `paging`'s tiers (none -> flash, host -> both)."""
    from ..planner.build import PAGING_CHOICES
    tiers = {"flash", *PAGING_CHOICES.get(paging or "none", ())}
    return next(name for name, chosen in PAGING_CHOICES.items() if set(chosen) == tiers)


def for_board(opts: RunOptions, device: DeviceConfig) -> RunOptions:
    """The options with the user's files (a MODULE:FACTORY model, a MODULE:FUNCTION data
    module) named by absolute paths, a module of this folder by its file: a local board reads
    them in another working directory, and any other gets them with the job (pushed_files.py)
    and reads its copy of each (QA: `--model mymod:make` of this folder failed on a local
    board after the capture and the plan; `--data mymod:fn` over SSH likewise)."""
    model = absolute_file_spec(opts.model, "--model", device)
    data = absolute_file_spec(run_data(opts), "--data", device)
    return dataclasses.replace(opts, model=model, data=data)


def absolute_file_spec(spec: str, option: str, device: DeviceConfig) -> str:
    """`dir/mine.py:NAME` -> `/cwd/dir/mine.py:NAME`, `mymod:NAME` of the current folder ->
    `/cwd/mymod.py:NAME`, for any board: one that shares this host's files reads them in
    another folder, and one that does not gets the file with the job and reads that copy where
    the path is not on its disk (transport/pushed_files.py; QA: a relative file was refused
    for an SSH board after the files came to be pushed). An hf: spec's config, adapter and
    checkpoint paths are made absolute as the capture makes them: `--plain` sends the spec to
    the board without a capture, which then read `config=small.json` in its own folder.
    `option` and `device` are kept for the callers: every board gets the same spec."""
    # the agent's rules for what names a file, and for making it absolute
    from edge_remat_agent.capture.hf_spec import canonical_spec
    return canonical_spec(spec)
