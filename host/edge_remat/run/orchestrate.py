"""`edge-remat run`: capture, profile (or reuse), plan, deploy, train, report, in one go.

    report = run(RunOptions(device="local", model="digits-cnn", budget=Budget.parse("30%"),
                            steps=10))

A planned run sends the plan and the graph to the board's "run" job (the executor); `plain=True`
sends the model to the "train-plain" job instead, for comparison. On an emulated board (a
memory cgroup: `memory_limit`, or a device config with `memory_limit_bytes`) the kernel's peak
reading and its out-of-memory kills are read from the cgroup, and the gradient check runs on the
host, outside the limit: comparing with eager PyTorch needs the plain schedule's memory, which
the board by design does not have.
"""

from __future__ import annotations

import contextlib
import dataclasses

import math
import tempfile
from pathlib import Path
from typing import Callable, Optional

from edge_remat_agent.cgroup_memory import ram_total_bytes
from edge_remat_agent.daemon.worker import OOM_RAN
from edge_remat_agent.formats import Profile
from edge_remat_agent.formats.fields import dump_json, dump_text
from edge_remat_agent.units import counted

from ..devices import DeviceConfig
from ..errors import EXIT_BAD_INPUT, Interrupted, classify, killed_by_memory
from ..outputs import file_stamp, kept_note, written_since
from ..remote import full_result
from ..transport import Board, JobFailed, JobOutOfReach
from ..transport.errors import cancelled_by_host
from ..units import Budget, budget_against_plain, fmt_bytes
from .job_end import ENDED_WELL, ended_well_status
from .out_files import draw_plots, trained_weights_into
from .options import (RunOptions, RunProblem, arena_ignores, check_data_fits, check_init_fits,
                      check_options, flash_allowed, for_board, paging_with_flash, plain_ignores,
                      run_data)
from .profiles import ChosenProfile, choose_profile, forget_if_far_off

# With a memory limit and no --budget, the plan gets what is left after the runtime's own memory
# (interpreter + torch, from the profile) and this headroom: the agent daemon and its relay, the
# executor's re-capture of the graph, and allocator slack, none of which the plan models.
RUNTIME_HEADROOM_BYTES = 160 * 2**20
DEFAULT_RUNTIME_BYTES = 300 * 2**20

Say = Callable[[str], None]


def run(opts: RunOptions, say: Say = lambda message: None) -> dict:
    """Do the whole run; returns the report (also written to OUT/report.json). Ctrl-C cancels
    the board's job (unless opts.keep_running), writes OUT/report.json saying so and raises
    errors.Interrupted."""
    from ..transport.emulated import find_board
    from ..outputs import output_folder

    device = find_board(opts.device, opts.memory_limit)
    check_options(opts, device)
    if opts.memory_limit and (ram := ram_total_bytes()) and opts.memory_limit > ram:
        # QA: 1 TiB on a 24 GiB machine ran as if unlimited, and its report's figures read
        # as a board's
        say(f"warning: --memory-limit {fmt_bytes(opts.memory_limit)} is more than this "
            f"machine's {fmt_bytes(ram)} of RAM: the limit never binds, so the run is not "
            "that board's")
    if opts.plain and (ignored := plain_ignores(opts)):
        say(f"warning: {', '.join(ignored)} shape{'s' if len(ignored) == 1 else ''} the plan, "
            "and --plain trains without one: ignored")
    for line in arena_ignores(opts):
        say(f"warning: {line}")
    opts = for_board(opts, device)
    if opts.resume:  # the resumed run's outputs go where the earlier run's are
        opts = dataclasses.replace(opts, out=opts.resume)
    from edge_remat_agent.executor.save_choice import CHECKPOINT_FILE, WEIGHTS_FILE
    from edge_remat_agent.user_code import spec_file
    out = output_folder(opts.out, inputs={"--profile": opts.profile,
                                          "--model": spec_file(opts.model),
                                          "--data": spec_file(opts.data or ""),
                                          "--init": opts.init},
                        writes=RUN_OUTPUTS + (WEIGHTS_FILE, CHECKPOINT_FILE))
    at_start = _output_stamps(out)
    earlier_run = holds_a_run_report(out)
    data = opts.data
    # Both jobs train with the optimizer the graph was captured for (SGD: lr 0.01, momentum
    # 0.9); --lr overrides it for both, and --lr-schedule / --warmup schedule it for both.
    lr = opts.lr_params
    # what the host knows of the report it would write once the job is sent (come_back.py
    # completes it from the job's end, where a run that stopped first left the job running)
    known: dict = {}
    with Board(device, on_event=say, keep_running=opts.keep_running) as board:
        try:
            if opts.plain:
                report = _run_plain(board, device, opts, data, lr, out, say, known)
            else:
                report = _run_planned(board, device, opts, data, lr, out, say, known)
        except (KeyboardInterrupt, Interrupted) as exc:
            raise _interrupted(exc, opts, out, board.last_job, known) from None
        except JobOutOfReach as exc:
            raise _link_lost(exc, opts, out, known) from None
        except Exception as exc:
            if isinstance(exc, JobFailed) and cancelled_by_host(exc.record or {}):
                raise _cancelled(exc, opts, out) from None
            # an infeasible budget, say, writes nothing; what this machine's disk or
            # permissions refused leaves the graph and plan written (QA: a full disk removed
            # them, the trained weights still on the board)
            if classify(exc)[0] == EXIT_BAD_INPUT and not isinstance(exc, OSError):
                _remove_outputs_since(out, at_start)
            raise
        finally:
            from ..transport.emulated import retire_emulated
            retire_emulated(board, say)
    report["reconnects"] = board.reconnects
    report["report"] = str(out / "report.json")
    dump_json(report, out / "report.json")
    from ..reports.run_report import report_text
    dump_text(report_text(report) + "\n", out / "report.txt")  # atomic; a failure names it
    _remove_earlier_outputs(out, at_start, earlier_run, say, resumed=bool(opts.resume))
    return report


# What a run writes into OUT: all of it that an earlier run left there and this one did not
# write again (plots with --no-plots, a sweep without --sweep) would show the other run.
RUN_OUTPUTS = ("graph.json", "plan.json", "report.json", "report.txt", "schedule.png",
               "memory.png", "sweep.json", "sweep.png")
