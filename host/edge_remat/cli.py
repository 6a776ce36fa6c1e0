"""The `edge-remat` command line. Planning and simulating import neither torch nor OR-Tools."""

from __future__ import annotations

import functools
import json
import sys
from typing import Optional

import typer

from edge_remat_agent.capture import DEFAULT_MAX_NODES
from edge_remat_agent.formats import FormatError, Tier, load_plan, load_profile

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Fine-tune PyTorch models on boards whose RAM is too small: "
                       "profile, plan (rematerialization + paging), deploy.")

EXIT_BAD_INPUT = 2


def _fail(message: str, as_json: bool, status: str = "error", **extra) -> None:
    if as_json:
        print(json.dumps({"status": status, "error": message, **extra}))
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(EXIT_BAD_INPUT)


def friendly_errors(command):
    """Bad input becomes one clear line and exit status 2, never a traceback."""
    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        from edge_remat_agent.capture.errors import CaptureError
        from edge_remat_agent.simulate import PlanError

        from .planner.problem import InfeasibleBudget, InfeasibleDeadline, ProblemError
        from .planner.solve import NoPlan
        from .units import UnitError
        as_json = bool(kwargs.get("as_json"))
        try:
            return command(*args, **kwargs)
        except InfeasibleBudget as exc:
            _fail(str(exc), as_json, status="infeasible",
                  smallest_feasible_budget_bytes=exc.smallest_bytes)
        except InfeasibleDeadline as exc:
            _fail(str(exc), as_json, status="infeasible_deadline",
                  smallest_feasible_deadline=exc.smallest_deadline)
        except (FormatError, UnitError, NoPlan, PlanError, ProblemError, CaptureError) as exc:
            _fail(str(exc), as_json)
    return wrapper


def _tiers(read_bw, write_bw, latency, energy_per_byte) -> dict[str, Tier]:
    if read_bw is None and write_bw is None:
        return {}
    if read_bw is None or write_bw is None:
        raise FormatError("command line", "--flash-read-bw/--flash-write-bw", "both bandwidths")
    from .units import parse_budget
    kinds = [parse_budget(v) for v in (read_bw, write_bw)]
    if any(k != "bytes" for k, _ in kinds):
        raise FormatError("command line", "--flash-read-bw", "a rate in bytes/s such as 90MB")
    return {"flash": Tier(kinds[0][1], kinds[1][1], latency or 0.0, energy_per_byte or 0.0,
                          energy_per_byte or 0.0)}


