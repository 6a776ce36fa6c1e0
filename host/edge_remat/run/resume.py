"""`run --checkpoint-every N` and `run --resume OUT` on the host.

The board's run job writes its checkpoint into its own files (jobs/ID/files/checkpoint.pt,
executor/checkpoint.py); the host fetches it into OUT/checkpoint.pt when the job ends, killed
or not. OUT/checkpoint.json names the run's jobs, newest first, written before each is
submitted: a run whose host never got the checkpoint (Ctrl-C, a dropped link, a host that
died) is resumed from the board's copy, which the host fetches first (and checks: options,
format) and the resumed job then reads where it lies, without sending it back.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable, Optional

from edge_remat_agent.daemon.identity import file_sha256
from edge_remat_agent.executor.checkpoint_step import checkpoint_step
from edge_remat_agent.executor.save_choice import (CHECKPOINT_FILE, WEIGHTS_FILE,
                                                   identity_mismatch)

from .job_end import ENDED_WELL
from .options import RunOptions, RunProblem, run_data

RECORD = "checkpoint.json"
DECAYING = ("linear", "cosine")  # schedules that span --steps: a resume keeps the same


def training_identity(opts: RunOptions) -> dict:
    """The options a resumed run must share with the run that wrote its checkpoint, by their
    command-line names: what the model, its data and each optimizer step are. (The budget,
    the plan, where parameters live and the board may change between the parts.)"""
    return {"--model": opts.model, "--batch": opts.batch, "--image": opts.image,
            "--seq": opts.seq, "--seed": opts.seed, "--dtype": opts.dtype,
            "--trainable-dtype": opts.trainable_dtype, "--train": opts.train,
            "--optimizer": opts.optimizer, "--clip-grad-norm": opts.clip_grad_norm,
            "--accumulate": opts.accumulate, **_update_identity(opts, run_data(opts))}


def deploy_identity(opts: RunOptions, graph_fingerprint: str) -> dict:
    """deploy's: the graph the plan was made for (its model, batch, optimizer: the capture's
    options) and what each step trains on and with, as run's."""
    return {"--graph": graph_fingerprint, **_update_identity(opts, opts.data or "example")}


def _update_identity(opts: RunOptions, data: str) -> dict:
    """What run and deploy share: the data, the starting weights and the learning rate's
    schedule. Not --lr itself: a resume may go on with a smaller one (the remedy of a run
    that diverged), each step's factor of it as the schedule says."""
    identity = {"--lr-schedule": opts.lr_schedule, "--warmup": opts.warmup,
                "--data": data,
                "--init": file_sha256(Path(opts.init)) if opts.init else None}
    if opts.lr_schedule in DECAYING:
        identity["--steps"] = opts.steps
    return identity


def checkpoint_params(opts: RunOptions, every: int, identity: Optional[dict] = None,
                      out: "Path | str | None" = None) -> dict:
    """The run job's params for checkpoints (none when the run makes none). `identity`:
    training_identity's where not given; `out`: the run's folder, which a --resume names
    (the job says it in what to try after a stop at a non-finite loss)."""
    if not (every or opts.stop_after or opts.resume):
        return {}
    return {"checkpoint_every": every, "identity": identity or training_identity(opts),
            **({"stop_after": opts.stop_after} if opts.stop_after else {}),
            **({"out": str(out)} if out is not None else {})}


def checkpoint_every(opts: RunOptions) -> int:
    """--checkpoint-every, or the resumed run's when not given again."""
    if opts.checkpoint_every is not None or not opts.resume:
        return opts.checkpoint_every or 0
    return int(read_record(Path(opts.resume)).get("checkpoint_every") or 0)


def read_record(out: Path) -> dict:
    """OUT/checkpoint.json ({} where there is none). One that is not JSON, or whose fields
    are damaged, is refused naming what is wrong: its jobs say where a newer checkpoint than
    OUT's may be, and were read as they were (a job that was a number: an internal error; a
    file cut short: read as none, and written over)."""
    from edge_remat_agent.formats import FormatError
    from edge_remat_agent.formats.fields import Reader
    try:
        text = (out / RECORD).read_text()
    except OSError:
        return {}
    try:
        record = json.loads(text)
        reader = Reader(record, str(out / RECORD))
        for k in range(len(reader.list("jobs", []))):
            job = reader.item("jobs", k)
            job.str("job"), job.str("device")
        reader.integer("checkpoint_every", 0)
    except (FormatError, ValueError) as error:  # FormatError is one too
        what = error if isinstance(error, FormatError) else \
            f"{out / RECORD} is not JSON ({error})"
        raise RunProblem(f"--resume {out}: {what}; remove {out / RECORD} to go on from "
                         f"{out / CHECKPOINT_FILE} alone") from None
    return record