# The trained weights (--save, OUT/weights.pt) are not among them: not removed when a run does
# not write them again (--save none, a killed run), since they are what an earlier run trained;
# nor its checkpoint, nor a PEFT adapter. Those left are said (QA: a run with --save none said
# it removed the earlier plots, and its report's weights were null beside the earlier
# weights.pt): _kept_outputs names them.


def holds_a_run_report(out: Path) -> bool:
    """Whether `out` holds an earlier run's report.json (one of ours, not a file of that name)."""
    from edge_remat_agent.formats.fields import load_json
    try:
        report = load_json(out / "report.json")
    except (OSError, ValueError):
        return False
    return isinstance(report, dict) and {"status", "model", "device"} <= report.keys()


def _output_stamps(out: Path) -> dict:
    """What each path a run may write in `out` is as it starts: (mtime_ns, inode, size), which
    tells this run's writes from an earlier run's. Times alone could not: a file an earlier
    run wrote in the two seconds before this one (a filesystem may keep times to the second,
    or two) was taken for this run's, and removed with its bad input (a script's `run` then
    `run --resume` of the finished run: the first one's report.txt went)."""
    fetched = out / "profile"
    paths = [out / name for name in RUN_OUTPUTS + _kept_outputs()]
    paths += [fetched, *fetched.iterdir()] if fetched.is_dir() else []
    return {path: stamp for path in paths if (stamp := file_stamp(path)) is not None}


def _remove_earlier_outputs(out: Path, at_start: dict, earlier_run: bool, say: Say,
                            resumed: bool = False) -> None:
    """Once this run has written its report: removes the outputs an earlier run left in
    `out` that this run did not replace (only files of RUN_OUTPUTS' names, as they were at
    the start: `at_start`, _output_stamps'), where `out` held an earlier run's report when
    this run started. A folder that held none is not a run's: files of those names there
    are the user's (QA: someone's sweep.json and memory.png were removed). What an earlier
    run trained is kept, and said but where this run resumed it (its checkpoint is this
    run's own)."""
    if not earlier_run:
        return
    stale = [out / name for name in RUN_OUTPUTS
             if (out / name).is_file() and not written_since(out / name, at_start)]
    # the profile an earlier run measured, where this one took the cached one (QA: a stale
    # profile/profile.json beside this run's report, said nowhere)
    fetched = out / "profile"
    stale += [path for path in (fetched.iterdir() if fetched.is_dir() else ())
              if path.is_file() and path in at_start and not written_since(path, at_start)]
    for path in stale:
        path.unlink()
    with contextlib.suppress(OSError):  # emptied: gone too (not where it holds anything)
        if stale and fetched.is_dir() and not any(fetched.iterdir()):
            fetched.rmdir()
    if stale:
        say(f"removed {', '.join(str(p.relative_to(out)) for p in stale)} from {out}: an "
            "earlier run's, which this run did not write again")
    kept = [name for name in _kept_outputs()
            if not resumed and (out / name).exists() and not written_since(out / name,
                                                                            at_start)]
    if kept:
        say(kept_note(kept, out, "run"))


def _kept_outputs() -> tuple[str, ...]:
    """The files (and the adapter's folder) an earlier run trained, which a run keeps."""
    from edge_remat_agent.executor.save_choice import CHECKPOINT_FILE, WEIGHTS_FILE

    from .peft_adapter import ADAPTER_FOLDER
    from .resume import RECORD
    return (WEIGHTS_FILE, CHECKPOINT_FILE, RECORD, ADAPTER_FOLDER)


def _remove_outputs_since(out: Path, at_start: dict) -> None:
    """The outputs this run wrote (graph.json before a budget turned out infeasible, say), so
    that bad input leaves no files, as every command's exit status 2 promises; `at_start`:
    _output_stamps' as the run started."""
    for name in RUN_OUTPUTS:
        path = out / name
        if path.is_file() and written_since(path, at_start):
            path.unlink()
    # the board's profile fetched before planning refused the budget (QA): the profile cache
    # keeps it, so the next run does not measure it again
    fetched = out / "profile"
    if fetched.is_dir():
        for path in fetched.iterdir():
            if path.is_file() and written_since(path, at_start):
                path.unlink()
        if fetched not in at_start:
            with contextlib.suppress(OSError):  # what is left there is not this run's
                fetched.rmdir()


def _interrupted(exc: BaseException, opts: RunOptions, out: Path,
                 last_job: "str | None", known: Optional[dict] = None) -> Interrupted:
    """Ctrl-C: OUT/report.json says so and lists what was written before it. A bare
    KeyboardInterrupt came while no job ran on the board (waiting on one answers with an
    Interrupted that says what became of it): before the first, or after `last_job` ended."""
    from ..planner.interrupt import stopped_by
    when = f"while no job ran on the board (after job {last_job} had ended)" if last_job \
        else "before any job ran on the board"
    stopped = exc if isinstance(exc, Interrupted) else \
        Interrupted(f"interrupted ({stopped_by()}) {when}")
    where = _report_stopped("interrupted", str(stopped), stopped.extra, opts, out, known)
    return Interrupted(str(stopped) + where, **stopped.extra)


def _cancelled(exc: JobFailed, opts: RunOptions, out: Path) -> JobFailed:
    """The job cancelled from elsewhere (`job-cancel`, another terminal): OUT/report.json says
    so, as a Ctrl-C's does (QA: none was written; the steps' losses were lost), with the
    job's last step."""
    from ..transport.board import last_step
    record = exc.record or {}
    where = _report_stopped("cancelled", str(exc), {"job": record.get("id"),
                                                    **last_step(record)}, opts, out)
    return JobFailed(str(exc) + where, record)


def _link_lost(exc: JobOutOfReach, opts: RunOptions, out: Path,
               known: Optional[dict] = None) -> JobOutOfReach:
    """Reconnecting gave up while the job ran: OUT/report.json says so and names the job,
    which may go on on the board."""
    where = _report_stopped("link_lost", str(exc), {"job": exc.job}, opts, out, known)
    return JobOutOfReach(str(exc) + where, job=exc.job)


