"""Where the fleet's tasks run: Ray (a local instance on this machine, or a cluster at
`--ray-address`), or this process one task at a time (`--no-ray`). Ray does the scheduling,
the shipping of inputs (each graph and profile is put in its object store once) and the
isolation (a solver that crashes takes down its worker, not the fleet); this module only
submits, waits and collects."""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any, Callable, NamedTuple, Optional

from ..errors import UserError
from ..planner.interrupt import sigterm_as_ctrl_c, sigterm_interrupt
from .tasks import capture_outcome, plan_outcome

RAY_EXTRA = "pip install -e '.[fleet]'"


class InProcess:
    """The same tasks, one after the other, in this process."""

    parallel = False

    def __init__(self) -> None:
        self.cpus = os.cpu_count() or 1
        self._calls: dict[int, tuple[Callable, tuple]] = {}
        self._results: dict[int, Any] = {}

    def share(self, value: Any) -> Any:
        return value

    def submit_capture(self, spec: str, capture: dict) -> int:
        return self._submit(capture_outcome, (spec, capture))

    def submit_plan(self, graph, profile, budget, deadline, settings, workers: int) -> int:
        return self._submit(plan_outcome, (graph, profile, budget, deadline, settings, workers))

    def _submit(self, function: Callable, args: tuple) -> int:
        handle = len(self._calls) + len(self._results)
        self._calls[handle] = (function, args)
        return handle

    def wait(self, handles: list, timeout_s: float) -> list:
        """Runs the oldest submitted task to its end."""
        handle = min(handles)
        function, args = self._calls.pop(handle)
        self._results[handle] = function(*args)
        return [handle]

    def result(self, handle: int) -> dict:
        return self._results.pop(handle)

    def cancel(self, handles: list) -> None:
        for handle in handles:
            self._calls.pop(handle, None)

    def close(self) -> None:
        pass


class RayBackend:
    """Tasks as Ray tasks; each plan task asks for as many CPUs as its solver has threads."""

    parallel = True

    def __init__(self, address: Optional[str] = None) -> None:
        try:
            import ray
        except ImportError:
            raise UserError(f"Ray is not installed: {RAY_EXTRA} (or pass --no-ray to run the "
                            "tasks one by one in this process)") from None
        self.ray = ray
        self._started = False
        self._began: Optional[int] = None  # when the local instance it started began
        self._kinds: dict = {}  # handle -> "capture" | "plan": a dead worker's words
        self._loud = _quiet_raylet_notices()  # until close: stdout stays the command's own
        try:
            if not ray.is_initialized():
                if address:
                    _check_reachable(address)
                try:
                    with _sigterm_kept():
                        self._began = self._start(ray, address)
                except (ConnectionError, RuntimeError, ValueError) as exc:
                    where = f"the Ray cluster at {address}" if address else \
                        "a local Ray instance"
                    raise UserError(f"cannot connect to {where}: {str(exc).splitlines()[0]} "
                                    "(check the address `ray status` prints on the head node, "
                                    "or leave out --ray-address)") from None
                self._started = True
        except BaseException:
            self._loud()
            raise
        self.cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
        # A crashed worker is a failed task, recorded; a re-run of the fleet tries it again.
        self._capture = ray.remote(capture_outcome)
        self._plan = ray.remote(plan_outcome)

    @staticmethod
    def _start(ray, address: Optional[str]) -> Optional[int]:
        """Connect, or start a local instance; when one was started, when (_now_ticks)."""
        if address:
            ray.init(address=address, logging_level="warning", log_to_driver=False)
            return None
        began = _now_ticks()
        # A local instance on this machine's cores, for this run only: "local", for without an
        # address ray.init joins the last instance started on this machine, if one still runs
        # (another fleet's, a notebook's), which this run would then shut down as its own.
        try:
            with _quiet_token_notice():
                ray.init(address="local", include_dashboard=False, logging_level="warning",
                         log_to_driver=False)
        except BaseException:  # Ctrl-C while it starts: its processes go too
            _stop_local_ray(ray, began)
            raise
        return began

    def share(self, value: Any) -> Any:
        """Put a value every task of a model or board reads in the object store, once."""
        return self.ray.put(value)

    def submit_capture(self, spec: str, capture: dict):
        handle = self._capture.options(num_cpus=1, max_retries=0).remote(spec, capture)
        self._kinds[handle] = "capture"
        return handle

    def submit_plan(self, graph, profile, budget, deadline, settings, workers: int):
        handle = self._plan.options(num_cpus=workers, max_retries=0).remote(
            graph, profile, budget, deadline, settings, workers)
        self._kinds[handle] = "plan"
        return handle

    def wait(self, handles: list, timeout_s: float) -> list:
        done, _ = self.ray.wait(handles, num_returns=1, timeout=timeout_s)
        return done

    def result(self, handle) -> dict:
        kind = self._kinds.pop(handle, "plan")
        try:
            return self.ray.get(handle)
        except self.ray.exceptions.RayError as exc:  # the worker died: a solver crash, OOM
            # the task itself never raises (tasks.py): its worker's end is no bug of ours,
            # and its words say what ended it and what to try, not "internal error"
            # (QA); seconds: the driver's own count (runner.py)
            return {"ok": False, "status": "crashed", "error": worker_died(self.ray, exc, kind),
                    "seconds": None}

    def cancel(self, handles: list) -> None:
        """Stop the tasks still running. A local instance of this run's own is shut down next,
        its workers with it: nothing is cancelled there, since a force-cancel racing a task's
        own end aborted the driver ("Check failed ... Tried to complete task that was not
        pending", Ray 2.60, once in a whole-suite run). On a cluster, only what has not
        ended."""
        if self._began is not None or not handles:
            return
        _, running = self.ray.wait(handles, num_returns=len(handles), timeout=0)
        for handle in running:
            try:
                self.ray.cancel(handle, force=True)
            except Exception:  # noqa: BLE001 - finished meanwhile, or gone
                pass

    def close(self) -> None:
        try:
            if self._started and self._began is not None:
                _stop_local_ray(self.ray, self._began)
            elif self._started:  # a cluster's: this driver leaves it
                self.ray.shutdown()
        finally:
            self._loud()