def note_job(out: Path, job_id: str, device: str, every: int, resumed: bool) -> None:
    """Before the job is submitted: OUT/checkpoint.json names it first (a fresh run starts
    the list again: its checkpoints are not the earlier run's, whose jobs it keeps apart as
    `earlier_jobs`)."""
    before = read_record(out)
    jobs = before.get("jobs", []) if resumed else []
    record = {"jobs": [{"job": job_id, "device": device}] + list(jobs),
              "checkpoint_every": every}
    earlier = before.get("earlier_jobs", []) + ([] if resumed else before.get("jobs", []))
    if earlier:  # an earlier run's, started over: not this run's, but not forgotten
        record["earlier_jobs"] = earlier
    from edge_remat_agent.formats.fields import dump_text  # atomic; a failure names the file
    dump_text(json.dumps(record, indent=1), out / RECORD)


def _refuse_a_job_still_running(board, out: Path, record: dict, deployed: bool = False) -> None:
    """A job of the run that is still queued or running on the board (left with
    --keep-running, or by a host that died) goes on writing checkpoints: a resume beside it
    would queue behind it and then read a checkpoint newer than the one it promised (QA:
    "resuming after step 140", then failed on the board at step 300). The way back fetches
    its outputs where the run keeps them: OUT/board, or deploy's --out itself (`deployed`;
    QA: deploy was told OUT/board, and then found its outputs not in OUT)."""
    from ..transport.errors import AgentError
    from edge_remat_agent.wire.protocol import TERMINAL_STATES
    for entry in record.get("jobs", []):
        if entry.get("device") != board.name:
            continue
        try:
            state = board.job(entry["job"])["state"]
        except AgentError as error:
            if error.code == "unknown_job":  # pruned, or never reached the board
                continue
            raise
        if state not in TERMINAL_STATES:
            raise RunProblem(f"--resume {out}: its job {entry['job']} is still {state} on "
                             f"{board.name}, writing checkpoints: let it end or stop it, then "
                             f"resume; {board.come_back(entry['job'], _job_files(out, deployed))}")


def _job_files(out: Path, deployed: bool) -> Path:
    """Where a job's output files go: deploy's --out itself, run's OUT/board."""
    return out if deployed else out / "board"


def find_checkpoint(board, out: Path, say: Callable[[str], None],
                    deployed: bool = False) -> Optional[str]:
    """OUT/checkpoint.pt made the newest checkpoint of the run in OUT (fetched from the board
    where it has a newer one than this host); returns its path on the board where the board
    has it (the job reads it there), else None (the host's copy is pushed). `deployed`: OUT
    is deploy's (the job's files in OUT itself, not OUT/board)."""
    local = out / CHECKPOINT_FILE
    record = read_record(out)
    _refuse_a_job_still_running(board, out, record, deployed)
    # this run's jobs first, newest first; then an earlier run's that this one started over
    # from (a checkpoint it never made is no reason to lose that run's)
    for entry in record.get("jobs", []) + record.get("earlier_jobs", []):
        if entry.get("device") != board.name:
            continue
        remote = f"jobs/{entry['job']}/files/{CHECKPOINT_FILE}"
        state = board.stat(remote)
        if not state.get("exists"):
            continue  # killed before its first checkpoint: the job before it has one
        if not local.is_file() or file_sha256(local) != state.get("sha256"):
            say(f"{board.name}: fetching the checkpoint of job {entry['job']} into {local}")
            board.fetch(remote, local)
        return remote
    # a job the link lost, whose outputs `job-status ... --out OUT/board` (the come-back the
    # run named) fetched: its checkpoint is there (QA: "no checkpoint there", on another board)
    came_back = out / "board" / CHECKPOINT_FILE
    if came_back.is_file() and (not local.is_file() or
                                (checkpoint_step(came_back) or 0) > (checkpoint_step(local) or 0)):
        say(f"taking the checkpoint its job's outputs brought, {came_back}, as {local}")
        shutil.copyfile(came_back, local)
    if not local.is_file():
        elsewhere = _jobs_elsewhere(record, board.name)
        if elsewhere:
            raise RunProblem(f"--resume {out}: no checkpoint there nor on {board.name}; "
                             f"{elsewhere}, and brings the newest into {local}, from which "
                             f"--resume {out} then goes on on any board")
        raise RunProblem(f"--resume {out}: no checkpoint there nor on {board.name} (the run "
                         "was stopped before its first one, or made without "
                         "--checkpoint-every): run it again without --resume")
    return None