def _report_stopped(status: str, message: str, extra: dict, opts: RunOptions,
                    out: Path, known: Optional[dict] = None) -> str:
    """OUT/report.json for a run that stopped before its report: why, and what was written
    before it, and (`come_back`) what the host knew of the report it would have written once
    its job was sent, from which the way back (come_back.py) completes it where the job went
    on. Returns the words for the error line that say where it is."""
    # and the profile the run fetched into OUT/profile (QA: left out of the list)
    profile = out / "profile"
    written = sorted(str(p) for p in out.iterdir() if p.is_file() and p.name != "report.json")
    written += sorted(str(p) for p in (profile.iterdir() if profile.is_dir() else ())
                      if p.is_file())
    report = {"status": status, "message": message, "model": opts.model,
              "device": opts.device, "written": written, **extra,
              **({"come_back": known} if known else {})}
    try:
        dump_json(report, out / "report.json")
    except OSError:
        return ""
    # (QA: "(2 files before it)" read as a riddle: which files, written when)
    names = ", ".join(str(Path(p).relative_to(out)) for p in written)
    return f"; wrote {out / 'report.json'}" + (
        f", beside what the run wrote before it stopped: {names}" if written else "")


# -- the two kinds of run ------------------------------------------------------------------

def _run_plain(board: Board, device: DeviceConfig, opts: RunOptions, data: str, lr: dict,
               out: Path, say: Say, known: Optional[dict] = None) -> dict:
    from ..remote import require_kind
    from ..reports.run_report import build_report
    require_kind(board, "train-plain", "train plainly")
    params = {k: v for k, v in opts.model_info.items() if v is not None}
    params.update(steps=opts.steps, data=data, save=opts.save, **lr, **opts.nonfinite_params)
    if opts.accumulate > 1:  # the same micro-batches and steps as a planned run's
        params["accumulate"] = opts.accumulate
    params.update(opts.extra)  # the board job's extra params (--malloc), as a planned run's
    say(f"{board.name}: plain PyTorch training of {opts.model}, {counted(opts.steps, 'step')}")
    if device.hardware.torch_device != "cpu":  # the plain job has no device path yet
        say(f"warning: plain training runs on {board.name}'s CPU, not its "
            f"{device.hardware.torch_device} device (torch_device): a planned run there uses "
            "the device, so their times and memory do not compare")
    report_args = dict(mode="plain", device=device.name, model=opts.model, steps=opts.steps,
                       data=data, memory_limit_bytes=device.hardware.memory_limit_bytes)
    if known is not None:  # build_report's, and the optimizer's words
        known.update(report_args,
                     schedule={"lr_schedule": opts.lr_schedule, "warmup": opts.warmup,
                               "clip_grad_norm": opts.clip_grad_norm, "update": "step"})
    outcome = _train(board, device, "train-plain", params, None, out, opts.steps, say)
    report = build_report(**with_run_limit(report_args, outcome.pop("board_limit_bytes", None)),
                          **outcome)
    if isinstance(report.get("optimizer"), dict):
        # the schedule and the clipping it stepped with, as a planned run's report says them
        # (QA: a plain run's left them out, though it applied them)
        report["optimizer"].update(lr_schedule=opts.lr_schedule, warmup=opts.warmup,
                                   clip_grad_norm=opts.clip_grad_norm, update="step")
    # its trained weights, as a planned run's: the two compare file to file (QA: none kept)
    report["weights"] = trained_weights_into(out, outcome)
    if (outcome.get("result") or {}).get("saved_weights_error"):
        say(f"warning: {outcome['result']['saved_weights_error']}")
    _say_malloc(report, say)
    return report


def _say_malloc(report: dict, say: Say) -> None:
    from ..reports.run_report import malloc_warning
    malloc = malloc_warning(report)
    if malloc:
        say(f"warning: {malloc}")


