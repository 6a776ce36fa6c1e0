"""The command line's one error path: every failure becomes one `error:` line and a documented
exit status (README, "Exit statuses"); `--debug` shows the traceback before the line, the
exit status the same.

    0    done
    1    a job failed on the board, a run's gradients differ from eager PyTorch's (on CUDA,
         from the captured step replayed plainly), or --stop-on-nonfinite stopped a run at a
         loss that is not finite
    2    bad input: a file, an option, a model, a path to write (nothing was sent or written);
         also a job whose input the board refused: a param, a plan for another graph, data
         the model cannot take (the job's record says `bad_input`)
    3    the board or its link cannot be reached or used
    4    killed: the run ran out of memory (the memory limit, the board's OOM killer)
    70   an internal error (a bug): rerun with --debug and report the traceback
    130  interrupted (Ctrl-C, or SIGTERM taken as Ctrl-C); the board's job was cancelled
         unless --keep-running; `plan` writes the best plan found so far. Also a job the host
         cancelled (job-cancel) that a command waited on or came back for
    141  stdout was closed by its reader (`edge-remat plan ... | head`): quietly, as other
         commands killed by SIGPIPE (128 + 13); what the command wrote before stays
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import sys
from typing import NoReturn

EXIT_JOB_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_UNREACHABLE = 3
EXIT_KILLED = 4
EXIT_INTERNAL = 70
EXIT_INTERRUPTED = 130
EXIT_STDOUT_CLOSED = 141  # 128 + SIGPIPE, the status `yes | head` leaves

DEBUG_ENV = "EDGE_REMAT_DEBUG"
# The agent's refusals that mean "your request was wrong", not "the board is broken".
_INPUT_CODES = ("bad_request", "unknown_kind", "unknown_job", "conflict")


class UserError(ValueError):
    """Bad input found by the host (an option, a path, a plan for another graph): exit 2."""


class Interrupted(Exception):
    """Ctrl-C, with what was done about it (the board's job cancelled or left running)."""

    def __init__(self, message: str, **extra):
        self.extra = extra
        super().__init__(message)


def debug_enabled() -> bool:
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


def take_debug_flag(argv: list) -> bool:
    """Remove `--debug` (anywhere before a `--`) from argv; it works with every command."""
    end = argv.index("--") if "--" in argv else len(argv)
    found = "--debug" in argv[:end]
    if found:
        argv[:] = [a for i, a in enumerate(argv) if i >= end or a != "--debug"]
        os.environ[DEBUG_ENV] = "1"
    return found


def traceback_if_debug(exc: BaseException) -> None:
    """--debug: the traceback, on stderr before the one line. The exit status stays the one
    the table gives (bad input is still 2): a script or a bug report made with --debug must
    not see another class of failure."""
    if debug_enabled():
        import traceback
        traceback.print_exception(type(exc), exc, exc.__traceback__)


def classify(exc: BaseException) -> "tuple[int, str, dict]":
    """(exit status, the one line without `error: `, extra JSON fields) for any exception."""
    from edge_remat_agent.capture.errors import CaptureError
    from edge_remat_agent.formats import FormatError
    from edge_remat_agent.simulate import PlanError

    from .devices import DeviceError
    from .planner.problem import InfeasibleBudget, InfeasibleDeadline, ProblemError
    from .planner.solve import NoPlan
    from .transport import AgentError, JobFailed, JobOutOfReach, TransportError
    from .transport.errors import SshConfigError, as_reported
    from .units import UnitError

    if isinstance(exc, Interrupted):
        return EXIT_INTERRUPTED, str(exc), {"status": "interrupted", **exc.extra}
    if ctrl_c_behind(exc):
        from .planner.interrupt import stopped_by
        return EXIT_INTERRUPTED, f"interrupted ({stopped_by()})", {"status": "interrupted"}
    if isinstance(exc, InfeasibleBudget):
        # budget_floor_bytes is a lower bound; its older name, kept for existing readers,
        # says "feasible", which it need not be
        return EXIT_BAD_INPUT, str(exc), {"status": "infeasible",
                                          "budget_floor_bytes": exc.smallest_bytes,
                                          "smallest_feasible_budget_bytes": exc.smallest_bytes}
    if isinstance(exc, InfeasibleDeadline):
        return EXIT_BAD_INPUT, str(exc), {"status": "infeasible_deadline",
                                          "smallest_feasible_deadline": exc.smallest_deadline}
    job = as_reported(exc.record or {}) if isinstance(exc, JobFailed) else {}
    if job.get("state") == "cancelled":
        return EXIT_INTERRUPTED, str(exc), {"status": "cancelled", "job": job}
    if job.get("state") == "bad_input":
        # input the board's job refused (InputRefused: a param, a plan for another graph, a
        # batch the model cannot take): bad input, in the board's words
        return EXIT_BAD_INPUT, str(exc), {"status": "bad_input", "job": job}
    if job.get("state") == "killed":  # out of memory: the record says so too (as_reported)
        return EXIT_KILLED, str(exc), {"status": "killed", "job": job}
    if isinstance(exc, JobFailed):
        return EXIT_JOB_FAILED, str(exc), {"status": "failed", "job": job}
    if isinstance(exc, JobOutOfReach):
        return EXIT_UNREACHABLE, str(exc), {"job": exc.job}
    if isinstance(exc, SshConfigError):
        return EXIT_BAD_INPUT, str(exc), {}
    if isinstance(exc, AgentError):
        return (EXIT_BAD_INPUT if exc.code in _INPUT_CODES else EXIT_UNREACHABLE), str(exc), {}
    if isinstance(exc, TransportError):
        return EXIT_UNREACHABLE, str(exc), {}
    if isinstance(exc, NoPlan) and exc.hint is not None:  # the budgets its words name
        return EXIT_BAD_INPUT, str(exc), {"budget_floor_bytes": exc.hint.floor_bytes,
                                          "budget_to_try_bytes": exc.hint.try_bytes}
    if isinstance(exc, (UserError, FormatError, UnitError, NoPlan, PlanError, ProblemError,
                        CaptureError, DeviceError)):
        return EXIT_BAD_INPUT, str(exc), {}
    if isinstance(exc, OverflowError):
        return EXIT_BAD_INPUT, f"a number is too large ({exc}): give sizes in bytes of at most " \
                               "2^53 and finite figures", {}
    if isinstance(exc, OSError) and exc.errno in DISK_FULL:
        return EXIT_BAD_INPUT, *disk_full(exc)
    if isinstance(exc, OSError) and exc.errno == errno.EFBIG:
        return EXIT_BAD_INPUT, *file_too_large(exc)
    if isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename else ""
        return EXIT_BAD_INPUT, f"{where}{exc.strerror or exc} (check the path and its " \
                               "permissions)", {}
    if isinstance(exc, MemoryError):
        return EXIT_BAD_INPUT, "this machine ran out of memory (the input is too large for " \
                               "it?)", {}
    return EXIT_INTERNAL, (f"internal error ({type(exc).__name__}: {exc}); rerun with --debug "
                           "for the traceback and report it"), {}


# A write that found no room: the disk is full, or the user's quota on it is used up.
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def disk_full(exc: OSError) -> "tuple[str, dict]":
    """The line (and JSON fields) of a write that found the disk full: the file, and what was
    to be written and is free there where known (dump_bytes' `needed_bytes`), and what to do;
    not "check the path and its permissions", which sent users after a path that was right.
    A writer that put its own remedy in the error (a run's fetch: how to fetch the job's
    outputs again) keeps its words."""
    from .units import fmt_bytes
    where = f"{exc.filename}: " if exc.filename else ""
    said = exc.strerror or str(exc)
    if said != os.strerror(exc.errno):
        return f"{where}{said}", {}
    needed = getattr(exc, "needed_bytes", None)
    free = None
    if exc.filename:  # its folder, or the nearest one above (a command removes those it made)
        folder = os.path.dirname(os.path.abspath(os.fsdecode(exc.filename)))
        while not os.path.isdir(folder) and os.path.dirname(folder) != folder:
            folder = os.path.dirname(folder)
        try:
            found = os.statvfs(folder)
            free = found.f_bavail * found.f_frsize
        except OSError:
            pass
    figures = [f"{fmt_bytes(needed)} to write"] if needed is not None else []
    figures += [f"{fmt_bytes(free)} free there"] if free is not None else []
    full = "the disk quota is used up" if exc.errno == errno.EDQUOT else "the disk is full"
    line = (f"{where}{said}: {full}" + (f" ({', '.join(figures)})" if figures else "")
            + ": make room on it, or write elsewhere")
    extra = {key: value for key, value in (("needed_bytes", needed), ("free_bytes", free))
             if value is not None}
    return line, extra


def file_too_large(exc: OSError) -> "tuple[str, dict]":
    """The line (and JSON fields) of a write refused as too large (EFBIG): the file would pass
    this process's file-size limit (RLIMIT_FSIZE, `ulimit -f`) or the largest file its
    filesystem holds (FAT32's 4 GiB). QA, under `ulimit -f 1`: plan -o said "p.json: File
    too large (check the path and its permissions)", and the path was right. A writer's own
    remedy stays, as disk_full keeps it."""
    from .units import fmt_bytes
    where = f"{exc.filename}: " if exc.filename else ""
    said = exc.strerror or str(exc)
    if said != os.strerror(exc.errno):
        return f"{where}{said}", {}
    needed = getattr(exc, "needed_bytes", None)
    try:
        import resource
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        limit = None if limit == resource.RLIM_INFINITY else limit
    except (ImportError, OSError, ValueError):  # no such limit here
        limit = None
    if limit is not None and needed is not None and needed <= limit:
        limit = None  # the file fits the limit: the filesystem refused it
    figures = [f"{fmt_bytes(needed)} to write"] if needed is not None else []
    if limit is not None:
        figures.append(f"the limit, `ulimit -f`, is {fmt_bytes(limit)}")
        remedy = "raise the limit (`ulimit -f unlimited`) in the shell that starts the command"
    else:  # no limit of ours: the filesystem's own (FAT32: 4 GiB)
        remedy = "write it to a filesystem that holds files this large (not FAT32: 4 GiB)"
    line = (f"{where}{said}: the file is larger than its filesystem or this process's "
            "file-size limit allows" + (f" ({'; '.join(figures)})" if figures else "")
            + f": {remedy}")
    extra = {key: value for key, value in (("needed_bytes", needed),
                                           ("file_size_limit_bytes", limit))
             if value is not None}
    return line, extra


def ctrl_c_behind(exc: BaseException) -> bool:
    """Whether `exc` is a Ctrl-C, or an error a Ctrl-C caused: a C extension whose module
    initialisation it interrupted raises ImportError("initialization failed") from it
    (pybind11: OR-Tools, highspy), which is no bug of ours."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return True
        seen.add(id(exc))
        exc = exc.__cause__
    return False


def import_extension(name: str):
    """importlib.import_module(name), where a Ctrl-C that interrupted the module's
    initialisation stays the KeyboardInterrupt it is (see ctrl_c_behind), so that whatever
    handles Ctrl-C (the anytime plan, run's report) handles it."""
    import importlib
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        if ctrl_c_behind(exc):
            raise KeyboardInterrupt from exc
        raise


def killed_by_memory(error: str) -> bool:
    """Whether a failed job's error says the memory ran out (the executor's OutOfMemory, the
    kernel's SIGKILL), and not that a SIGKILL came from elsewhere (the daemon checks the
    kernel's count of out-of-memory kills)."""
    from edge_remat_agent.daemon.worker import NOT_OOM  # light, but not needed at start-up
    if "SIGKILL" in error and NOT_OOM in error:
        return False
    return "OutOfMemory" in error or "SIGKILL" in error or "out of memory" in error.lower()


def stdout_closed(exc: BaseException) -> bool:
    """Whether `exc` is a broken pipe because stdout's reader has gone (`| head` read enough).
    A broken pipe elsewhere (an SSH socket, a FIFO given as -o) is a failure to report; this
    one is the reader's choice. The write end of a pipe whose readers have all closed polls as
    POLLERR (a socket's as POLLHUP)."""
    if not isinstance(exc, BrokenPipeError):
        return False
    import select
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll(), or stdout is no file
        return False


def broken_pipes_reach_us() -> None:
    """Let a broken pipe in rich (typer's help, `edge-remat --help | head -1`) end as any other
    on stdout: rich's own handler exits 1 without a word, which reads as a failure."""
    from rich.console import Console

    def raise_it(console) -> None:
        raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))

    Console.on_broken_pipe = raise_it


