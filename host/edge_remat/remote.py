"""What the board commands (`devices`, `job`, `job-status`, `deploy`, `profile`, `agent-stop`)
do, apart from their command-line parsing: checks, tables, parameters, one-line errors."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Callable, Dict, List, Optional

import typer

from edge_remat_agent.formats import FormatError
from edge_remat_agent.wire.protocol import TERMINAL_STATES

from .devices import DeviceConfig, config_files, load_device
from .outputs import print_json
from .transport import Board, TransportError
from .transport.board import summary
from .units import fmt_bytes, fmt_duration

def to_stderr(message: str) -> None:
    """Reconnects and progress go to stderr, so stdout stays one result (or one JSON object)."""
    typer.echo(message, err=True)


def progress_printer(say: Callable[[str], None] = to_stderr,
                     since: str = "the job was sent") -> Callable[[dict], None]:
    """A job's progress callback: each update as one line; the same record again (Board.wait
    repeats it after QUIET_S without news) says how long the job has been at it, and how long
    `since` this command began (job-status: "job-status began waiting", not the sending, which
    another command did before: QA); and a training job's first loss that is not finite as a
    `warning:` line (the run goes on; its report says so too)."""
    import time

    from edge_remat_agent.diverged import LossWatch
    watch = LossWatch()
    seen = {"rev": object(), "since": 0.0, "began": time.monotonic()}  # no record's rev yet

    def show(record: dict) -> None:
        now = time.monotonic()
        if record.get("rev") == seen["rev"] and record.get("state") in TERMINAL_STATES:
            return  # said once (QA: a deploy's last line came twice, its wait and its end)
        if record.get("rev") == seen["rev"]:
            still = "queued" if record.get("state") == "queued" else "at it"
            say(f"{summary(record)} (still {still}: {fmt_duration(now - seen['since'])}; "
                f"{fmt_duration(now - seen['began'])} since {since})")
            return
        seen.update(rev=record.get("rev"), since=now)
        say(summary(record))
        data = (record.get("progress") or {}).get("data") or {}
        warning = watch.see(data.get("nonfinite_loss"))
        if warning:
            say(f"warning: {warning}")
    return show


def job_sent_line(board, say: Callable[[str], None] = to_stderr) -> Callable[[dict], None]:
    """--json's progress callback: stdout keeps its one JSON object, and stderr says once,
    as the job is sent, its id and how to follow or cancel it from another shell (QA: with
    --json stderr was silent until the end, and no command named the running job)."""
    from .transport.board import device_options
    said: list = []

    def show(record: dict) -> None:
        if said:
            return
        said.append(record["id"])
        if board.device.connection.kind == "serial":
            say(serial_sent_line(record["id"], board))
            return
        device = device_options(board.device)
        say(f"job {record['id']} sent to {board.name} (`edge-remat job-status {record['id']} "
            f"--device {device} --wait` follows it, `edge-remat job-cancel {record['id']} "
            f"--device {device}` stops it)")
    return show


def serial_sent_line(job_id: str, board) -> str:
    """The sent line over a serial link, which this command holds while it waits: no other
    command can open the port until it ends (QA: the job-status and job-cancel commands this
    line offered failed 'in use by another program', exit 3, and the job was never cancelled),
    so it says what stops the job from here, and when the other commands reach it."""
    port = board.device.connection.device
    ctrl_c = ("Ctrl-C here leaves the job running (--keep-running) and names the `job-status` "
              "and `job-cancel` commands that reach it then" if board.keep_running
              else "Ctrl-C here cancels the job")
    return (f"job {job_id} sent to {board.name} (this command holds the serial port {port} "
            f"while it waits, so no other command reaches the board until it ends: {ctrl_c})")


# -- devices -------------------------------------------------------------------------------

def check_device(device: DeviceConfig) -> dict:
    """Connect and read the board's versions, RAM, disk and page folder; never raises. `ok` is
    whether a run could use the board (what deploy would refuse fails the check too), `error`
    each reason why not, with its remedy."""
    try:
        with Board(device, reconnect_timeout_s=0) as board:
            hello = board.hello()
            info = board.sysinfo(device.hardware.page_dir)
            problems = unusable_because(board, info)
            # a check leaves no agent or memory cgroup behind on an emulated board (QA: both
            # stayed up an hour, the daemon's idle exit), a busy one left as it is
            from .transport.emulated import retire_emulated
            retire_emulated(board)
    except (TransportError, FormatError) as exc:
        return {"ok": False, "error": str(exc)}
    except OSError as exc:  # in the words every command's line gives (QA: "[Errno 2] ...")
        from .errors import classify
        return {"ok": False, "error": classify(exc)[1]}
    page_dir = info.get("page_dir") or {}
    result = {"ok": not problems, "python": info.get("python"), "torch": info.get("torch"),
              "ram_total_bytes": info.get("ram_total_bytes"),
              "ram_limit_bytes": info.get("ram_limit_bytes"),
              "ram_free_bytes": info.get("ram_free_bytes"),
              "disk_free_bytes": info.get("disk_free_bytes"),
              "page_dir": page_dir.get("path"), "page_dir_free_bytes": page_dir.get("free_bytes"),
              "board": info.get("board"), "machine": info.get("machine"),
              "agent_build": hello.get("build"),
              "job_kinds": sorted(hello.get("job_kinds", {}))}
    if problems:
        result["error"] = "; ".join(problems)
    return result


def unusable_because(board: Board, info: dict) -> List[str]:
    """Why a run could not use this board: no torch (deploy's own refusal), a page folder it
    cannot write, less free disk in the workdir than an agent archive needs."""
    from .transport.errors import BoardMissingTorch
    from .transport.ssh import DISK_MARGIN
    problems = []
    try:
        board.require_torch()
    except BoardMissingTorch as exc:
        problems.append(str(exc))
    page_dir = info.get("page_dir")
    if isinstance(page_dir, dict) and not page_dir.get("ok"):
        problems.append(f"{board.name}'s page_dir cannot hold pages: {page_dir.get('error')}: "
                        f"set [hardware] page_dir in {board.device.path} to a writable folder "
                        "on the board (default: the workdir's pages/), or make that one writable")
    archive = getattr(board.transport, "archive", None)
    free = info.get("disk_free_bytes")
    if archive is not None and free is not None and free < archive.size + DISK_MARGIN:
        problems.append(f"{board.name} has {fmt_bytes(free)} free in its workdir "
                        f"{info.get('workdir')}, less than the agent archive's "
                        f"{fmt_bytes(archive.size)} plus the 1 MiB kept free: free some space "
                        "or set workdir in the device config to a larger partition")
    return problems


def device_rows(names: List[str], check: bool) -> List[dict]:
    from .devices import find_device
    rows: List[dict] = []
    targets: List[object] = [find_device(n) for n in names] if names else list(config_files())
    for target in targets:
        try:
            device = target if isinstance(target, DeviceConfig) else load_device(target)
        except FormatError as exc:
            rows.append({"name": Path(str(target)).stem, "config": str(target),
                         "error": str(exc)})
            continue
        rows.append({"name": device.name, "kind": device.connection.kind,
                     "address": device.address(), "ram_bytes": device.hardware.ram_bytes,
                     "memory_limit_bytes": device.hardware.memory_limit_bytes,
                     "sensor": device.hardware.sensor, "family": device.hardware.family,
                     "config": str(device.path), "_device": device})
    if check:
        checkable = [r for r in rows if "_device" in r]
        for row, result in zip(checkable, checked_at_once([r["_device"] for r in checkable])):
            row["check"] = result
    for row in rows:
        row.pop("_device", None)
    return rows


def checked_at_once(devices: List[DeviceConfig]) -> List[dict]:
    """check_device of each, side by side. The checks run in daemon threads: a thread pool's
    threads are joined before the process exits, so a Ctrl-C waited out every board's
    connect_timeout_s (10.7 s for a silent port); now it ends the command at once."""
    results: List[dict] = [{"ok": False, "error": "the check did not finish"} for _ in devices]

    def check(k: int, device: DeviceConfig) -> None:
        results[k] = check_without_raising(device)
    threads = [threading.Thread(target=check, args=(k, device), daemon=True,
                                name=f"check {device.name}")
               for k, device in enumerate(devices)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def check_without_raising(device: DeviceConfig) -> dict:
    """check_device, where a bug in it is a failed check saying so (an exception escaping a
    check's thread printed a thread traceback, and the check's empty result a KeyError)."""
    from .errors import classify, traceback_if_debug
    try:
        return check_device(device)
    except Exception as exc:  # noqa: BLE001 - whatever it is, the other boards' checks go on
        traceback_if_debug(exc)
        return {"ok": False, "error": classify(exc)[1]}


def devices_table(rows: List[dict], check: bool) -> str:
    head = ["NAME", "KIND", "ADDRESS", "RAM", "SENSOR"]
    if check:
        head += ["PYTHON", "TORCH", "FREE RAM", "FREE DISK", "FREE PAGE DIR"]
    lines = [head]
    notes = []
    for row in rows:
        if "error" in row:
            notes.append(f"{row['name']}: bad config: {row['error']}")
            continue
        result = row.get("check")
        line = [row["name"], row["kind"], row["address"], ram_cell(row, result), row["sensor"]]
        if result is not None:
            if "python" in result:  # reached: its figures, even when it failed the check
                line += [result["python"] or "-", result["torch"] or "MISSING",
                         fmt_bytes(result["ram_free_bytes"]), fmt_bytes(result["disk_free_bytes"]),
                         fmt_bytes(result["page_dir_free_bytes"])]
            else:
                line += ["-"] * 5
            if not result["ok"]:
                notes.append(failed_check_line(row["name"], result["error"]))
        lines.append(line)
    widths = [max(len(str(l[i])) for l in lines) for i in range(len(head))]
    text = "\n".join("  ".join(str(c).ljust(w) for c, w in zip(l, widths)).rstrip()
                     for l in lines)
    return text + ("\n" + "\n".join(notes) if notes else "")


def failed_check_line(name: str, error: str) -> str:
    """The line under the table for a board that failed its check: `NAME: why`, or the error
    as it is where it already begins with the board (the transport's own words: "x (this
    machine) is out of disk ...", "x has no torch ..."). QA: a local board whose workdir was
    full printed "x: x (this machine) is out of disk in ...", the name twice."""
    if error.startswith((f"{name} ", f"{name}'s ", f"{name}:")):
        return error
    return f"{name}: {error}"


def ram_cell(row: dict, result: Optional[dict]) -> str:
    """The config's ram_bytes; else the board's memory limit (an emulated board's cgroup, as
    the board says, or as its config gives it: no need to ask), else its physical RAM."""
    if row["ram_bytes"]:
        return fmt_bytes(row["ram_bytes"])
    limit = (result or {}).get("ram_limit_bytes") or row.get("memory_limit_bytes")
    if limit:
        return fmt_bytes(limit) + " (limit)"
    if result and result.get("ram_total_bytes"):
        return fmt_bytes(result["ram_total_bytes"]) + " (board)"
    return "(ask board)"


# -- agent-stop ----------------------------------------------------------------------------

def no_agent_here(device) -> bool:
    """Whether a board on this machine (local, or emulated in a memory cgroup) has no agent
    daemon: none answers on its workdir's socket, and none holds the workdir's lock (one
    starting). False for a board reached over a link: only its relay can tell."""
    if device.connection.kind != "local":
        return False
    from edge_remat_agent.daemon.launcher import connect_daemon
    from edge_remat_agent.daemon.layout import Layout
    from edge_remat_agent.daemon.runner import lock_is_held
    layout = Layout(device.connection.workdir)
    answered = connect_daemon(layout, timeout=1.0)
    if answered is not None:
        answered.close()
        return False
    return not lock_is_held(layout.lock_path)


# how long agent-stop waits for a daemon of this machine to be gone after it said it stops
DAEMON_EXIT_WAIT_S = 10.0


def _wait_for_exit(device) -> None:
    """Until the daemon of a board on this machine has let go of its workdir's lock (it has
    exited), at most DAEMON_EXIT_WAIT_S: "stopped" means gone (QA: the daemon was still in
    `ps` just after, and an agent-stop at once after it found it still stopping)."""
    if device.connection.kind != "local":
        return
    import time

    from edge_remat_agent.daemon.launcher import wait_for_exit
    from edge_remat_agent.daemon.layout import Layout
    wait_for_exit(Layout(device.connection.workdir), time.monotonic() + DAEMON_EXIT_WAIT_S)


def stop_agent(board: Board, if_idle: bool) -> "tuple[dict, str]":
    """Stop the board's daemon; (the JSON answer, the line to print). A busy agent asked to stop
    only if idle is left running: what was asked happened, so it is no error. Stopping a busy
    one says which jobs it interrupted (they may be another host's)."""
    from edge_remat_agent.wire.protocol import BUSY

    from .transport import AgentError
    from .transport.emulated import remove_stopped_board_cgroup
    if no_agent_here(board.device):  # QA: it started one to stop it, and said "stopped"
        remove_stopped_board_cgroup(board.device)  # an emulated board's, left by a crash
        return ({"status": "not_running"},
                f"no agent runs on {board.name}: nothing to stop")
    hello = board.hello()
    running, queued = hello.get("running"), int(hello.get("queued") or 0)
    try:
        board.stop_agent(if_idle=if_idle)
    except AgentError as exc:
        if exc.code != BUSY or not if_idle:
            raise
        job = exc.details.get("running") or running
        what = f"job {job}" if job else "a queued job"
        return ({"status": "left_running", "running": job, "queued": queued},
                f"agent on {board.name} left running: it is busy with {what} (--if-idle); "
                "stop it without --if-idle to interrupt that")
    _wait_for_exit(board.device)
    line = f"agent on {board.name} stopped"
    if (kept := remove_stopped_board_cgroup(board.device)) is not None:
        line += f"; its memory cgroup {kept} is left: processes still run in it"
    if running:
        line += (f"; it interrupted job {running}, which starts again when the agent next "
                 "starts (from its newest checkpoint where it keeps them)")
    if queued:
        line += f"; {queued} queued job(s) wait for that start"
    return {"status": "stopped", "interrupted": running, "queued": queued}, line


# -- jobs ----------------------------------------------------------------------------------

def parse_params(params_json: Optional[str], pairs: List[str]) -> dict:
    params: Dict[str, object] = {}
    if params_json:
        try:
            params = json.loads(params_json)
        except json.JSONDecodeError as exc:
            raise FormatError("command line", "--params", "a JSON object", params_json,
                              f"it is not JSON ({exc.msg} at character {exc.pos})") from None
        if not isinstance(params, dict):
            raise FormatError("command line", "--params", "a JSON object", params)
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise FormatError("command line", "--param", "KEY=VALUE", pair)
        try:
            params[key] = json.loads(value)  # 3 -> 3, true -> True, "x" -> "x"
        except json.JSONDecodeError:
            params[key] = value  # plain text
    return params


def parse_inputs(pairs: List[str]) -> Dict[str, Path]:
    inputs: Dict[str, Path] = {}
    for pair in pairs:
        name, sep, path = pair.partition("=")
        if not sep or not name:
            raise FormatError("command line", "--input", "NAME=PATH (the job gets NAME = the "
                              "file's path on the board)", pair)
        if not Path(path).is_file():
            raise FormatError("command line", f"--input {name}", "an existing file", path)
        inputs[name] = Path(path)
    return inputs


def refuse_bad_job_params(kind: str, params: dict, inputs: Dict[str, Path]) -> None:
    """A job submitted and left (`job --detach`): its params read as the board's job first
    reads them (registry.refuse_bad_params, the same code), so that one the board would refuse
    is refused here, before anything is sent, in the board's words (exit 2), not later in its
    record only. Each --input counts as its param given; the board checks the file."""
    from edge_remat_agent.daemon.registry import InputRefused, refuse_bad_params

    from .errors import UserError
    try:
        refuse_bad_params(kind, {**params, **{name: str(path) for name, path in inputs.items()}})
    except InputRefused as error:
        raise UserError(str(error)) from None


def host_page_outs(kind: str, params: dict, inputs: Dict[str, Path]) -> int:
    """How many pages a `run` job's plan (its --input plan, a file here) sends to the host: its
    job needs the host's page service for its life, as deploy's does. 0 for another kind, a
    plan given as a board path or one whose host pages go to a service the params name (the
    board refuses a plan paging to host without one), or a file that is no plan (the board's
    to refuse, in its words)."""
    from .transport.host_pages import host_page_outs as counted
    plan = inputs.get("plan")
    if kind != "run" or plan is None or params.get("host_pages"):
        return 0
    try:
        return counted(json.loads(plan.read_text()))
    except (OSError, ValueError, AttributeError, TypeError):
        return 0


def refuse_detached_host_pages(kind: str, params: dict, inputs: Dict[str, Path],
                               device: str) -> None:
    """`job run --detach` of a plan that pages to the host: the host's page service lives only
    as long as the command that starts it, and a detached job has none, so it is refused
    before anything is sent (exit 2), with the command that holds the service for the job.
    QA: the board kept the 58 pages in its own RAM (RSS 644 MiB, not deploy's 391)."""
    outs = host_page_outs(kind, params, inputs)
    if not outs:
        return
    from .errors import UserError
    graph = inputs.get("graph")
    raise UserError(
        f"job run --detach: the plan {inputs['plan']} pages to the host ({outs} page-out"
        f"{'s' if outs != 1 else ''}), whose page service lives only as long as the command "
        "that starts it, and nothing would hold it for a detached job. Run it with "
        f"`edge-remat deploy {inputs['plan']} --device {device} --graph "
        f"{graph if graph is not None else 'GRAPH'}` (or `job run` without --detach), or plan "
        "again with --paging flash (or none)")


def fetched_json(record: dict) -> "list[Path]":
    """The JSON files a job's outputs brought here (a profile job's profile.json)."""
    return [Path(p) for p in record.get("fetched", []) if str(p).endswith(".json")]


def fetched_file(record: dict, name: str) -> "Path | None":
    """The fetched output file called `name` (the executor's run_report.json), if any."""
    return next((Path(p) for p in record.get("fetched", []) if Path(p).name == name), None)


def full_result(record: dict) -> dict:
    """The job's result; where it names a report file it fetched (the executor's
    run_report.json), that file, which holds every step."""
    report = fetched_file(record, "run_report.json")
    return json.loads(report.read_text()) if report else record.get("result") or {}


def print_outcome(record: dict, as_json: bool, board: Board,
                  progress: Optional[Callable[[dict], None]] = None) -> None:
    """The job's outcome on stdout: one JSON object (--json), or its result. Its state line
    goes to `progress`, which said the job's lines on stderr (a no-op where it said this
    record's already: QA saw it twice, on stderr and stdout), else to stdout with the rest."""
    if as_json:
        print_json({"status": record["state"], "job": record["id"],
                    "result": record.get("result"), "error": record.get("error"),
                    "fetched": record.get("fetched", []), "reconnects": board.reconnects,
                    "device": board.name})
        return
    if progress is None:
        typer.echo(summary(record))
    else:
        progress(record)
    if record.get("result") is not None:
        report = full_result(record)
        # The job's result carries the summary alone; the words need the board's whole report
        # (the model, what was recomputed), which is here once fetched (`--out`).
        if record.get("kind") == "run" and "summary" in report and "model" in report:
            from edge_remat_agent.run_command import summary_text  # as the board's own `run`
            typer.echo(summary_text(report))
        elif record.get("kind") == "profile" and isinstance(record["result"], dict):
            typer.echo(profile_text(record["result"]))
        else:
            print_json(record["result"], indent=1)
    for path in record.get("fetched", []):
        typer.echo(f"fetched {path}")


# The profile job's summary (profiler.measure.profile_summary), as `profile` prints it.
_PROFILE_SAID = ("files", "output", "source", "name", "ops", "nodes", "graph", "tiers",
                 "idle_w", "active_w", "sensor", "power_estimate", "runtime_baseline_bytes",
                 "tiers_not_measured")


def profile_text(result: dict) -> str:
    """`profile`'s outcome as lines, label and value, as the other commands' tables (QA: it
    printed the job's raw JSON dict; --json prints that)."""
    from .units import fmt_bytes

    def number(value) -> str:
        return f"{value:g}" if isinstance(value, (int, float)) else str(value)
    rows = [("profile", f"{result.get('output')} ({result.get('name')}, "
                        f"{result.get('source')})")]
    timed = f", {result['nodes']} graph nodes timed" if result.get("nodes") else ""
    rows.append(("operators", f"{result.get('ops', 0)} measured{timed}"
                 + (f" ({result['graph']})" if result.get("graph") else "")))
    rows.append(("tiers", ", ".join(result.get("tiers") or ()) or "none"))
    for tier, why in (result.get("tiers_not_measured") or {}).items():
        rows.append(("not measured", f"{tier}: {why}"))
    if result.get("idle_w") is not None:
        how = "estimated from the board's model, no sensor" if result.get("power_estimate") \
            else f"sensor {result.get('sensor')}"
        rows.append(("power", f"idle {number(result['idle_w'])} W, active "
                              f"{number(result.get('active_w'))} W ({how})"))
    if result.get("runtime_baseline_bytes") is not None:
        rows.append(("runtime", f"{fmt_bytes(result['runtime_baseline_bytes'])} (the "
                                "runtime's own memory, before the model)"))
    for key, value in result.items():  # what a later profiler adds, said as it is
        if key not in _PROFILE_SAID:
            shown = value if isinstance(value, (str, int, float)) else \
                json.dumps(value, default=str)
            rows.append((key.replace("_", " "), str(shown)))
    return "\n".join(f"{label:<15} {value}" for label, value in rows)


def require_kind(board: Board, kind: str, what: str) -> None:
    kinds = board.hello().get("job_kinds", {})
    if kind not in kinds:
        raise TransportError(f"the agent on {board.name} cannot {what} yet: it has no {kind!r} "
                             f"job (it has: {', '.join(sorted(kinds))})")
    if kinds[kind].get("needs_torch"):
        board.require_torch()