def _run_planned(board: Board, device: DeviceConfig, opts: RunOptions, data: str, lr: dict,
                 out: Path, say: Say, known: Optional[dict] = None) -> dict:
    from edge_remat_agent.capture import DEFAULT_MAX_NODES, capture_model

    from ..planner.build import plain_peak_bytes
    from ..planner.problem import InfeasibleBudget
    from ..remote import require_kind
    from ..reports.run_report import build_report

    def capture(home: str):
        max_nodes = DEFAULT_MAX_NODES if opts.max_nodes is None else opts.max_nodes
        captured = capture_model(opts.model, opts.batch, opts.image, opts.seq, opts.seed,
                                 opts.optimizer, max_nodes, None, "fused", home, opts.train,
                                 operator_level=opts.operator_level,
                                 clip_grad_norm=opts.clip_grad_norm,
                                 accumulate=opts.accumulate, dtype=opts.dtype,
                                 trainable_dtype=opts.trainable_dtype)
        check_init_fits(opts, captured.module)  # the host's gradient check starts from it too
        return captured

    from .handed import HandedCapture
    from .resume import (checkpoint_every, checkpoint_params, job_resume, keep_checkpoint,
                         note_job, start_resume, warn_of_earlier_checkpoint, with_resume_hint)
    # before the capture, the profile and the plan: a bad checkpoint is refused now
    resumed = start_resume(board, opts, out, say) if opts.resume else None
    say(f"capturing {opts.model}'s training step")
    captured = capture("ram" if opts.params_home == "auto" else opts.params_home)
    from edge_remat_agent.capture.advice import capture_warnings
    for line in capture_warnings(captured):
        say(f"warning: {line}")
    check_data_fits(run_data(opts), captured.example_args, captured.module, device)
    graph = captured.graph
    # The board is reached before anything is written into OUT: one that cannot be reached
    # ran nothing, and OUT stays as the run found it (QA: an SSH board on a closed port left
    # OUT/graph.json behind, or an earlier run's replaced; the board was first reached by
    # the profile, or after planning where the profile was given or cached)
    board.hello()
    graph_path = out / "graph.json"
    graph.save(graph_path)
    if device.hardware.memory_limit_bytes:
        from ..transport.emulated import unlimited_twin

        def twin() -> Board:
            return Board(unlimited_twin(device), on_event=say)
    else:
        twin = None

    def profile_for_flash() -> ChosenProfile:
        """The profile of the flash graph at graph_path: the board's job times it with its
        parameters in RAM, its nodes grouped as for flash (capture.recapture_in_ram). Before,
        timed as captured for RAM, resnet18 b8 matched 20 of the flash graph's 46 compute
        nodes and none of its updates, and the plan missed most of the first step's
        warm-up. Cached apart: the same model grouped for flash has other nodes to time."""
        return choose_profile(board, device, {**opts.model_info, "grouped_for": "flash"},
                              graph_path, out, opts.profile, opts.reprofile, twin, say,
                              HandedCapture(captured, graph_path))

    flash_homed = opts.params_home == "flash"
    if flash_homed:
        chosen = profile_for_flash()
        if chosen.how in ("measured", "cached"):
            chosen = _measured_for_another_graph(chosen, graph, say)
    else:
        chosen = choose_profile(board, device, opts.model_info, graph_path, out, opts.profile,
                                opts.reprofile, twin, say, HandedCapture(captured, graph_path))
    say(f"profile: {chosen.describe()}")
    if chosen.how == "given":
        from ..checks import note_profile_fit
        note_profile_fit(chosen.profile, graph, str(chosen.path), say)
    # With the profile's measured workspaces (kernel scratch included), as the planner sees it.
    plain_peak = plain_peak_bytes(graph, chosen.profile)
    # Homing parameters on flash is paging: not where --paging rules flash out (the budget
    # then meets the planner's usual refusal, which names the floor).
    if opts.params_home == "auto" and flash_allowed(opts.paging) and \
            _below_floor(graph, chosen, opts, device, plain_peak):
        no_room = _no_room_words(opts, device, chosen)
        # a limit that leaves no budget at all is refused whatever the graph; the flash graph,
        # whose floor is the lowest, names the limit to give (QA: "the budget is below what
        # parameters in RAM allow" for a --memory-limit 300MiB that left nothing to budget)
        say(f"{no_room}: capturing again with parameters and optimizer state homed on flash "
            "(their lowest floor) to name the memory limit to give" if no_room else
            "the budget is below what parameters in RAM allow: capturing again with "
            "parameters and optimizer state homed on flash (--params-home flash)")
        captured = capture("flash")
        graph = captured.graph
        graph.save(graph_path)
        if _no_room_under_limit(opts, device, chosen) or \
                _below_any_profiles_floor(graph, chosen, opts, device, plain_peak):
            # no budget at all, whatever the graph, or none this graph meets whatever its
            # profile measures: the planning below refuses, naming the floor or the limit
            # (QA: after a second profile, 74 s in all for mlp under 100 MiB, where the first
            # profile's runtime says it; 61 s for mlp at --budget 1%, 30 of them the second)
            chosen = dataclasses.replace(chosen, cached_at=None)
        else:
            if chosen.how in ("measured", "cached"):  # the graph's own nodes timed (or cached)
                chosen = profile_for_flash()
                say(f"profile: {chosen.describe()}")
            chosen = _measured_for_another_graph(chosen, graph, say)
    try:
        plan_dict, plan_path = _plan(graph, chosen, opts, device, plain_peak, out, say)
    except InfeasibleBudget as error:
        error = _with_flash_hint(error, capture, chosen, opts, device, plain_peak, say)
        raise _with_limit_hint(error, opts, device, chosen) from None
    from ..checks import note_share_fallback
    note_share_fallback(chosen.profile, plan_dict, f"the profile of {device.name}", say)
    _note_budget_past_limit(plan_dict["budget_bytes"], opts, device, chosen, say,
                            plan_dict["predicted"].get("peak_bytes"))
    require_kind(board, "run", "execute plans")
    limited = bool(device.hardware.memory_limit_bytes)
    # The board checks the plan's gradients against a plain eager step, which a board without
    # room for one cannot take (killed by the OOM killer after training): the host checks them
    from ..profile_fit import plain_step_out_of_reach
    no_room = (not limited and opts.check_gradients and
               plain_step_out_of_reach(board, graph) is not None)
    check_on_host = limited or no_room
    # The board builds the batches from `data` with `seed` and the optimizer with `lr` the way
    # plain training does (edge_remat_agent.data, capture.optimizer.torch_optimizer), and checks
    # `optimizer` against the one the graph was captured for; its report names the data.
    params = {"steps": opts.steps, "data": data, "seed": opts.seed, **lr,
              "optimizer": opts.optimizer,
              "check_gradients": opts.check_gradients and not check_on_host,
              "allocator": opts.allocator, "save": opts.save, **opts.nonfinite_params,
              **opts.extra}
    from ..page_folder import page_dir_params
    params.update(page_dir_params(device))
    every = checkpoint_every(opts)
    params.update(checkpoint_params(opts, every, out=out))
    resume_params, resume_inputs = job_resume(out, resumed)
    params.update(resume_params)
    from ..transport.board import new_job_id
    from ..transport.host_pages import host_pages, plan_uses_host
    job_id = new_job_id("run")
    if "identity" in params:  # written before the job: a host that dies still finds it
        if not opts.resume:
            warn_of_earlier_checkpoint(board, out, say)
        note_job(out, job_id, device.name, every, bool(opts.resume))
    first = resumed["steps_done"] if resumed else 0
    to_run = (opts.stop_after or opts.steps) - first
    from .timed_in_run import keep_run_times, steps_to_time
    if time_nodes := steps_to_time(chosen, to_run):  # a profile without them: time them now
        params["time_nodes"] = time_nodes
    report_args = dict(mode="planned", device=device.name, model=opts.model, steps=opts.steps,
                       data=data, memory_limit_bytes=device.hardware.memory_limit_bytes,
                       plain_peak_bytes=plain_peak, profile=chosen.summary(),
                       paths={"graph": str(graph_path), "plan": str(plan_path)},
                       micro_batches=opts.accumulate)
    if known is not None:  # build_report's: the plan is OUT/plan.json
        known.update(report_args, plan_file=str(plan_path),
                     resumed_after_step=resumed["steps_done"] if resumed else None,
                     plots=opts.plots,
                     host_grad_check=bool(check_on_host and opts.check_gradients))
    with host_pages(board, plan_uses_host(plan_dict), say) as page_params:
        say(f"{board.name}: running the plan for {counted(to_run, 'step')}"
            + (f" (steps {first + 1} to {first + to_run} of {opts.steps})"
               if to_run != opts.steps else ""))
        inputs = {"plan": plan_path, "graph": graph_path,
                  **({"init": opts.init} if opts.init else {}), **resume_inputs}
        try:
            with HandedCapture(captured, graph_path).to(board) as (handed_params, handed):
                outcome = _train(board, device, "run", {**params, **page_params,
                                                        **handed_params},
                                 {**inputs, **handed}, out, first + to_run, say, job_id)
        except (JobFailed, Interrupted) as failed:
            raise with_resume_hint(failed, board, out, job_id) if "identity" in params \
                else failed
    if opts.stop_after and opts.stop_after < opts.steps and outcome["status"] == "finished":
        # QA: "finished 3 steps", with no word of the 3 left or the way on
        outcome["message"] += (f"; stopped there by --stop-after {opts.stop_after} of --steps "
                               f"{opts.steps}: the same command with --resume {out}, "
                               "without --stop-after or with a later step, goes on")
    if check_on_host and opts.check_gradients and outcome["status"] in ENDED_WELL:
        outcome["grad_check"] = host_gradient_check(graph, plan_path, say, captured,
                                                    board.name if no_room else None)
    _planned_split_with(chosen.profile, outcome, graph, plan_dict)
    # the step the job's report goes on from (--resume's); a job its board's daemon restarted
    # reports every step of the job, from its first start on (its report's job_starts)
    picked_up = ((outcome.get("result") or {}).get("checkpoint") or {}).get("resumed_from_step")
    report = build_report(**with_run_limit(report_args, outcome.pop("board_limit_bytes", None)),
                          plan=plan_dict,
                          resumed_after_step=(picked_up or resumed["steps_done"])
                          if resumed or picked_up else None, **outcome)
    report["weights"] = trained_weights_into(out, outcome)
    if "identity" in params:
        report["checkpoint"] = keep_checkpoint(board, out, outcome, job_id)
        if report["checkpoint"] and outcome["status"] == "killed":
            say(f"the checkpoint before the kill is in {report['checkpoint']['file']}: the "
                f"same command with --resume {out} goes on from it")
        elif report["checkpoint"] and outcome["status"] == "stopped":
            say(f"the last checkpoint before the loss stopped being finite (after step "
                f"{report['checkpoint']['step']}) is in {report['checkpoint']['file']}")
    if (outcome.get("result") or {}).get("saved_weights_error"):
        say(f"warning: {outcome['result']['saved_weights_error']}")
    if report["weights"]:
        from .peft_adapter import write_peft_adapter
        report["weights"]["peft_adapter"] = write_peft_adapter(
            captured.module, report["weights"]["file"], out)
    _say_malloc(report, say)
    timed = keep_run_times(outcome.get("result") or {}, chosen, graph, out, board.name, say) \
        if time_nodes else None
    if timed:  # the estimates that missed are replaced: the profile stays cached
        from ..node_times import FIGURES_KEY
        report["profile"] = {**report.get("profile", {}), FIGURES_KEY: timed}
    else:
        forget_if_far_off(report, chosen, say)
    if opts.plots:
        report["plots"] = draw_plots(graph, plan_path, report, out, chosen.profile)
    return report