def leave_quietly(code: int = EXIT_STDOUT_CLOSED) -> NoReturn:
    """Exit without a word once stdout's reader has gone; stdout now goes to /dev/null, so
    that Python's own flush at exit does not fail again ("Exception ignored ...")."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    sys.exit(code)


def fail(message: str, code: int, as_json: bool = False, **extra) -> None:
    """Say the failure (say_failure); exit with `code`. Every command's failure, and its
    interruption, ends here."""
    import typer
    say_failure(message, as_json, **extra)
    raise typer.Exit(code)


def say_failure(message: str, as_json: bool = False, **extra) -> None:
    """Print the one line (and, with --json, one object on stdout), and note that it was said
    (error_line_said): fail's, and cli.main's for what ends outside every command."""
    global _error_line_said
    import typer

    from .outputs import print_json  # outputs imports this module
    if as_json:
        obj = {"status": "error", "error": message, **extra}
        try:
            print_json(obj)
        except BrokenPipeError as exc:  # no one reads the object: the line still tells
            if not stdout_closed(exc):
                raise
    typer.echo(f"error: {message}", err=True)
    _error_line_said = True


_error_line_said = False


def error_line_said() -> bool:
    """Whether this process's command has said its one error line (say_failure)."""
    return _error_line_said


def run_script(main) -> None:
    """End an example's `main()` as the CLI ends a command: its return value is the exit
    status; a failure is one `error:` line and its status (EDGE_REMAT_DEBUG=1: the
    traceback), not a traceback a reader of the example must dig the reason out of."""
    try:
        code = main()
    except BaseException as exc:  # noqa: BLE001 - the script's one exit
        if isinstance(exc, SystemExit):
            raise
        traceback_if_debug(exc)
        code, message, _ = classify(exc)
        print(f"error: {message}", file=sys.stderr)
    sys.exit(code or 0)