# What a task's worker was doing, and what to try when it died doing it.
_DOING = {"capture": ("capturing the model", "try a smaller batch, or capture it alone with "
                      "`edge-remat graph` to see how it ends"),
          "plan": ("planning it", "run fewer tasks at once (--threads N: more solver threads "
                   "per task, fewer tasks in flight), or plan it alone with `edge-remat plan`")}


def worker_died(ray, exc: BaseException, kind: str) -> str:
    """One line for a task whose Ray worker ended before it returned: killed by Ray's memory
    monitor, killed by a signal or crashed (the system's out-of-memory killer, a crash in a
    model's or a solver's native code: a task never raises), or Ray's own failure."""
    doing, remedy = _DOING[kind]
    if isinstance(exc, ray.exceptions.OutOfMemoryError):
        return (f"Ray killed the worker {doing}: this machine ran low on memory (Ray's memory "
                f"monitor); {remedy}")
    if isinstance(exc, ray.exceptions.WorkerCrashedError):
        return (f"the Ray worker {doing} was killed by a signal or crashed (most often the "
                f"system's out-of-memory killer: see `dmesg`); {remedy}")
    if isinstance(exc, (ray.exceptions.NodeDiedError, ray.exceptions.LocalRayletDiedError)):
        return f"the Ray node of the worker {doing} died: {_first_line(exc)}"
    return f"the Ray worker {doing} failed: {_first_line(exc)}"


@contextlib.contextmanager
def _sigterm_kept():
    """ray.init gives the driver a SIGTERM handler of its own, which exits with status 15
    (SystemExit) and, once Ray runs, dumps a crash report (exit 134) with no results written.
    sigterm_as_ctrl_c puts the handler from before back after it (the fleet's: the results so
    far written, exit 130), and a SIGTERM while Ray starts, Ray's SystemExit, is that
    interrupt too."""
    import signal
    with sigterm_as_ctrl_c():
        try:
            yield
        except SystemExit as exc:
            if exc.code != signal.SIGTERM:
                raise
            raise sigterm_interrupt() from None


def _quiet_raylet_notices() -> Callable[[], None]:
    """Keep Ray's messages to the driver off stdout, which is the command's own (a table, or
    `--json`'s one object): when a worker dies the raylet's notice ('(raylet) A worker died or
    was killed while executing a task by an unexpected system error. ...', many lines) was
    printed on stdout, before the JSON object (QA). The task's row and its `failed:` line
    say it in one line: the notices are dropped (with --debug, on stderr), and anything else
    Ray would print on stdout goes to stderr. Ray prints them from a thread of its own
    through ray._private.worker.print_to_stdstream, looked up at each call (Ray 2.60); gives
    back what puts it back."""
    try:
        from ray._private import worker
        original = worker.print_to_stdstream
    except (ImportError, AttributeError):  # another Ray: as it prints
        return lambda: None

    def to_stderr(data, ignore_prefix):
        from ..errors import debug_enabled
        if data.get("pid") == "raylet" and not debug_enabled():
            return
        original({**data, "is_err": True}, ignore_prefix)

    worker.print_to_stdstream = to_stderr

    def restore() -> None:
        if worker.print_to_stdstream is to_stderr:
            worker.print_to_stdstream = original
    return restore