def _jobs_elsewhere(record: dict, here: str) -> str:
    """Where OUT's record names jobs on other boards than `here`: the words for where their
    checkpoints stay and how to go on from them (QA: a deploy stopped on `loop`, resumed on
    `local`, was told to run again without --resume, its progress thrown away). '' where
    it names none."""
    boards: dict = {}
    for entry in record.get("jobs", []) + record.get("earlier_jobs", []):
        device = entry.get("device")
        if device and device != here:
            boards.setdefault(device, []).append(entry.get("job"))
    if not boards:
        return ""
    where = ", ".join(f"{device} ({', '.join(jobs)})" for device, jobs in boards.items())
    newest = next(iter(boards))  # the record lists its jobs newest first
    return (f"its jobs ran on {where}, which keeps their checkpoints: the same command with "
            f"--device {newest} goes on from there")


def start_resume(board, opts: RunOptions, out: Path, say: Callable[[str], None],
                 identity: Optional[dict] = None) -> dict:
    """--resume OUT, once the board is reached: its newest checkpoint found (fetched from the
    board where newer) and checked. Returns the checkpoint's figures and `at`: its path on the
    board where the job reads it there (else the host's copy is pushed: job_resume)."""
    at = find_checkpoint(board, out, say, bool(identity and "--graph" in identity))
    figures = check_checkpoint(opts, out, identity)
    say(f"resuming after step {figures['steps_done']} from {out / CHECKPOINT_FILE}")
    return {**figures, "at": at}


def job_resume(out: Path, resumed: Optional[dict]) -> tuple[dict, dict]:
    """The run job's params and inputs (pushed files) for the checkpoint it goes on from."""
    if not resumed:
        return {}, {}
    if resumed["at"]:
        return {"resume": resumed["at"]}, {}  # the board's own copy, read where it lies
    return {}, {"resume": out / CHECKPOINT_FILE}


def check_checkpoint(opts: RunOptions, out: Path, identity: Optional[dict] = None) -> dict:
    """OUT/checkpoint.pt, read on this host: refused in one line where it is damaged, another
    tool's, of other options (`identity`: training_identity's where not given), or has no step
    left to take. Returns its figures."""
    from edge_remat_agent.executor.checkpoint import read_checkpoint
    from edge_remat_agent.executor.errors import BadInput
    path = out / CHECKPOINT_FILE
    try:
        checkpoint = read_checkpoint(path, f"--resume {out}")
    except BadInput as error:
        raise RunProblem(str(error)) from None
    mismatch = identity_mismatch(checkpoint.meta.get("identity") or {},
                                 identity or training_identity(opts))
    if mismatch:
        raise RunProblem(f"--resume {out}: {mismatch}")
    last = opts.stop_after or opts.steps
    if checkpoint.steps_done == last:  # its outputs are the finished run's: nothing to make
        option = "--stop-after" if opts.stop_after else "--steps"
        if option == "--steps" and opts.lr_schedule in DECAYING:
            # --steps is the schedule's length, part of what a resume must keep (QA: this
            # advice, followed, was refused as "give --steps as it was")
            weights = out / WEIGHTS_FILE
            train_on = (f"its --lr-schedule {opts.lr_schedule} ends at step {last}, so to "
                        "train on start another run from its weights" +
                        (f": --init {weights}" if weights.is_file() else
                         f" (--init WEIGHTS.pt; it left no {weights})"))
        else:
            train_on = f"to train on, give {option} more than {last}"
        raise RunProblem(f"--resume {out}: the run there is complete (its checkpoint is after "
                         f"step {last}, the last of this run): {train_on}"
                         + _outputs_left_behind(out, bool(identity and "--graph" in identity)))
    if checkpoint.steps_done > last:
        # the option that stops it early is the one to raise (QA: "give --steps more than 2"
        # to a run of --steps 3 --stop-after 1)
        option = "--stop-after" if opts.stop_after else "--steps"
        raise RunProblem(f"--resume {out}: its checkpoint is after step "
                         f"{checkpoint.steps_done}, and this run would stop at step {last}: "
                         f"give {option} more than {checkpoint.steps_done}")
    return {"steps_done": checkpoint.steps_done, "bytes": path.stat().st_size}