def _planned_split_with(profile: Profile | None, outcome: dict, graph, plan_dict: dict) -> None:
    """The plan's memory by class at its peak, replayed with the profile it was made with:
    the board replays the plan with the graph's own costs, whose peak falls elsewhere (QA:
    its classes summed to 219.0 MiB beside a planned peak of 226.78 MiB)."""
    split = (outcome.get("result") or {}).get("memory_by_class")
    if not split or profile is None:
        return
    from edge_remat_agent.costs import plan_costs
    from edge_remat_agent.formats import plan_from_dict
    from edge_remat_agent.memory_classes import planned_at, planned_by_class
    plan = plan_from_dict(plan_dict)
    costs = plan_costs(graph, plan, profile)
    split["planned"] = planned_by_class(graph, plan, costs)
    if (moment := split.get("at_plan_peak")) is not None:  # the plan's peak, these costs
        moment["planned"] = planned_at(graph, plan.stages, tuple(moment["at"]),
                                       costs.workspace(graph), plan.runtime_warm_bytes)


def _measured_for_another_graph(chosen: ChosenProfile, graph, say: Say) -> ChosenProfile:
    """The profile chosen for the graph with parameters on flash: said where it times under
    half of its nodes (a profile of another graph: their times are estimates), and then kept
    in the cache whatever the steps take (QA: hf:llama with LoRA, 18 of 86 nodes timed, 0.138 s
    predicted, 2.17 s a step, dropped as 'measured while this machine was busy'). One that
    times the graph's own nodes (the profile job's, grouped for flash) is judged as any
    measured profile: QA, hf:bert's predicted 10x its steps, 2.04 s against 0.199 s, and
    stayed cached, every next run planning on it."""
    from ..checks import note_profile_fit, profile_coverage
    if chosen.profile is not None and chosen.profile.ops:
        note_profile_fit(chosen.profile, graph, f"the profile ({chosen.how}) of the graph with "
                         "parameters in RAM", say)
        covered, total = profile_coverage(chosen.profile, graph)
        if covered * 2 >= total:
            return chosen
    return dataclasses.replace(chosen, cached_at=None)


# -- planning ------------------------------------------------------------------------------

def run_budget(opts: RunOptions, device: DeviceConfig, chosen: ChosenProfile) -> Budget:
    """--budget as given; else, under a memory limit, what the runtime leaves of it."""
    if opts.budget is not None:
        return opts.budget
    limit = device.hardware.memory_limit_bytes
    if not limit:
        raise RunProblem("give --budget (e.g. 30% or 512MiB), or --memory-limit to derive it")
    taken, what = limit_overheads(chosen.profile)
    left = limit - taken
    if left <= 0:
        raise NoRoomUnderLimit(f"the memory limit ({limit / 2**20:.0f} MiB) leaves nothing "
                               f"for training after {what}")
    return Budget(bytes=left)


class NoRoomUnderLimit(RunProblem):
    """A memory limit that leaves no budget at all beside the runtime and its headroom."""


def _with_floor(error: NoRoomUnderLimit, make_problem, chosen: ChosenProfile) -> RunProblem:
    """The error naming the limit to give: the floor's, as a budget the limit leaves too
    small names it (QA: this one named none)."""
    from ..planner.problem import InfeasibleBudget
    try:
        make_problem("1B").check_budget()  # refused, naming the floor
    except InfeasibleBudget as infeasible:
        if infeasible.smallest_bytes:
            taken, _ = limit_overheads(chosen.profile)
            least = math.ceil((infeasible.smallest_bytes + taken) / 2**20)
            return RunProblem(f"{error}: give --memory-limit {least}MiB or more")
    return error