@contextlib.contextmanager
def _quiet_token_notice():
    """Ray 2.60 turns token authentication on for a local instance and says so in a warning
    ("Set RAY_AUTH_MODE=disabled to opt out"): nothing for a fleet's user to do, and opting out
    would open the instance to anyone on the network. Its logger is quiet while Ray starts
    (setting RAY_AUTH_MODE=token ourselves instead left the driver without the token: 'Failed
    to start GCS')."""
    log = logging.getLogger("ray._private.authentication.authentication_token_setup")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def _stop_local_ray(ray, began: int) -> None:
    """Shut down the local instance this process started, and end what of it outlives
    ray.shutdown(): the raylet's agents (dashboard, runtime env) and workers, orphaned when a
    terminal's Ctrl-C killed the raylet, lived on for about a minute (70 s after a Ctrl-C while
    Ray started). They are this process's descendants, or, once orphaned, Ray's programs in its
    process group (which a terminal's Ctrl-C reached) started since `began` (_now_ticks
    before ray.init: another instance in the group, started before, is not ours): found
    before the shutdown, stopped after it, and looked for again until none is left: a raylet
    still starting spawns its agents until it is gone (1 Ctrl-C in 5 left both agents when the
    group was read once)."""
    ray_dir = os.path.dirname(ray.__file__)
    ours = {**_descendants(os.getpid()), **_rays_in_my_group(ray_dir, began)}
    try:
        ray.shutdown()
    except BaseException:  # noqa: BLE001 - a second Ctrl-C, a half-started instance
        pass
    for _ in range(_STOP_ROUNDS):
        ours.update(_rays_in_my_group(ray_dir, began))
        left = {pid: start for pid, start in ours.items() if _alive(pid, start)}
        if not left:
            return
        _end(left)
        ours = left


_STOP_ROUNDS = 4


def _end(processes: dict) -> None:
    """SIGTERM, then SIGKILL what is still there; {pid: start time}."""
    import signal
    import time
    left = list(processes)
    for sig, grace_s in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 1.0)):
        for pid in left:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        end = time.monotonic() + grace_s
        while left and time.monotonic() < end:
            time.sleep(0.05)
            left = [pid for pid in left if _alive(pid, processes[pid])]


def _descendants(root: int) -> dict:
    """{pid: start time} of every process below `root`, read from /proc (Linux; elsewhere
    none, and ray.shutdown() alone stops the instance)."""
    children: dict = {}
    starts: dict = {}
    for pid in _pids():
        stat = _stat(pid)
        if stat:
            children.setdefault(stat.parent, []).append(pid)
            starts[pid] = stat.started
    found, todo = {}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found[child] = starts[child]
            todo.append(child)
    return found


def _rays_in_my_group(ray_dir: str, began: int) -> dict:
    """{pid: start time} of Ray's programs (run from its package folder, or a worker that
    renamed itself ray::...) in this process's group started since `began`, other than this
    process."""
    group, found = os.getpgid(0), {}
    for pid in _pids():
        if pid == os.getpid():
            continue
        try:
            if os.getpgid(pid) != group:
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                command = handle.read().decode(errors="replace")
        except OSError:
            continue
        stat = _stat(pid)
        if stat and stat.started >= began and (ray_dir + os.sep in command
                                               or command.startswith("ray::")):
            found[pid] = stat.started
    return found


def _pids() -> list[int]:
    """Every process's id (Linux /proc; elsewhere none)."""
    if not os.path.isdir("/proc"):
        return []
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def _now_ticks() -> int:
    """Now, as /proc/PID/stat gives start times: clock ticks after boot (0 without /proc)."""
    try:
        with open("/proc/uptime") as handle:
            uptime_s = float(handle.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0
    return int(uptime_s * os.sysconf("SC_CLK_TCK"))


class _Stat(NamedTuple):
    state: str  # "Z": a zombie, ended and not yet reaped
    parent: int
    started: int  # in clock ticks after boot: tells a process from a later one given its pid


def _stat(pid: int) -> Optional[_Stat]:
    """What /proc/PID/stat says of a process, None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return _Stat(fields[0], int(fields[1]), int(fields[19]))


def _alive(pid: int, started) -> bool:
    """Still the process found before (not a new one given the same pid), and not a zombie."""
    stat = _stat(pid)
    return stat is not None and stat.started == started and stat.state != "Z"


def _check_reachable(address: str, timeout_s: float = 10.0) -> None:
    """A HOST:PORT nobody answers on: said at once (Ray itself retries for minutes)."""
    import socket
    host, _, port = address.rpartition(":")
    if "://" in address or not host or not port.isdigit():
        return  # "auto", "ray://...": Ray resolves them
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise UserError(f"cannot reach the Ray cluster at {address}: {exc.strerror or exc} "
                        "(check the address `ray status` prints on the head node, or leave "
                        "out --ray-address for a local Ray instance)") from None


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__