@app.command()
@friendly_errors
def plan(
    graph: str = typer.Option(..., "--graph", help="graph file (ours, node-link, or POET's)"),
    budget: Optional[str] = typer.Option(None, "--budget",
                                         help="0.8 or 80% of the plain peak, or 512MiB"),
    sweep: Optional[str] = typer.Option(None, "--sweep", help="solve a budget range instead, "
                                        "START:STOP:STEP of the plain peak, e.g. 0.3:1.0:0.1"),
    output: Optional[str] = typer.Option(None, "-o", "--output",
                                         help="where to write the plan (a folder with --sweep)"),
    profile: Optional[str] = typer.Option(None, "--profile", help="device profile JSON"),
    objective: str = typer.Option("time", "--objective", help="time | energy"),
    deadline: Optional[str] = typer.Option(None, "--deadline", help="e.g. 1.3 = 1.3x plain time"),
    solver: str = typer.Option("auto", "--solver", help="auto | cpsat | milp | heuristic:NAME"),
    time_limit: float = typer.Option(60.0, "--time-limit", help="seconds for the solver"),
    paging: Optional[str] = typer.Option(None, "--paging", help="none | flash | host | both"),
    paging_time: str = typer.Option("counted", "--paging-time",
                                    help="counted (paging takes time) | free (POET's model)"),
    backend: str = typer.Option("cbc", "--backend", help="MILP backend: cbc | highs"),
    workers: Optional[int] = typer.Option(None, "--workers", "--threads",
                                          help="solver threads (default: all cores)"),
    flash_read_bw: Optional[str] = typer.Option(None, "--flash-read-bw", help="bytes/s, e.g. 90MB"),
    flash_write_bw: Optional[str] = typer.Option(None, "--flash-write-bw", help="bytes/s"),
    flash_latency: Optional[float] = typer.Option(None, "--flash-latency", help="seconds"),
    flash_energy_per_byte: Optional[float] = typer.Option(None, "--flash-energy-per-byte",
                                                          help="joules per byte moved"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Solve for the cheapest schedule that fits the memory budget; write it as a plan."""
    from .graph_import import load_graph_file
    from .planner.build import PAGING_CHOICES, build_problem, plan_dict_with_tiers
    from .planner.solve import solve
    from .report import plan_table
    from .units import parse_multiplier

    g = load_graph_file(graph)
    prof = load_profile(profile) if profile else None
    tiers = _tiers(flash_read_bw, flash_write_bw, flash_latency, flash_energy_per_byte)
    if objective not in ("time", "energy"):
        raise FormatError("command line", "--objective", "time or energy", objective)
    if paging_time not in ("counted", "free"):
        raise FormatError("command line", "--paging-time", "counted or free", paging_time)
    if paging is not None and paging not in PAGING_CHOICES:
        raise FormatError("command line", "--paging", " | ".join(PAGING_CHOICES), paging)
    if (budget is None) == (sweep is None):
        raise FormatError("command line", "--budget", "exactly one of --budget and --sweep")

    def make_problem(budget_text):
        return build_problem(g, budget_text, prof, objective,
                             parse_multiplier(deadline) if deadline else None, paging, tiers,
                             paging_time)

    tier_params = {**(prof.tiers if prof else {}), **tiers}
    if sweep is not None:
        _plan_sweep(make_problem, sweep, solver, time_limit, backend, workers, output,
                    tier_params, as_json, objective)
        return
    problem = make_problem(budget)
    progress = None
    if not as_json and sys.stderr.isatty():
        from .planner.cpsat import print_progress as progress
    report = solve(problem, solver, time_limit, backend, workers, progress=progress)
    if progress is not None:
        typer.echo("", err=True)
    result = plan_dict_with_tiers(report.plan, tier_params)
    if output:
        from edge_remat_agent.formats.fields import dump_json
        dump_json(result, output)
    if as_json:
        pr, s = result["predicted"], result["solver"]
        print(json.dumps({
            "status": s["status"], "solver": s["name"], "budget_bytes": result["budget_bytes"],
            "peak_bytes": pr["peak_bytes"], "tdi_percent": pr["tdi_percent"],
            "time_s": pr["time_s"], "energy_j": pr["energy_j"],
            "energy_compute_j": pr["energy_compute_j"], "energy_paging_j": pr["energy_paging_j"],
            "recomputed": pr["recomputed"], "page_ins": pr["page_ins"],
            "page_outs": pr["page_outs"], "lower_bound": s["lower_bound"], "gap": s["gap"],
            "solve_time_s": s["solve_time_s"], "baselines": s["baselines"], "plan": output}))
    else:
        typer.echo(plan_table(result))
        if output:
            typer.echo(f"plan written to {output}")


def _plan_sweep(make_problem, sweep: str, solver: str, time_limit: float, backend: str,
                workers: Optional[int], output: Optional[str], tier_params: dict[str, Tier],
                as_json: bool, objective: str) -> None:
    from pathlib import Path

    from edge_remat_agent.formats.fields import dump_json

    from .planner.build import plan_dict_with_tiers
    from .report import sweep_table
    from .sweep import parse_sweep, run_sweep

    points = run_sweep(make_problem, parse_sweep(sweep), solver, time_limit, backend, workers)
    rows = []
    for point in points:
        row = {"fraction": point.fraction, "budget_bytes": point.budget_bytes,
               "status": point.status, "message": point.message or None}
        if point.report is not None:
            pr, s = point.report.plan.predicted, point.report.plan.solver
            row.update(solver=s["name"], tdi_percent=pr["tdi_percent"], time_s=pr["time_s"],
                       energy_j=pr["energy_j"], peak_bytes=pr["peak_bytes"],
                       lower_bound=s["lower_bound"], gap=s["gap"],
                       solve_time_s=s["solve_time_s"])
            if output:
                path = Path(output) / f"plan-{point.fraction:.2f}.json"
                path.parent.mkdir(parents=True, exist_ok=True)
                dump_json(plan_dict_with_tiers(point.report.plan, tier_params), path)
                row["plan"] = str(path)
        rows.append(row)
    if as_json:
        print(json.dumps({"objective": objective, "sweep": rows}))
    else:
        typer.echo(sweep_table(points, objective))
        if output:
            typer.echo(f"plans written to {output}/")


@app.command()
@friendly_errors
def simulate(
    plan_file: str = typer.Argument(..., metavar="PLAN"),
    graph: str = typer.Option(..., "--graph", help="the graph the plan was made for"),
    profile: Optional[str] = typer.Option(None, "--profile", help="profile for costs"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Replay a plan: check every instruction and add up peak RAM, time, energy and TDI."""
    from edge_remat_agent.costs import build_costs
    from edge_remat_agent.formats.profile import tier_from
    from edge_remat_agent.formats.fields import Reader
    from edge_remat_agent.simulate import simulate as run

    from .graph_import import load_graph_file
    from .report import sim_table

    g = load_graph_file(graph)
    p = load_plan(plan_file)
    if p.graph_fingerprint and p.graph_fingerprint != g.fingerprint():
        raise FormatError(plan_file, "graph_fingerprint", f"the fingerprint of {graph} "
                          f"({g.fingerprint()}): the plan was made for another graph",
                          p.graph_fingerprint)
    tier_params = p.problem.get("tier_params", {}) or {}
    tiers = {name: tier_from(Reader(obj, plan_file, f"problem.tier_params.{name}"))
             for name, obj in tier_params.items()}
    costs = build_costs(g, load_profile(profile) if profile else None, tiers)
    result = run(g, costs, p.stages, p.budget_bytes)
    summary = result.summary()
    if as_json:
        print(json.dumps({"valid": True, "budget_bytes": p.budget_bytes, **summary}))
    else:
        typer.echo(sim_table(summary, p.budget_bytes))
        typer.echo("valid plan" + ("" if result.fits_budget else
                                   " — but its peak is OVER the budget"))
    if not result.fits_budget:
        raise typer.Exit(1)


@app.command()
@friendly_errors
def graph(
    model: Optional[str] = typer.Option(
        None, "--model", help="a zoo model (resnet18, bert-mini, ...) or MODULE:FACTORY, where "
        "FACTORY() returns (module, example_args) and module(*example_args) is the scalar loss"),
    onnx_file: Optional[str] = typer.Option(None, "--onnx", help="an ONNX model instead "
                                            "(forward with shapes + planned backward; planning "
                                            "only)"),
    batch: Optional[int] = typer.Option(None, "--batch", min=1, help="batch size"),
    image: Optional[int] = typer.Option(None, "--image", min=1, help="image height and width"),
    seq: Optional[int] = typer.Option(None, "--seq", min=1, help="sequence length"),
    seed: int = typer.Option(0, "--seed", help="seed for the model's initial weights"),
    optimizer: str = typer.Option("sgd", "--optimizer", help="sgd (momentum) | adamw"),
    max_nodes: int = typer.Option(DEFAULT_MAX_NODES, "--max-nodes", min=5,
                                  help="at most this many planner nodes: module-level groups, "
                                  "split down to single ops where memory is decided"),
    level: Optional[int] = typer.Option(None, "--level", min=1,
                                        help="start from this depth of the module tree "
                                             "(default: the finest within half of "
                                             "--max-nodes)"),
    params_home: str = typer.Option("ram", "--params-home", help="ram | flash: where "
                                    "parameters and optimizer state live between uses (flash: "
                                    "loaded and written back by planned nodes)"),
    train: Optional[list[str]] = typer.Option(None, "--train", help="train only parameters "
                                              "matching this pattern (repeatable, e.g. "
                                              "'fc.*'); the rest are frozen"),
    update: str = typer.Option("fused", "--update", help="fused (each group's optimizer step "
                               "as soon as its gradients are complete) | step (one step after "
                               "the backward; gradients are fixed memory)"),
    output: Optional[str] = typer.Option(None, "-o", "--output", help="where to write the graph"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Capture a model's training graph (forward + backward + update) for the planner."""
    from .graph_report import graph_summary, graph_table
    from .planner.build import plain_peak_bytes

    if (model is None) == (onnx_file is None):
        raise FormatError("command line", "--model/--onnx", "exactly one of them")
    if onnx_file is not None:
        from .onnx_import import graph_from_onnx
        g = graph_from_onnx(onnx_file, batch, optimizer, max_nodes)
    else:
        from edge_remat_agent.capture import capture_model
        g = capture_model(model, batch, image, seq, seed, optimizer, max_nodes, level,
                          update, params_home, train).graph
    if output:
        g.save(output)
    summary = graph_summary(g, plain_peak_bytes(g), output)
    if as_json:
        print(json.dumps(summary))
    else:
        typer.echo(graph_table(summary))
        if output:
            typer.echo(f"graph written to {output}")


@app.command()
def version() -> None:
    """Print the version."""
    from . import __version__
    typer.echo(__version__)


# -- boards: device configs, jobs on the agent, deploy (logic in remote.py / transport/) -----

@app.command()
def devices(
    names: list[str] = typer.Argument(None, metavar="[NAME]...",
                                      help="device names or config paths (default: all)"),
    check: bool = typer.Option(False, "--check", help="connect to each board and report python"
                               "/torch versions, free RAM and disk"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """List the device configs (device_configs/*.toml); --check connects to each board."""
    from .remote import board_errors, device_rows, devices_table

    @board_errors
    def run(as_json: bool) -> None:
        rows = device_rows(names or [], check)
        if as_json:
            print(json.dumps({"devices": rows}))
        else:
            typer.echo(devices_table(rows, check))
        if check and any(not r.get("check", {}).get("ok", False) for r in rows):
            raise typer.Exit(1)

    run(as_json=as_json)


@app.command()
def job(
    kind: str = typer.Argument(..., help="job kind, e.g. sysinfo, echo, sleep, run, profile"),
    device: str = typer.Option(..., "--device", help="device name or config path"),
    param: list[str] = typer.Option([], "--param", help="KEY=VALUE (VALUE read as JSON if it "
                                    "parses), repeatable"),
    params: Optional[str] = typer.Option(None, "--params", help="all params as a JSON object"),
    input_file: list[str] = typer.Option([], "--input", help="NAME=PATH: push PATH, pass its "
                                         "board path as param NAME; repeatable"),
    out: Optional[str] = typer.Option(None, "--out", help="folder for the job's output files"),
    job_id: Optional[str] = typer.Option(None, "--id", help="job id (same id = same job)"),
    detach: bool = typer.Option(False, "--detach", help="submit and return the job id"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Run a job on the board's agent; survives dropped links (reconnects, same job)."""
    from .devices import find_device
    from .remote import (board_errors, parse_inputs, parse_params, print_outcome,
                         show_progress, to_stderr)
    from .transport import Board

    @board_errors
    def run(as_json: bool) -> None:
        values = parse_params(params, param)
        inputs = parse_inputs(input_file)
        with Board(find_device(device), on_event=to_stderr) as board:
            if detach:
                for name, local in inputs.items():
                    values[name] = board.push_input(local)
                record = board.submit(kind, values, job_id)
                print(json.dumps({"status": record["state"], "job": record["id"]})
                      if as_json else record["id"])
                return
            record = board.run_job(kind, values, inputs, out, job_id,
                                   on_update=None if as_json else show_progress)
            print_outcome(record, as_json, board)

    run(as_json=as_json)


@app.command("job-status")
def job_status(
    job_id: str = typer.Argument(..., metavar="ID"),
    device: str = typer.Option(..., "--device", help="device name or config path"),
    wait: bool = typer.Option(False, "--wait", help="wait until the job is done"),
    out: Optional[str] = typer.Option(None, "--out", help="fetch its output files here"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Come back for a job: its state, progress and result (the board keeps them)."""
    from .devices import find_device
    from .remote import board_errors, print_outcome, show_progress, to_stderr
    from .transport import Board, JobFailed

    @board_errors
    def run(as_json: bool) -> None:
        with Board(find_device(device), on_event=to_stderr) as board:
            record = (board.wait(job_id, None if as_json else show_progress) if wait
                      else board.job(job_id))
            if record["state"] == "failed":
                raise JobFailed(f"job {job_id} failed on {board.name}: {record.get('error')}",
                                record)
            if out and record["state"] == "finished":
                record["fetched"] = [str(p) for p in board.fetch_outputs(record, out)]
            print_outcome(record, as_json, board)

    run(as_json=as_json)


@app.command("agent-stop")
def agent_stop(
    device: str = typer.Option(..., "--device", help="device name or config path"),
    if_idle: bool = typer.Option(False, "--if-idle", help="only when no job runs or waits"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Stop the agent daemon on the board cleanly (a running job resumes at its next start)."""
    from .devices import find_device
    from .remote import board_errors
    from .transport import Board

    @board_errors
    def run(as_json: bool) -> None:
        board = Board(find_device(device), reconnect_timeout_s=0)
        board.stop_agent(if_idle=if_idle)
        print(json.dumps({"status": "stopped"}) if as_json else f"agent on {board.name} stopped")

    run(as_json=as_json)


@app.command()
def deploy(
    plan_file: str = typer.Argument(..., metavar="PLAN"),
    device: str = typer.Option(..., "--device", help="device name or config path"),
    graph: str = typer.Option(..., "--graph", help="the graph the plan was made for"),
    steps: int = typer.Option(10, "--steps", help="training steps to run"),
    out: str = typer.Option(".", "--out", help="folder for the run report and other outputs"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Push the agent, the plan and the graph; run the plan on the board; fetch the report."""
    from .devices import find_device
    from .remote import board_errors, print_outcome, require_kind, show_progress, to_stderr
    from .transport import Board

    @board_errors
    def run(as_json: bool) -> None:
        from .transport.host_pages import host_pages, plan_uses_host
        plan = load_plan(plan_file)  # a bad plan is refused here, not on the board
        with Board(find_device(device), on_event=to_stderr) as board:
            require_kind(board, "run", "execute plans")
            with host_pages(board, plan_uses_host(plan), to_stderr) as page_params:
                record = board.run_job("run", {"steps": steps, **page_params},
                                       {"plan": plan_file, "graph": graph}, out,
                                       on_update=None if as_json else show_progress)
            print_outcome(record, as_json, board)

    run(as_json=as_json)


@app.command()
def profile(
    device: str = typer.Option(..., "--device", help="device name or config path"),
    graph: Optional[str] = typer.Option(None, "--graph", help="graph whose nodes to measure"),
    param: list[str] = typer.Option([], "--param", help="KEY=VALUE for the profiler"),
    out: str = typer.Option("profiles", "--out", help="folder for the measured profile"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Measure the board (operators, storage tiers, power) with its agent; fetch the profile."""
    from .devices import find_device
    from .remote import (board_errors, parse_params, print_outcome, require_kind,
                         show_progress, to_stderr)
    from .transport import Board
    from .transport.host_pages import link_pages

    @board_errors
    def run(as_json: bool) -> None:
        values = parse_params(None, param)
        with Board(find_device(device), on_event=to_stderr) as board:
            require_kind(board, "profile", "profile boards")
            with link_pages(board, to_stderr) as page_params:
                record = board.run_job("profile", {**page_params, **values},
                                       {"graph": graph} if graph else {}, out,
                                       on_update=None if as_json else show_progress)
            print_outcome(record, as_json, board)

    run(as_json=as_json)


# -- end to end: `run` (logic in run/, run_report.py, plots.py, emulated.py) ---------------

EXIT_KILLED = 3


@app.command("run")
@friendly_errors
def run_command(
    device: str = typer.Option(..., "--device", help="device name or config path (local: this "
                               "machine; emulated-board: this machine in a memory cgroup)"),
    model: str = typer.Option(..., "--model", help="a zoo model (digits-cnn, resnet18, ...) or "
                              "MODULE:FACTORY"),
    budget: Optional[str] = typer.Option(None, "--budget", help="30% of the plain peak, or "
                                         "512MiB (default with --memory-limit: what the "
                                         "runtime leaves of it)"),
    objective: str = typer.Option("time", "--objective", help="time | energy"),
    deadline: Optional[str] = typer.Option(None, "--deadline", help="e.g. 1.3 = 1.3x plain time"),
    steps: int = typer.Option(10, "--steps", min=1, help="training steps"),
    data: Optional[str] = typer.Option(None, "--data", help="example | digits | MODULE:FUNCTION "
                                       "(default: digits for digits-cnn, else example)"),
    memory_limit: Optional[str] = typer.Option(None, "--memory-limit", help="emulate a board "
                                               "with this much RAM, e.g. 600MiB (a memory "
                                               "cgroup; local devices, root)"),
    plain: bool = typer.Option(False, "--plain", help="ordinary PyTorch training instead of the "
                               "plan (the comparison)"),
    batch: Optional[int] = typer.Option(None, "--batch", min=1),
    image: Optional[int] = typer.Option(None, "--image", min=1),
    seq: Optional[int] = typer.Option(None, "--seq", min=1),
    seed: int = typer.Option(0, "--seed"),
    optimizer: str = typer.Option("sgd", "--optimizer", help="sgd (momentum) | adamw"),
    lr: Optional[float] = typer.Option(None, "--lr", help="learning rate (sgd 0.1, adamw 1e-3)"),
    max_nodes: int = typer.Option(DEFAULT_MAX_NODES, "--max-nodes", min=5,
                                  help="at most this many planner nodes in the captured graph"),
    params_home: str = typer.Option("auto", "--params-home", help="ram | flash | auto (flash "
                                    "when the budget is below what RAM-homed parameters allow)"),
    train: Optional[list[str]] = typer.Option(None, "--train", help="train only parameters "
                                              "matching this pattern (repeatable); the rest "
                                              "are frozen"),
    profile_file: Optional[str] = typer.Option(None, "--profile", help="plan with this profile "
                                               "instead of measuring the board"),
    reprofile: bool = typer.Option(False, "--reprofile", help="measure again, ignoring the cache"),
    paging: Optional[str] = typer.Option(None, "--paging", help="none | flash | host | both"),
    solver: str = typer.Option("auto", "--solver", help="auto | cpsat | milp | heuristic:NAME"),
    time_limit: float = typer.Option(10.0, "--time-limit", help="seconds for the solver"),
    sweep: Optional[str] = typer.Option(None, "--sweep", help="also plan a budget sweep, e.g. "
                                        "0.2:1.0:0.1, and plot it"),
    out: str = typer.Option("edge-remat-run", "--out", help="folder for graph, plan, report, "
                            "plots"),
    no_plots: bool = typer.Option(False, "--no-plots", help="skip the PNG plots"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Fine-tune MODEL on DEVICE within a memory budget: capture, profile, plan, deploy, train,
    and report planned against measured. Exit status 3: the run was killed (out of memory)."""
    from .remote import board_errors, to_stderr
    from .run import RunOptions, RunProblem, run
    from .run_report import report_text
    from .units import parse_budget

    limit = None
    if memory_limit:
        kind, value = parse_budget(memory_limit)
        if kind != "bytes":
            raise FormatError("command line", "--memory-limit", "a size such as 600MiB",
                              memory_limit)
        limit = int(value)
    if objective not in ("time", "energy"):
        raise FormatError("command line", "--objective", "time or energy", objective)
    options = RunOptions(
        device=device, model=model, budget=budget, objective=objective,
        deadline=_multiplier(deadline), steps=steps, data=data,
        memory_limit=limit, plain=plain, batch=batch, image=image, seq=seq, seed=seed,
        optimizer=optimizer, lr=lr, max_nodes=max_nodes, params_home=params_home, train=train,
        profile=profile_file,
        reprofile=reprofile, paging=paging, solver=solver, time_limit=time_limit, sweep=sweep,
        out=out, plots=not no_plots)

    @board_errors
    def go(as_json: bool) -> None:
        try:
            report = run(options, say=to_stderr)
        except RunProblem as exc:
            _fail(str(exc), as_json)
        killed = report["status"] == "killed"
        if as_json:
            print(json.dumps(report, default=str))
        elif killed:
            typer.echo(_killed_line(report))
        else:
            typer.echo(report_text(report))
        if killed:
            raise typer.Exit(EXIT_KILLED)

    go(as_json=as_json)


@app.command("plot")
@friendly_errors
def plot_command(
    plan_file: Optional[str] = typer.Option(None, "--plan", help="a plan: schedule.png and "
                                            "memory.png"),
    graph: Optional[str] = typer.Option(None, "--graph", help="the graph the plan was made for"),
    sweep_file: Optional[str] = typer.Option(None, "--sweep", help="the output of `edge-remat "
                                             "plan --sweep ... --json`: sweep.png"),
    out: str = typer.Option(".", "--out", help="folder for the PNG files"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Draw a plan (stage x node schedule; memory over one step against the budget) and a
    budget sweep (energy and time per step against memory) as PNG files."""
    from pathlib import Path

    from . import plots
    from .graph_import import load_graph_file

    if plan_file is None and sweep_file is None:
        raise FormatError("command line", "--plan/--sweep", "at least one of them")
    written = []
    if plan_file is not None:
        if graph is None:
            raise FormatError("command line", "--graph", "the graph the plan was made for")
        g, p = load_graph_file(graph), load_plan(plan_file)
        planned, plain = plots.memory_traces(g, p)
        written += [plots.plot_schedule(g, p, Path(out) / "schedule.png"),
                    plots.plot_memory(planned, p.budget_bytes, Path(out) / "memory.png",
                                      plain=plain)]
    if sweep_file is not None:
        try:
            rows = json.loads(Path(sweep_file).read_text())["sweep"]
        except (OSError, ValueError, KeyError) as exc:
            raise FormatError(sweep_file, "sweep", "the JSON `edge-remat plan --sweep ... "
                              "--json` prints", str(exc)) from None
        written.append(plots.plot_sweep(rows, Path(out) / "sweep.png"))
    if as_json:
        print(json.dumps({"plots": [str(p) for p in written]}))
    else:
        typer.echo("\n".join(f"wrote {p}" for p in written))


def _multiplier(text: Optional[str]) -> Optional[float]:
    from .units import parse_multiplier
    return parse_multiplier(text) if text else None


def _killed_line(report: dict) -> str:
    from .units import fmt_bytes
    what = "plain PyTorch training" if report["mode"] == "plain" else "the planned run"
    limit = report.get("memory_limit_bytes")
    figures = [f"{fmt_bytes(limit)} limit" if limit else "",
               f"kernel peak {fmt_bytes(report['kernel_peak_bytes'])}"
               if report.get("kernel_peak_bytes") else ""]
    detail = "; ".join(f for f in figures if f)
    return (f"{report['message']}: {what} of {report['model']} on {report['device']} needs more "
            f"memory than it has" + (f" ({detail})" if detail else ""))


def main() -> None:
    app(prog_name="edge-remat")


if __name__ == "__main__":
    sys.exit(main())