def limit_overheads(profile: Profile | None) -> tuple[int, str]:
    """What a memory limit holds beside the plan's budget, in bytes and in words: the
    runtime (the profile's, where it measured one) and the headroom. (The weight store's
    read-ahead, which once took the largest frozen group too, runs for no plan `run` makes:
    they place their reads from home themselves, executor/stores.py.)"""
    runtime = (profile.runtime_baseline_bytes if profile and profile.runtime_baseline_bytes
               else DEFAULT_RUNTIME_BYTES)
    return (runtime + RUNTIME_HEADROOM_BYTES,
            f"the runtime's own {runtime / 2**20:.0f} MiB and "
            f"{RUNTIME_HEADROOM_BYTES / 2**20:.0f} MiB headroom")


def _note_budget_past_limit(budget_bytes: int, opts: RunOptions, device: DeviceConfig,
                            chosen: ChosenProfile, say: Say,
                            peak_bytes: Optional[int] = None) -> None:
    """A --budget that, with what the board holds beside it, passes the board's memory: said
    before the run (QA: --budget 90% under 1 GiB planned 824 MiB, and the board was killed
    at step 1 with no word before). The memory is the emulated board's limit
    (--memory-limit), else the RAM the profile measured (an SSH board's, its cgroup's limit
    where it runs in one: QA, pi600's 600 MiB, a plan of 259 MiB beside its 341 MiB runtime
    peaked at 600 MiB with no word), under one rule. `peak_bytes`: the plan's, which the run
    holds where it is below the budget (QA: a 6.7 MiB model under 400 MiB, --budget 500MiB,
    was told the limit would likely kill it; pi600's --budget 2GiB, a plan of 318 MiB, was
    told it would not fit its 600 MiB of RAM, and finished)."""
    limit = device.hardware.memory_limit_bytes
    ram = None if limit else getattr(chosen.profile, "ram_total_bytes", None)
    if not (limit or ram) or opts.budget is None:  # a budget derived from the limit fits it
        return
    taken, what = limit_overheads(chosen.profile)
    held = "the budget"
    if peak_bytes is not None and peak_bytes < budget_bytes:
        budget_bytes, held = peak_bytes, "the plan's peak"
    memory = limit or ram
    if budget_bytes + taken <= memory:
        return
    room = memory - taken
    if limit:
        # the limit this budget needs, and, where the limit leaves any room, planning for that
        # (QA: "leave out --budget to plan for what the limit leaves (0 MiB)", which was refused)
        fix = f"give --memory-limit {math.ceil((budget_bytes + taken) / 2**20)}MiB or more" \
            + (f", or leave out --budget to plan for what the limit leaves "
               f"({room / 2**20:.0f} MiB)" if room >= 2**20 else "")
        where, killer = f"{limit / 2**20:.0f} MiB memory limit", "the limit"
    else:
        fix = (f"give --budget {room // 2**20}MiB or less, what its RAM leaves after them"
               if room >= 2**20 else "its RAM leaves nothing for training after them: use a "
               "board with more RAM")
        where = f"{ram / 2**20:.0f} MiB of RAM the profile of {device.name} gives its board"
        killer = "the board's out-of-memory killer"
    runtime = taken - RUNTIME_HEADROOM_BYTES
    if budget_bytes + runtime > memory:
        say(f"warning: {held}, {budget_bytes / 2**20:.0f} MiB, and {what} pass the "
            f"{where}: {killer} will likely kill the run; {fix}")
    else:  # into the headroom only: the allocator's slack decides (README's resnet18 at 65%
        # left 155 of 160 MiB and peaked 116 MiB under the limit)
        left = (memory - budget_bytes - runtime) / 2**20
        say(f"warning: {held}, {budget_bytes / 2**20:.0f} MiB, and the runtime's own "
            f"{runtime / 2**20:.0f} MiB leave {left:.0f} MiB of the {where} for the "
            f"allocator's slack, less than the {RUNTIME_HEADROOM_BYTES / 2**20:.0f} MiB a run "
            f"keeps: {killer} may kill the run; {fix}")


def _with_limit_hint(error, opts: RunOptions, device: DeviceConfig, chosen: ChosenProfile):
    """A budget derived from --memory-limit that is below the floor: the refusal names the
    limit that leaves the floor (QA: '--memory-limit 800MiB' said only 'budget 166730544
    bytes is too small', a budget the user never gave)."""
    from ..planner.problem import InfeasibleBudget
    limit = device.hardware.memory_limit_bytes
    if opts.budget is not None or not limit or not error.smallest_bytes:
        return error
    taken, what = limit_overheads(chosen.profile)
    return InfeasibleBudget(f"{error}; that budget is what the {limit / 2**20:.0f} MiB memory "
                            f"limit leaves after {what}: give --memory-limit "
                            f"{math.ceil((error.smallest_bytes + taken) / 2**20)}MiB or more",
                            error.smallest_bytes)


def _no_room_under_limit(opts: RunOptions, device: DeviceConfig, chosen: ChosenProfile) -> bool:
    """Whether the memory limit leaves no budget beside the runtime that the profile measured."""
    return bool(_no_room_words(opts, device, chosen))


def _no_room_words(opts: RunOptions, device: DeviceConfig, chosen: ChosenProfile) -> str:
    """What the memory limit leaves no budget after, in the refusal's words ("the memory
    limit (300 MiB) leaves nothing for training after ..."); '' where it leaves one."""
    try:
        run_budget(opts, device, chosen)
    except NoRoomUnderLimit as error:
        return str(error)
    return ""


def _below_floor(graph, chosen: ChosenProfile, opts: RunOptions, device: DeviceConfig,
                 plain_peak: int) -> bool:
    """Whether the budget is below the smallest one this graph can meet."""
    from ..planner.build import build_problem
    from ..planner.problem import InfeasibleBudget
    try:
        budget = run_budget(opts, device, chosen)
    except NoRoomUnderLimit:
        return True
    problem = build_problem(graph, budget, chosen.profile, opts.objective, opts.deadline,
                            opts.paging, plain_peak=plain_peak)
    try:
        problem.check_budget()
    except InfeasibleBudget:
        return True
    return False