def cli_errors(command):
    """Decorate a command: any exception becomes `fail(...)` (with --debug, after its
    traceback)."""
    labels = option_labels(command)

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        from .outputs import count_folders_made_from_now
        count_folders_made_from_now()
        try:
            refuse_empty_values(labels, kwargs)
            return command(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - the one place every failure ends
            if stdout_closed(exc):  # before typer sees it: it would exit 1, a failed job
                leave_quietly()
            if isinstance(exc, SystemExit) or is_cli_machinery(exc):
                raise
            with ctrl_c_held():
                traceback_if_debug(exc)
                from .outputs import remove_folders_left_empty
                remove_folders_left_empty()
                code, message, extra = classify(exc)
                fail(message, code, bool(kwargs.get("as_json")), **extra)
    return wrapper


# Outputs: refused where they are written (outputs.py), with what they name.
_OUTPUT_PARAMS = {"output", "out"}


def option_labels(command) -> dict[str, str]:
    """The command's parameters by name -> how the user writes each: its longest option name
    (`--profile`), or an argument's metavar (`PLAN`)."""
    import inspect
    labels = {}
    for name, parameter in inspect.signature(command).parameters.items():
        info = parameter.default
        decls = [d for d in getattr(info, "param_decls", None) or () if d.startswith("-")]
        labels[name] = max(decls, key=len) if decls else \
            (getattr(info, "metavar", None) or name.upper()).strip("[]. ")  # [NAME]...: NAME
    return labels


def refuse_empty_values(labels: dict[str, str], kwargs: dict) -> None:
    """An option or argument given as '' (an unset shell variable: `--resume "$OUT"`) names
    nothing, and the commands, which test an option's truth, read it as not given: a profile
    measured anew, a run trained from step 1 instead of resumed, '.' read as the graph. No
    option takes '' for a value."""
    for name, value in kwargs.items():
        given = value if isinstance(value, (list, tuple)) else [value]
        if name in labels and name not in _OUTPUT_PARAMS and any(
                isinstance(v, str) and not v.strip() for v in given):
            raise UserError(f"{labels[name]} is empty: give a value")


@contextlib.contextmanager
def ctrl_c_held():
    """Ctrl-C is ignored while the failure's one line is made and said: the command is ending
    anyway, and a second Ctrl-C there (QA: 0.3 s after the first, the job already cancelled)
    ended it at 130 with no line, so nobody learnt what became of the board's job."""
    import signal
    import threading
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def is_cli_machinery(exc: BaseException) -> bool:
    """typer's (and click's) own exceptions: an exit status, a usage error, help shown."""
    return type(exc).__module__.split(".")[0] in ("typer", "click")


def quiet_libraries() -> None:
    """paramiko logs a traceback from its own thread when a port does not speak SSH; the
    one-line error says it all (with --debug, the log stays)."""
    if debug_enabled():
        return
    import logging
    logging.getLogger("paramiko").addHandler(logging.NullHandler())
    logging.getLogger("paramiko").propagate = False


def last_resort(exc: BaseException) -> int:
    """For what escapes every command (typer itself): one line, an exit status."""
    traceback_if_debug(exc)
    code, message, _ = classify(exc)
    print(f"error: {message}", file=sys.stderr)
    return code