def _outputs_left_behind(out: Path, deployed: bool) -> str:
    """Where the run's last job finished while the link was down, so that its outputs never
    came: the command that fetches them (QA: a deploy --resume said only that the run was
    complete, and OUT had no weights.pt nor report). "" where they came."""
    jobs = read_record(out).get("jobs", [])
    folder = _job_files(out, deployed)  # deploy's --out holds the job's files
    if not jobs or (folder / "run_report.json").is_file():
        return ""
    return (f"; its outputs are not in {folder} (the link was lost before they came): "
            f"`edge-remat job-status {jobs[0]['job']} --device {jobs[0]['device']} --out "
            f"{folder}` fetches them")


def keep_checkpoint(board, out: Path, outcome: dict, job_id: str) -> Optional[dict]:
    """The job's checkpoint into OUT/checkpoint.pt: the one its outputs brought (a finished
    job, or one --stop-on-nonfinite stopped: its last before that step), else fetched from
    the board (a killed one: its last checkpoint before the kill)."""
    fetched = out / "board" / CHECKPOINT_FILE
    target = out / CHECKPOINT_FILE
    result = outcome.get("result") or {}
    if outcome.get("status") in ENDED_WELL and fetched.is_file():
        fetched.replace(target)
        figures = result.get("checkpoint") or {}
        return {**figures, "file": str(target),
                "step": figures.get("step") or (figures.get("last") or {}).get("step")}
    remote = f"jobs/{job_id}/files/{CHECKPOINT_FILE}"
    try:
        if not board.stat(remote, with_hash=False).get("exists"):
            return None
        board.fetch(remote, target)
    except Exception:  # noqa: BLE001 - the board keeps it: --resume finds it there
        return None
    return {"file": str(target), "step": (result.get("checkpoint_step")
                                          if isinstance(result, dict) else None)}


def with_resume_hint(failed: Exception, board, out: Path, job_id: str) -> Exception:
    """A job that failed (SIGKILLed on the board, say: not by a memory limit, which becomes a
    report) or was cancelled by Ctrl-C, with its error saying that its last checkpoint stays
    on the board, where --resume OUT finds it; the error as it was where the job left none
    (QA: Ctrl-C said only "cancelled job ...", and the same command again, without --resume,
    left the checkpoint out of OUT's record)."""
    from ..errors import Interrupted
    from ..transport import JobFailed
    from ..transport.errors import RUN_AGAIN, cancelled_by_host
    if isinstance(failed, Interrupted):
        hinted = failed.extra.get("cancelled")
    else:
        hinted = isinstance(failed, JobFailed)
    if not hinted or not _checkpoint_on(board, job_id):
        return failed
    resume = (f"its last checkpoint stays on {board.name}: the same command with "
              f"--resume {out} goes on from it")
    said = str(failed)
    if isinstance(failed, JobFailed) and cancelled_by_host(failed.record) and \
            said.endswith(RUN_AGAIN):  # cancelled from elsewhere (job-cancel): QA, no hint
        said = said[:-len(RUN_AGAIN)] + resume
    else:
        said = f"{said}; {resume}"
    return Interrupted(said, **failed.extra) if isinstance(failed, Interrupted) else \
        JobFailed(said, failed.record)


def _checkpoint_on(board, job_id: str) -> bool:
    """Whether the job left a checkpoint on the board (False where the board is out of reach:
    no hint then)."""
    try:
        return bool(board.stat(f"jobs/{job_id}/files/{CHECKPOINT_FILE}",
                               with_hash=False).get("exists"))
    except Exception:  # noqa: BLE001 - the board out of reach: the error as it was
        return False


def warn_of_earlier_checkpoint(board, out: Path, say: Callable[[str], None]) -> None:
    """A run without --resume into an OUT whose record names a job with a checkpoint on this
    board: this run starts over, and says where the earlier checkpoint stays (note_job keeps
    that job in the record, as `earlier_jobs`). Not after a run that finished: run again,
    a finished run starts over as asked."""
    try:
        ended = json.loads((out / "report.json").read_text()).get("status")
    except (OSError, ValueError, AttributeError):
        ended = None
    if ended == "finished":
        return
    for entry in read_record(out).get("jobs", []):
        if entry.get("device") == board.name and _checkpoint_on(board, entry.get("job", "")):
            say(f"warning: {out} holds the checkpoint of an earlier run (job {entry['job']}); "
                f"this run starts over from step 1 (--resume {out} goes on from that one "
                f"instead); it stays on {board.name} as jobs/{entry['job']}/files/"
                f"{CHECKPOINT_FILE}")
            return