def _below_any_profiles_floor(graph, chosen: ChosenProfile, opts: RunOptions,
                              device: DeviceConfig, plain_peak: int) -> bool:
    """Whether the budget is below what the graph needs whatever a profile of it measures:
    a node's inputs and output beside the graph's fixed memory (workspaces and the runtime's
    warm-up, the profile's part of the floor, left out)."""
    from edge_remat_agent.floor import floor_node

    from ..planner.build import resolve_budget
    budget = resolve_budget(run_budget(opts, device, chosen), graph, plain_peak, chosen.profile)
    need, _ = floor_node(graph, [0] * len(graph.nodes))
    return budget < graph.fixed_bytes + need


def _with_flash_hint(error, capture, chosen: ChosenProfile, opts: RunOptions,
                     device: DeviceConfig, plain_peak: int, say: Say):
    """The planner's refusal of the budget, saying which --paging would home the parameters on
    flash where --paging rules flash out (so they stayed in RAM) and, captured that way, the
    budget is above the floor; else the refusal as it was."""
    from ..planner.problem import InfeasibleBudget, ProblemError
    if opts.params_home != "auto" or flash_allowed(opts.paging):
        return error
    wider = paging_with_flash(opts.paging)
    say(f"checking whether --paging {wider} (parameters homed on flash) would fit the budget")
    on_flash = capture("flash")
    try:
        if _below_floor(on_flash.graph, chosen, dataclasses.replace(opts, paging=wider),
                        device, plain_peak):
            return error
    except ProblemError:  # e.g. a profile without a flash tier: no hint to give
        return error
    return InfeasibleBudget(f"{error}; --paging {wider} would home the parameters and optimizer "
                            "state on flash, out of RAM, and this budget is above that "
                            "graph's floor", error.smallest_bytes)


def _plan(graph, chosen: ChosenProfile, opts: RunOptions, device: DeviceConfig,
          plain_peak: int, out: Path, say: Say) -> tuple[dict, Path]:
    from ..planner.build import build_problem
    from ..planner.solve import solve

    def make_problem(budget):  # a fraction is of plain PyTorch's peak, parameters in RAM
        return build_problem(graph, budget, chosen.profile, opts.objective, opts.deadline,
                             opts.paging, plain_peak=plain_peak)

    try:
        budget = run_budget(opts, device, chosen)
    except NoRoomUnderLimit as error:
        raise _with_floor(error, make_problem, chosen) from None
    problem = make_problem(budget)
    say(f"planning: {budget_against_plain(problem.budget_bytes, plain_peak)}, {opts.objective}")
    solved = solve(problem, opts.solver, opts.time_limit)
    from ..planner.arena import plan_arena

    # the glibc allocator's run lays the arena out for the report alone: best fit, milliseconds
    method = opts.arena if opts.allocator == "arena" else "best-fit"

    def lay_out(plan):
        return plan_arena(graph, plan, problem.costs, method, opts.arena_time_limit)

    layout = lay_out(solved.plan)
    if opts.allocator == "arena":  # the board pays the arena: it must fit the budget
        from ..planner.arena_fit import RETRY_TIME_SHARE, fit_arena

        def solve_at(budget_bytes: int):
            return solve(make_problem(f"{budget_bytes}B"), opts.solver,
                         RETRY_TIME_SHARE * opts.time_limit)

        solved, layout = fit_arena(graph, problem.budget_bytes, solved, layout, solve_at,
                                   lay_out)
        fit = layout.details["fit"]
        if len(fit["tries"]) > 1:
            say(_describe_fit(fit, opts.arena))
    solved.plan.arena = layout
    plan_dict = solved.plan.to_dict()
    plan_path = out / "plan.json"
    solved.plan.save(plan_path)
    if opts.sweep:
        _sweep(make_problem, opts, out, say)
    return plan_dict, plan_path


def _describe_fit(fit: dict, method: str) -> str:
    """One line on re-planning for the arena (planner/arena_fit.py)."""
    first = fit["tries"][0]
    over = (first["footprint_bytes"] - fit["budget_bytes"]) / 2**20
    if fit["fits"]:
        return (f"arena: the plan's arena passed the budget by {over:.2f} MiB "
                f"(fragmentation); planned again at {fit['planned_at_bytes'] / 2**20:.1f} MiB, "
                f"where it fits")
    return (f"arena: the plan's arena passes the budget by {over:.2f} MiB (fragmentation); "
            f"no lower budget tried fits it, so the board may need that much more"
            f"{'' if method == 'cpsat' else ' (--arena cpsat packs tighter)'}")


def _sweep(make_problem, opts: RunOptions, out: Path, say: Say) -> None:
    from edge_remat_agent.accumulated_step import step_figure
    from ..sweep import parse_sweep, run_sweep, smallest_feasible
    say(f"budget sweep {opts.sweep}")
    rows = []
    for point in run_sweep(make_problem, parse_sweep(opts.sweep), opts.solver,
                           opts.time_limit, "cbc", None):
        row = {"fraction": point.fraction, "budget_bytes": point.budget_bytes,
               "status": point.status, **smallest_feasible(point)}
        if point.report is not None:
            predicted = point.report.plan.predicted
            row.update(energy_j=step_figure(predicted, "energy_j"),  # a step's, as run's
                       time_s=step_figure(predicted, "time_s"), peak_bytes=predicted["peak_bytes"])
        rows.append(row)
    dump_json({"objective": opts.objective, "sweep": rows}, out / "sweep.json")


# -- training on the board -----------------------------------------------------------------

def _train(board: Board, device: DeviceConfig, kind: str, params: dict,
           inputs: Optional[dict], out: Path, steps: int, say: Say,
           job_id: Optional[str] = None) -> dict:
    """Run the training job; a job the kernel killed becomes a report, not an exception."""
    from ..remote import progress_printer
    from ..transport.emulated import KernelWatch
    watch = KernelWatch.for_device(device)
    try:
        record = board.run_job(kind, params, inputs, out / "board", job_id=job_id,
                               on_update=progress_printer(say))
        result = full_result(record)
        stopped = result.get("stopped_at_step")  # --stop-on-nonfinite: the report still comes
        return {"status": ended_well_status(result),
                "message": f"stopped at step {stopped} of {steps}: the loss is not finite "
                           "(--stop-on-nonfinite)" if stopped else finished_message(result, steps),
                "result": result, "board_limit_bytes": record.get("memory_limit_bytes"),
                **watch.readings(result)}
    except JobFailed as exc:
        by_limit = watch.killed()
        if not ran_out_of_memory(exc.record, by_limit):
            raise
        at, message = killed_words(exc.record, steps, by_limit)
        # the kernel's peak: the emulated board's group, else what the board's agent read of
        # its own group as it found the job killed (QA: an SSH board's said none)
        return {"status": "killed", "killed_at_step": at, "message": message,
                "killed_by": killed_cause(exc.record, by_limit),
                "result": (exc.record.get("progress") or {}).get("data") or {},
                "board_limit_bytes": exc.record.get("memory_limit_bytes"),
                **watch.readings({"kernel_peak": exc.record.get("kernel_peak")})}


def with_run_limit(report_args: dict, board_limit: Optional[int]) -> dict:
    """build_report's `report_args` (or a report) with the memory limit the job ran under: the
    emulated board's (the device config's, in `report_args`), else the one the board's agent
    read of its own cgroup as the job ended, finished or killed (`board_limit`: the job
    record's, _train's outcome's `board_limit_bytes`)."""
    return {**report_args,
            "memory_limit_bytes": report_args.get("memory_limit_bytes") or board_limit}


def killed_failure(failed: JobFailed, steps: int, board: str, by_limit: bool) -> JobFailed:
    """deploy's failed job, where it ran out of memory, in run's words: at which step, and
    what to do (QA: "the job process died: it was killed by SIGKILL (...)", no step, no
    remedy); any other failure as it was."""
    if not ran_out_of_memory(failed.record, by_limit):
        return failed
    _, words = killed_words(failed.record, steps, by_limit)
    return JobFailed(f"{words}: the plan needs more memory than {board} has; plan again with "
                     "a lower budget", failed.record)


def ran_out_of_memory(record: dict, by_limit: bool) -> bool:
    """Whether a failed job ran out of memory: the emulated board's group counted the kill
    (`by_limit`), or its error says so."""
    return by_limit or killed_by_memory(str(record.get("error")))


def killed_cause(record: dict, by_limit: bool) -> str:
    """What killed a job that ran out of memory, in the words of its line, its report's
    message and its table's row alike (`killed_by`; QA: the header of an SSH board's
    report.txt said "killed by SIGKILL (the board's out-of-memory killer)", its row "killed by
    the memory limit")."""
    error = str(record.get("error"))
    return ("killed by the memory limit" if by_limit else
            "killed by SIGKILL (the board's out-of-memory killer"
            + ("" if OOM_RAN in error else "?") + ")"
            if "SIGKILL" in error else "out of memory")


def killed_words(record: dict, steps: int, by_limit: bool) -> tuple[int, str]:
    """(the step, words) of a job that ran out of memory: "killed by the memory limit at
    step 3" (`by_limit`: the emulated board's group counted the kill), else by what its error
    says; while capturing, or after the last step, where it was then."""
    progress = record.get("progress") or {}
    at = completed_steps(progress, steps) + 1
    why = killed_cause(record, by_limit)
    from edge_remat_agent.executor.jobs import CAPTURING
    when = f"while {CAPTURING} (before step 1)" \
        if str(progress.get("message") or "").startswith(CAPTURING) \
        else f"at step {at}" if at <= steps else \
        f"after step {steps}, while saving the trained weights (--save none leaves them)"
    return at, f"{why} {when}"


def finished_message(result: dict, last: int) -> str:
    """What a finished job ran, by absolute steps where it resumed from a checkpoint
    (--resume): "finished steps 5..8 (4 steps, resumed after step 4)", and which start ran
    which steps where its board's daemon restarted it: "finished 8 steps (the board's daemon
    restarted the job: steps 1-4 in start 1, 5-8 in start 2)"."""
    from ..reports.run_report import starts_text
    figures = result.get("checkpoint") or {}
    first = figures.get("resumed_from_step") or 0
    restarted = starts_text(figures.get("starts"))
    if not first:
        return f"finished {counted(last, 'step')}" + (f" ({restarted})" if restarted else "")
    return (f"finished steps {first + 1}..{last} ({counted(last - first, 'step')}, resumed "
            f"after step {first}" + (f"; {restarted}" if restarted else "") + ")")


def completed_steps(progress: dict, steps: int) -> int:
    data = progress.get("data") or {}
    if isinstance(data.get("step"), int):
        return data["step"]
    fraction = progress.get("fraction")
    return int(fraction * steps) if isinstance(fraction, (int, float)) else 0


def host_gradient_check(graph, plan_path: Path, say: Say, captured=None,
                        no_room_on: Optional[str] = None) -> dict:
    """One step of the plan through the executor on this host, against eager PyTorch. With
    `captured` (this host's capture of the graph, as planned) the executor uses it instead of
    capturing the model again (seconds for a ResNet); it trains that capture's module.
    `no_room_on`: the board that has no room for eager PyTorch's plain step (profile_fit),
    else the check is here because the board's memory limit would take it in."""
    say("checking the plan's gradients against eager PyTorch on the host"
        + (f" ({no_room_on} has no room for its plain step)" if no_room_on else ""))
    why_here = (f"on the host, {no_room_on} having no room for eager PyTorch's plain step"
                if no_room_on else "on the host, outside the memory limit")
    from edge_remat_agent.formats import load_plan
    from edge_remat_agent.user_code import prints_to_stderr
    try:
        from edge_remat_agent.executor import ExecutorError, run_plan
    except ImportError as exc:
        return {"status": "not checked", "why": f"no executor on this host ({exc})"}
    try:
        with tempfile.TemporaryDirectory(prefix="edge-remat-gradcheck-") as pages, \
                prints_to_stderr():  # the model's forward: stdout is the report's (--json)
            result = run_plan(graph, load_plan(plan_path), 1, pages, check_gradients=True,
                              captured=captured)
    except ExecutorError as exc:  # e.g. another torch here than on the board
        return {"status": "not checked", "why": f"the host cannot run the plan: {exc}"}
    check = result.get("grad_check")
    where = f"{why_here}: the same plan, the example batch"
    return dict(check, where=where) if isinstance(check, dict) else \
        {"result": check, "where": where}
