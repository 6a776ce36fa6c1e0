"""The `edge-remat` command line. Planning and simulating import neither torch nor OR-Tools."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import sys
from typing import Optional

import typer

from edge_remat_agent.capture import DEFAULT_LR, DEFAULT_MAX_NODES, OPTIMIZER_HELP
from edge_remat_agent.capture import DTYPE_HELP, TRAINABLE_DTYPE_HELP
from edge_remat_agent.formats import FormatError, Tier, load_plan, load_profile

from .errors import EXIT_BAD_INPUT, EXIT_JOB_FAILED, EXIT_KILLED, UserError, cli_errors, fail
from .outputs import print_json
from .planner.interrupt import sigterm_as_ctrl_c
from .units import FRACTION_LIMIT

CLIP_HELP = ("clip the gradients' global 2-norm at this before the updates, as "
             "torch.nn.utils.clip_grad_norm_ (e.g. 1.0); every gradient then lives, or is "
             "paged, until the last is done")

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Fine-tune PyTorch models on boards whose RAM is too small: "
                       "profile, plan (rematerialization + paging), deploy. Exit status: 0 done, "
                       "1 a job failed, 2 bad input, 3 board unreachable, 4 killed by memory, "
                       "70 internal error, 130 interrupted, 141 stdout closed by its reader; "
                       "--debug (any command) shows tracebacks.")

FORCE_HELP = "overwrite an existing output file"
KEEP_RUNNING_HELP = ("on Ctrl-C leave the board's job running (default: cancel it) and say "
                     "how to come back for it")
SAVE_HELP = ("trained | all | none: the trained weights fetched to weights.pt (trained: the "
             "parameters that trained and the buffers; all: every parameter)")
CHECKPOINT_EVERY_HELP = ("write a checkpoint (parameters, optimizer state, step, data "
                         "position, RNG) after every N-th step and the last, into "
                         "OUT/checkpoint.pt; --resume OUT goes on from it")
SAVE_DEFAULT = "trained"  # as run's (run.options.RunOptions.save); this module loads no torch
LR_HELP = "learning rate (" + ", ".join(f"{name} {lr:g}" for name, lr in DEFAULT_LR.items()) + ")"
LR_SCHEDULE_HELP = ("constant | linear | cosine: the learning rate's decay over --steps, after "
                    "--warmup")
WARMUP_HELP = "steps of linear warmup from 0 to --lr (at most --steps)"
INIT_HELP = "start from this weights file (a run's weights.pt) instead of the model's own weights"
STOP_ON_NONFINITE_HELP = ("stop after the first step whose loss is NaN or infinite: exit 1 with "
                          "one error line; the report is still written and the last checkpoint "
                          "kept (default: go on as PyTorch would, and warn once)")


# The tier field each flash option gives: errors name the option, not the profile's field.
FLASH_OPTIONS = {"read_bytes_per_s": "--flash-read-bw", "write_bytes_per_s": "--flash-write-bw",
                 "latency_s": "--flash-latency", "read_j_per_byte": "--flash-energy-per-byte",
                 "write_j_per_byte": "--flash-energy-per-byte"}


def _tiers(read_bw, write_bw, latency, energy_per_byte) -> dict[str, Tier]:
    """The flash tier the options give, checked as a profile's tier is (tier_from: figures
    finite and >= 0, bandwidths > 0), so that no negative or NaN cost reaches the planner."""
    if read_bw is None and write_bw is None and latency is None and energy_per_byte is None:
        return {}
    if read_bw is None or write_bw is None:  # a latency alone has no tier to go to
        raise FormatError("command line", "--flash-read-bw/--flash-write-bw",
                          "both bandwidths, with the other --flash-* figures")
    from edge_remat_agent.formats.fields import Reader
    from edge_remat_agent.formats.profile import tier_from

    from .units import parse_rate
    fields = {"read_bytes_per_s": parse_rate(read_bw, "--flash-read-bw"),  # bytes a second
              "write_bytes_per_s": parse_rate(write_bw, "--flash-write-bw"),
              "latency_s": latency, "read_j_per_byte": energy_per_byte,
              "write_j_per_byte": energy_per_byte}
    fields = {key: value for key, value in fields.items() if value is not None}
    try:
        return {"flash": tier_from(Reader(fields, "command line"))}
    except FormatError as exc:
        raise FormatError("command line", FLASH_OPTIONS[exc.field], exc.expected,
                          fields[exc.field]) from None


def _kept_measured(tiers: dict[str, Tier], prof) -> dict[str, Tier]:
    """Command-line bandwidths replace a profile's tier of that name, but what only the board
    can measure stays: its compute share (what IO costs compute beside it) and its capacity."""
    measured = prof.tiers if prof else {}
    return {name: dataclasses.replace(
                tier, compute_share=measured[name].compute_share,
                capacity_bytes=(tier.capacity_bytes if tier.capacity_bytes is not None
                                else measured[name].capacity_bytes))
            if name in measured else tier for name, tier in tiers.items()}


BUDGET_HELP = (f"0.8 or 80% of the plain peak (a bare number below {FRACTION_LIMIT} is a "
               "fraction of it, from there a byte count), or 512MiB")


@app.command()
@cli_errors
def plan(
    ctx: typer.Context,
    graph: str = typer.Option(..., "--graph", help="graph file (ours, node-link, or POET's)"),
    budget: Optional[str] = typer.Option(None, "--budget",
                                         help=BUDGET_HELP),
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
    paging_io: str = typer.Option("overlap", "--paging-io",
                                  help="overlap (prefetch and write-behind beside compute) | "
                                       "sync (paging stops compute)"),
    order: str = typer.Option("auto", "--order",
                              help="auto | given | memory: the execution order planned; memory "
                                   "(auto: where it leaves less above the budget) reorders a "
                                   "graph the executor does not replay"),
    backend: str = typer.Option("cbc", "--backend", help="MILP backend: cbc | highs"),
    workers: Optional[int] = typer.Option(None, "--workers", "--threads",
                                          help="solver threads (default: all cores)"),
    flash_read_bw: Optional[str] = typer.Option(None, "--flash-read-bw",
                                                help="bytes a second, e.g. 90MB/s"),
    flash_write_bw: Optional[str] = typer.Option(None, "--flash-write-bw",
                                                 help="bytes a second, e.g. 40MB/s"),
    flash_latency: Optional[float] = typer.Option(None, "--flash-latency", help="seconds"),
    flash_energy_per_byte: Optional[float] = typer.Option(None, "--flash-energy-per-byte",
                                                          help="joules per byte moved"),
    arena: str = typer.Option("best-fit", "--arena", help="lay every planned tensor out in one "
                              "arena: best-fit | cpsat (exact, within --arena-time-limit) | none"),
    arena_time_limit: float = typer.Option(10.0, "--arena-time-limit",
                                           help="seconds for the cpsat arena layout"),
    arena_fit: bool = typer.Option(False, "--arena-fit",
                                   help="where the arena and fixed memory pass the budget "
                                        "(fragmentation), solve again at a budget lowered by "
                                        "the overshoot until they fit (for --allocator arena)"),
    force: bool = typer.Option(False, "--force", help=FORCE_HELP),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Solve for the cheapest schedule that fits the memory budget; write it as a plan."""
    from .checks import note_budget_above_ram, note_profile_fit, note_share_fallback
    from .importers.graph_import import load_graph_file
    from .outputs import output_file, output_folder
    from .planner.build import PAGING_CHOICES, build_problem, plain_peak_bytes
    from .planner.ordering import ORDER_SHARE, ORDERS
    from .planner.plan_file import make_plan
    from .remote import to_stderr
    from .reports.report import plan_table, problem_cost_units

    # The options first, then the files: nothing slow happens before all of them are checked.
    if objective not in ("time", "energy"):
        raise FormatError("command line", "--objective", "time or energy", objective)
    if paging_time not in ("counted", "free"):
        raise FormatError("command line", "--paging-time", "counted or free", paging_time)
    if paging_io not in ("overlap", "sync"):
        raise FormatError("command line", "--paging-io", "overlap or sync", paging_io)
    if paging is not None and paging not in PAGING_CHOICES:
        raise FormatError("command line", "--paging", " | ".join(PAGING_CHOICES), paging)
    if order not in ORDERS:
        raise FormatError("command line", "--order", " | ".join(ORDERS), order)
    if (budget is None) == (sweep is None):
        raise FormatError("command line", "--budget", "exactly one of --budget and --sweep")
    from .checks import check_solver_options
    check_solver_options(solver, time_limit, workers, backend)
    from .planner.arena import ARENA_METHODS
    if arena not in ARENA_METHODS:
        raise FormatError("command line", "--arena", " | ".join(ARENA_METHODS), arena)
    if not arena_time_limit > 0:
        raise FormatError("command line", "--arena-time-limit", "seconds above 0",
                          arena_time_limit)
    if arena == "none" and arena_fit:
        raise UserError("--arena-fit fits the plan's arena to the budget, and --arena none lays "
                        "out no arena: drop --arena-fit, or give --arena best-fit or cpsat")
    target_deadline = _deadline(deadline)
    if sweep is not None:
        from .sweep import parse_sweep
        parse_sweep(sweep)
    else:
        from .units import Budget, bare_bytes_note
        budget_value = Budget.parse(budget)
        if (note := bare_bytes_note(budget)) is not None:
            to_stderr(f"warning: {note}")
    flash_tier = _tiers(flash_read_bw, flash_write_bw, flash_latency, flash_energy_per_byte)
    if output is not None:  # `-o ''` too, which is refused
        inputs = {"--graph": graph, "--profile": profile}
        (output_folder(output, "-o", inputs, writes=(SWEEP_PLANS, SWEEP_TABLE), force=force)
         if sweep is not None
         else output_file(output, force, inputs=inputs))
    g = load_graph_file(graph)
    prof = load_profile(profile) if profile else None
    note_profile_fit(prof, g, str(profile), to_stderr)
    tiers = _kept_measured(flash_tier, prof)
    from edge_remat_agent.costs import build_costs
    costs = build_costs(g, prof, tiers)  # once: the checks below and every problem read it
    for line in _unused_options(ctx, costs, paging, paging_time, solver, arena,
                                sweep is not None, bool(flash_tier), objective):
        to_stderr(f"warning: {line}")
    if (units := _units_mixed(g, prof, bool(flash_tier))) is not None:
        to_stderr(f"warning: {units}")

    plain_peak = functools.cache(lambda: plain_peak_bytes(g, prof))  # once, for fractions

    def make_problem(budget):
        return build_problem(g, budget, prof, objective, target_deadline, paging, tiers,
                             paging_time, plain_peak() if budget.fraction is not None else None,
                             io=paging_io, order=order, order_time_s=ORDER_SHARE * time_limit,
                             costs=costs)

    from .planner.interrupt import PlanInterrupted, sigterm_as_ctrl_c, stopped_by
    if sweep is not None:
        with sigterm_as_ctrl_c():
            _plan_sweep(make_problem, sweep, solver, time_limit, backend, workers, output,
                        as_json, objective)
        return
    from .planner.problem import InfeasibleBudget, training_state_remedy
    from .planner.status_line import status_line
    interrupted = False
    try:
        # on a terminal only: a log or a pipe gets the table alone
        with sigterm_as_ctrl_c(), status_line(not as_json and sys.stderr.isatty()) as progress:
            plain = plain_peak() if budget_value.fraction is not None else None
            result, report = make_plan(g, budget_value, prof, objective, target_deadline,
                                       paging, tiers, paging_time, solver, time_limit,
                                       backend, workers, progress, plain, io=paging_io,
                                       arena=arena, arena_time_limit=arena_time_limit,
                                       order=order, arena_fit=arena_fit, costs=costs)
    except InfeasibleBudget as error:  # what lowers a floor of RAM-held training state
        raise InfeasibleBudget(str(error) + training_state_remedy(g, error.smallest_bytes),
                               error.smallest_bytes) from None
    except PlanInterrupted as stop:  # Ctrl-C or SIGTERM: the best plan so far is written
        result, report, interrupted = stop.report.plan.to_dict(), stop.report, True
    except KeyboardInterrupt:  # before any plan within the budget: say so, and what helps
        from .errors import Interrupted
        raise Interrupted(f"interrupted ({stopped_by()}) before any plan within the budget was "
                          "found, so nothing was written: let it run longer, or give a larger "
                          "--budget, which plans sooner") from None
    note_budget_above_ram(prof, result["budget_bytes"], str(profile), to_stderr,
                          result["predicted"].get("peak_bytes"))
    note_share_fallback(prof, result, str(profile), to_stderr)
    if output:
        report.plan.save(output)
    stopped = (f"interrupted ({stopped_by()}); the plan "
               + (f"written to {output}" if output else "above")
               + " is the best found so far, within the budget") if interrupted else None
    if as_json:
        pr, s = result["predicted"], result["solver"]
        print_json({
            "status": s["status"], "solver": s["name"], "budget_bytes": result["budget_bytes"],
            "peak_bytes": pr["peak_bytes"], "tdi_percent": pr["tdi_percent"],
            # the table's figures: time and energy with their parts (QA: energy_j was not
            # compute + paging, with no static energy nor paging time to tell why)
            "time_s": pr["time_s"], "paging_time_s": pr["paging_time_s"],
            "paging_hidden_share": pr.get("paging_hidden_share"),
            "home_io_time_s": pr.get("home_io_time_s", 0.0), "home_reads": pr.get("home_reads", 0),
            "energy_j": pr["energy_j"], "energy_compute_j": pr["energy_compute_j"],
            "home_io_energy_j": pr.get("home_io_energy_j", 0.0),
            "energy_paging_j": pr["energy_paging_j"], "energy_static_j": pr["energy_static_j"],
            "recomputed": pr["recomputed"], "page_ins": pr["page_ins"],
            "page_outs": pr["page_outs"], "lower_bound": s["lower_bound"], "gap": s["gap"],
            "solve_time_s": s["solve_time_s"], "baselines": s["baselines"],
            # what the table says beside the figures: the bound's scope, when the plans came,
            # the order, who proved or fell back, and the unit of time and energy
            **{key: s[key] for key in ("bound_scope", "first_plan_s", "best_plan_s",
                                       "fallback_from", "proven_optimal_by") if key in s},
            "order": result.get("problem", {}).get("order"),
            **({"accumulated_step": pr["accumulated_step"]} if "accumulated_step" in pr else {}),
            "units": dict(zip(("time", "energy"), problem_cost_units(result.get("problem", {})))),
            "arena": _arena_summary(result), "plan": output,
            **({"error": stopped} if stopped else {})})
    else:
        typer.echo(plan_table(result))
        # without -o nothing is written: said, so the table is not taken for a saved plan (QA)
        typer.echo(f"plan written to {output}" if output else
                   "plan not written (no -o): give -o plan.json to keep it")
    _warn_arena_unfitted(result)
    if stopped:
        from .errors import EXIT_INTERRUPTED, fail
        fail(stopped, EXIT_INTERRUPTED)


def _unused_options(ctx: typer.Context, costs, paging, paging_time, solver, arena,
                    sweep: bool, flash_given: bool, objective: str = "time") -> list[str]:
    """Options the plan would silently ignore, given with others that rule them out: each a
    warning (the plan is still right), so that no one believes they took effect."""
    def typed(option: str) -> bool:  # given on the command line, not left at its default
        source = ctx.get_parameter_source(option)  # click's enum (typer may vendor click)
        return source is not None and source.name == "COMMANDLINE"

    from .planner.build import PAGING_CHOICES, paging_tiers
    unused = []
    if flash_given and paging is not None and "flash" not in PAGING_CHOICES.get(paging, ()):
        unused.append(f"the --flash-* figures are unused: --paging {paging} pages to no flash "
                      "(use --paging flash or both to page there)")
    if paging_time == "free" and not paging_tiers(paging, costs):
        unused.append("--paging-time free is unused: this plan pages nothing (" +
                      ("--paging none" if paging == "none" else "no tier's costs are given: a "
                       "profile with one, or --flash-read-bw/--flash-write-bw") + ")")
    if typed("backend") and solver not in ("auto", "milp"):
        unused.append(f"--backend is unused: only the MILP solver has one, and --solver {solver} "
                      "runs no MILP (--solver milp does)")
    if sweep and any(typed(name) for name in ("arena", "arena_fit", "arena_time_limit")):
        unused.append("the --arena* options are unused with --sweep: a sweep's plans carry no "
                      "arena (plan one --budget for one)")
    elif typed("arena_time_limit") and arena != "cpsat":
        unused.append(f"--arena-time-limit is unused: it limits --arena cpsat's layout, and "
                      f"--arena {arena} solves none")
    if objective == "energy" and costs.power_source == "default":
        # the table's joules were then 1 W x the step time, no idle power: no board's figures
        unused.append("--objective energy has no power to count: without a profile (or node "
                      "energies in the graph) compute is costed at 1 W and idle power at 0, so "
                      "the energies shown are not a board's; give --profile with the board's "
                      "power")
    elif objective == "energy" and not costs.static_w and not any(costs.energy_j) and not any(
            t.out_energy_j[i] or t.in_energy_j[i] for t in costs.tiers.values()
            for i in range(len(t.out_energy_j))):
        # QA: a profile with idle_w and active_w of 0 gave 0 J and "proven optimal", no word
        unused.append(f"--objective energy has no power to count: the costs' power "
                      f"({costs.power_source}) is 0 W, idle and busy, and paging costs no "
                      "energy, so every plan costs 0 J and any fitting plan is optimal; give a "
                      "profile with the board's power, or --objective time")
    return unused


def _warn_arena_unfitted(plan_dict: dict) -> None:
    """--arena-fit that could not fit the arena: a warning, not an error. The plan is kept and
    written (it fits the budget under `run --allocator glibc`, and says by how much the arena
    passes it), but it must not look fine for `run --allocator arena`."""
    from .reports.report import arena_fit_note, arena_over_budget
    arena = plan_dict.get("arena")
    if arena is None or "tries" not in arena["details"].get("fit", {}):
        return
    if arena_over_budget(plan_dict) > 0:
        typer.echo(f"warning: {arena_fit_note(plan_dict)}", err=True)


def _arena_summary(plan_dict: dict) -> Optional[dict]:
    from .reports.report import arena_over_budget
    arena = plan_dict.get("arena")
    if arena is None:
        return None
    return {"method": arena["method"], "size_bytes": arena["size_bytes"],
            "over_budget_bytes": arena_over_budget(plan_dict), **{
                key: arena["details"].get(key) for key in ("status", "lower_bound_bytes",
                                                           "planned_tensor_peak_bytes",
                                                           "over_tensor_peak", "fit")
                if key in arena["details"]}}


SWEEP_PLANS = "plan-*.json"  # a sweep's plan files in its -o folder (plan-0.30.json, ...)
SWEEP_TABLE = "sweep.json"  # beside them: what --json prints, which `plot --sweep DIR` reads


def _plan_sweep(make_problem, sweep: str, solver: str, time_limit: float, backend: str,
                workers: Optional[int], output: Optional[str], as_json: bool,
                objective: str) -> None:
    from pathlib import Path

    from .reports.report import sweep_cost_units, sweep_table
    from edge_remat_agent.units import counted

    from .sweep import (SweepInterrupted, fraction_labels, no_plan_error, parse_sweep,
                        run_sweep, smallest_feasible)

    budgets = parse_sweep(sweep)
    labels = fraction_labels(budgets)  # of every budget asked: an interrupted sweep's too
    try:
        points, interrupted = run_sweep(make_problem, budgets, solver, time_limit,
                                        backend, workers), False
    except SweepInterrupted as stop:  # Ctrl-C: the budgets solved so far are kept
        if not stop.points:
            raise
        points, interrupted = stop.points, True
    planned = sum(point.report is not None for point in points)
    if not planned and not interrupted:  # an error, as for one budget: nothing written
        raise no_plan_error(points)
    names = [f"plan-{labels[point.fraction]}.json" for point in points if point.report]
    if len(set(names)) != len(names):  # one plan written over another (QA: 0.505 and 0.51)
        raise RuntimeError(f"two budgets of the sweep would write one plan file: {names}")
    rows, written = [], set()
    for point in points:
        row = {"fraction": point.fraction, "label": labels[point.fraction],
               "budget_bytes": point.budget_bytes,
               "status": point.status, "message": point.message or None,
               **smallest_feasible(point)}
        if point.report is not None:
            pr, s = point.report.plan.predicted, point.report.plan.solver
            row.update(solver=s["name"], tdi_percent=pr["tdi_percent"], time_s=pr["time_s"],
                       energy_j=pr["energy_j"], peak_bytes=pr["peak_bytes"],
                       lower_bound=s["lower_bound"], gap=s["gap"],
                       solve_time_s=s["solve_time_s"])
            if output:
                path = Path(output) / f"plan-{labels[point.fraction]}.json"
                path.parent.mkdir(parents=True, exist_ok=True)
                point.report.plan.save(path)
                row["plan"] = str(path)
                written.add(path.name)
        rows.append(row)
    if output and written:  # an earlier sweep's plans (--force) would read as this one's (QA)
        from .remote import to_stderr
        earlier = sorted(p for p in Path(output).glob(SWEEP_PLANS) if p.name not in written)
        for path in earlier:
            path.unlink()
        if earlier:
            to_stderr(f"removed {counted(len(earlier), 'plan')} of an earlier sweep from "
                      f"{output} ({', '.join(p.name for p in earlier[:3])}"
                      f"{', ...' if len(earlier) > 3 else ''})")
    from .planner.interrupt import stopped_by
    # the budget as the table, its plan file and sweep.json say it (QA: 'at budget 0.9' over
    # a table of 0.900 and plan-0.900.json)
    stopped = (f"interrupted ({stopped_by()}) at budget {labels[points[-1].fraction]}; the "
               f"{len(points)} budget(s) above are what was solved"
               + (" (the last one's plan is the best found so far)"
                  if points[-1].status == "interrupted" else "")) if interrupted else None
    table = {"objective": objective, "sweep": rows,
             "units": dict(zip(("time", "energy"), sweep_cost_units(points))),
             **({"status": "interrupted", "error": stopped} if stopped else {})}
    if output and planned:  # QA: `plot --sweep DIR` had nothing to read but --json's stdout
        from edge_remat_agent.formats.fields import dump_json  # atomic; a failure names it
        dump_json(table, Path(output) / SWEEP_TABLE)
    if as_json:
        print_json(table)
    else:
        typer.echo(sweep_table(points, objective, labels))
        if output and planned:
            # of every budget asked (QA: interrupted at the third of 8, "2 plans of 2 budgets");
            # the files written, one a plan (QA: "5 plans" were 3 files)
            typer.echo(f"{counted(len(written), 'plan')} of {counted(len(budgets), 'budget')} "
                       f"written to {output}/, with the table in {SWEEP_TABLE}")
    if stopped:
        from .errors import EXIT_INTERRUPTED, fail
        fail(stopped, EXIT_INTERRUPTED)


@app.command()
@cli_errors
def simulate(
    plan_file: str = typer.Argument(..., metavar="PLAN"),
    graph: str = typer.Option(..., "--graph", help="the graph the plan was made for"),
    profile: Optional[str] = typer.Option(None, "--profile", help="profile for costs"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Replay a plan: check every instruction and add up peak RAM, time, energy and TDI."""
    from .checks import (note_profile_fit, recorded_figures_warning, replay, replay_costs,
                         replay_summary, replayed_profile_note, tiers_not_replayed)
    from .importers.graph_import import load_graph_file
    from .remote import to_stderr
    from .reports.report import sim_table

    g = load_graph_file(graph)
    p = load_plan(plan_file)
    prof = load_profile(profile) if profile else None
    note_profile_fit(prof, g, str(profile), to_stderr)
    if (units := _units_mixed(g, prof, False)) is not None:
        to_stderr(f"warning: {units}")
    result = replay(p, g, plan_file, graph, prof)
    summary = replay_summary(p, g, result, prof)
    if (other_costs := replayed_profile_note(p, prof)) is not None:
        to_stderr(other_costs)
    if prof is not None and (kept := tiers_not_replayed(p, prof)):
        to_stderr(f"note: {profile} gives other figures for {' and '.join(kept)} than the plan "
                  "was made with; the replay pages at the plan's (plan again with this "
                  "profile to page at its figures)")
    if (stale := recorded_figures_warning(p, plan_file, summary, prof)) is not None:
        to_stderr(stale)
    if prof is not None:  # QA: "valid plan" for a 2.33 MiB plan on a 192 KiB board
        from .checks import note_above_ram
        note_above_ram(prof.ram_total_bytes, "the plan's peak", result.peak_bytes,
                       f"{profile} gives its board", "plan again with a budget in bytes below it",
                       to_stderr)
    # A plan that breaks its own budget is bad input, not a job that failed on a board.
    over = None if result.fits_budget else (f"the plan's peak, {result.peak_bytes} bytes, is "
                                            f"over its budget of {p.budget_bytes} bytes")
    if as_json:  # the one object: with --json, a failure's has its status and error
        replayed = {"valid": True, "budget_bytes": p.budget_bytes, **summary}
        if over:
            fail(over, EXIT_BAD_INPUT, as_json=True, **replayed)
        print_json(replayed)
    else:
        typer.echo(sim_table(summary, p.budget_bytes, replay_costs(p, g, prof).cost_source))
        typer.echo("valid plan" + ("" if result.fits_budget else
                                   " — but its peak is OVER the budget"))
    if over:
        fail(over, EXIT_BAD_INPUT)


ACCUMULATE_HELP = ("gradient accumulation: K micro-batches of --batch per optimizer step, each "
                   "loss divided by K, gradients summed in buffers kept resident (1: none)")


def _check_accumulate(k: int) -> None:
    from edge_remat_agent.accumulation import check_micro_batches
    try:
        check_micro_batches(k)
    except ValueError as error:
        raise UserError(str(error)) from None


@app.command()
@cli_errors
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
    optimizer: str = typer.Option("sgd", "--optimizer", help=OPTIMIZER_HELP),
    dtype: str = typer.Option("fp32", "--dtype", help=DTYPE_HELP),
    trainable_dtype: Optional[str] = typer.Option(None, "--trainable-dtype",
                                                  help=TRAINABLE_DTYPE_HELP),
    max_nodes: Optional[int] = typer.Option(None, "--max-nodes", min=5,
                                            help="at most this many planner nodes: "
                                            "module-level groups, split down to single ops "
                                            "where memory is decided (default "
                                            f"{DEFAULT_MAX_NODES}; not with --operator-level)"),
    level: Optional[int] = typer.Option(None, "--level", min=1,
                                        help="start from this depth of the module tree "
                                             "(default: the finest within half of "
                                             "--max-nodes)"),
    operator_level: bool = typer.Option(False, "--operator-level", help="one planner node per "
                                        "ATen op that allocates (hundreds to thousands of "
                                        "nodes, as many as the model has); --max-nodes and "
                                        "--level are refused with it"),
    params_home: str = typer.Option("ram", "--params-home", help="ram | flash: where "
                                    "parameters and optimizer state live between uses (flash: "
                                    "loaded and written back by planned nodes)"),
    train: Optional[list[str]] = typer.Option(None, "--train", help="train only parameters "
                                              "matching this pattern (repeatable, e.g. "
                                              "'fc.*'); the rest are frozen"),
    update: str = typer.Option("fused", "--update", help="fused (each group's optimizer step "
                               "as soon as its gradients are complete) | step (one step after "
                               "the backward; gradients are fixed memory)"),
    clip_grad_norm: Optional[float] = typer.Option(None, "--clip-grad-norm", help=CLIP_HELP),
    accumulate: int = typer.Option(1, "--accumulate", help=ACCUMULATE_HELP),
    output: Optional[str] = typer.Option(None, "-o", "--output", help="where to write the graph"),
    force: bool = typer.Option(False, "--force", help=FORCE_HELP),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Capture a model's training graph (forward + backward + update) for the planner."""
    from .reports.graph_report import graph_summary, graph_table
    from .outputs import output_file
    from .planner.build import plain_peak_bytes

    if (model is None) == (onnx_file is None):
        raise FormatError("command line", "--model/--onnx", "exactly one of them")
    _check_accumulate(accumulate)
    if onnx_file is not None and accumulate > 1:
        raise UserError("--accumulate trains a captured model over micro-batches: use it with "
                        "--model, not --onnx (an imported graph is for planning only)")
    if optimizer not in DEFAULT_LR:
        raise UserError(f"unknown --optimizer {optimizer!r}: use one of {', '.join(DEFAULT_LR)}")
    if clip_grad_norm is not None:
        from edge_remat.run.options import checked_max_norm
        checked_max_norm(clip_grad_norm)
        if onnx_file is not None:
            raise UserError("--clip-grad-norm adds a node to a captured model's training step: "
                            "use it with --model, not --onnx")
    _check_dtype(dtype, onnx_file, trainable_dtype)
    if output is not None:  # `-o ''` too, which is refused
        from edge_remat_agent.user_code import spec_file
        output_file(output, force, inputs={"--onnx": onnx_file,
                                           "--model": spec_file(model) if model else None})
    if onnx_file is not None and operator_level:
        raise UserError("--operator-level splits a captured model's ATen ops: use it with "
                        "--model, not --onnx")
    if onnx_file is not None:  # QA: each was accepted and ignored, the graph unchanged
        for option, given, keeps in (
                ("--params-home", params_home != "ram", "keeps its parameters in RAM"),
                ("--train", bool(train), "trains all its parameters"),
                ("--update", update != "fused", "has one optimizer step after the backward"),
                ("--level", level is not None, "groups its ops by the heavy ones, Conv, "
                 "MatMul and the like")):
            if given:
                raise UserError(f"{option} shapes a captured model's training step: use it "
                                f"with --model, not --onnx (an imported graph {keeps})")
    from .granularity import granularity_mistake
    if (mistake := granularity_mistake(operator_level, max_nodes, level)) is not None:
        raise UserError(mistake)  # they were dropped in silence
    max_nodes = DEFAULT_MAX_NODES if max_nodes is None else max_nodes
    from edge_remat_agent.formats.graph_details import PARAM_HOMES
    if params_home not in PARAM_HOMES:  # an option's mistake, not the model's (QA: "cannot
        # capture model 'mlp': the parameters' home must be ...", where run takes auto)
        raise FormatError("command line", "--params-home", " or ".join(PARAM_HOMES) + " (auto "
                          "is run's: it picks by the budget, which a graph has none of)",
                          params_home)
    from .remote import to_stderr
    for line in _shape_options_without_effect(model, image, seq):
        to_stderr(f"warning: {line}")
    if onnx_file is not None:
        from .importers.onnx_import import graph_from_onnx, onnx_warnings
        g = graph_from_onnx(onnx_file, batch, optimizer, max_nodes, seq)
        for line in onnx_warnings(g):
            to_stderr(f"warning: {line}")
        if batch is not None and g.batch != batch:
            to_stderr(f"warning: --batch {batch} has no effect: {onnx_file} fixes the batch at "
                      f"{g.batch} (no input dimension is symbolic); export it with a dynamic "
                      "batch dimension (torch.onnx.export's dynamic_axes or dynamic_shapes) to "
                      "choose the batch here")
    else:
        from edge_remat_agent.capture import capture_model
        captured = capture_model(model, batch, image, seq, seed, optimizer, max_nodes, level,
                                 update, params_home, train, operator_level=operator_level,
                                 clip_grad_norm=clip_grad_norm, accumulate=accumulate,
                                 dtype=dtype, trainable_dtype=trainable_dtype)
        from edge_remat_agent.capture.advice import capture_warnings
        for line in capture_warnings(captured):
            to_stderr(f"warning: {line}")
        g = captured.graph
    if output:
        g.save(output)
    summary = graph_summary(g, plain_peak_bytes(g), output)
    if as_json:
        print_json(summary)
    else:
        typer.echo(graph_table(summary))
        typer.echo(f"graph written to {output}" if output else
                   "graph not written (no -o): give -o graph.json to keep it")


def _check_dtype(dtype: str, onnx_file: Optional[str] = None,
                 trainable_dtype: Optional[str] = None) -> None:
    from .run.options import check_dtypes
    check_dtypes(dtype, trainable_dtype)
    if onnx_file is not None and (dtype != "fp32" or trainable_dtype is not None):
        raise UserError("--dtype and --trainable-dtype convert a captured model; an --onnx "
                        "graph keeps the file's own dtypes: leave them out, or capture the "
                        "model with --model")


def _units_mixed(g, prof, flash_given: bool) -> Optional[str]:
    """Why seconds and watts mean nothing beside a graph whose node costs are cost units (a
    published or synthetic graph), where a profile or a flash bandwidth brings them (QA:
    paging became '0.0006767 cost units', nearly free, and energy 5 W x cost units)."""
    from .reports.report import COST_UNIT_SOURCES
    if g.cost_source not in COST_UNIT_SOURCES or not (flash_given or prof is not None):
        return None
    what = "--flash-read-bw / --flash-write-bw" if flash_given else "the profile"
    return (f"{g.name}'s node costs are cost units, not seconds; {what} gives seconds (and "
            "watts), so paging and energy set beside them are on another scale")


def _shape_options_without_effect(model: Optional[str], image: Optional[int],
                                  seq: Optional[int]) -> list[str]:
    """Why each of --image and --seq given does nothing: the zoo's table says which one a
    model reads (zoo.READS), an hf: model's task does; an ONNX file's open input dimensions
    take --batch and --seq (onnx_warnings says where --seq had none to set)."""
    if image is None and seq is None:
        return []  # nothing to say, and no torch to import for it (the zoo's and hf's tables)
    if model is not None:
        from edge_remat_agent.capture.hf_spec import is_hf_spec
        from edge_remat_agent.zoo import options_without_effect
        if is_hf_spec(model):
            from edge_remat_agent.capture import hf
            return hf.options_without_effect(model, image, seq)
        return options_without_effect(model, image, seq)
    return [] if image is None else [
        "--image has no effect with --onnx: the file's open input dimensions take --batch "
        "(the leading one) and --seq (the others)"]


from .fleet.cli import app as fleet_app  # noqa: E402 - `edge-remat fleet plan` (fleet/)
app.add_typer(fleet_app, name="fleet")


@app.command()
@cli_errors  # as every command: `edge-remat version | true` is not a failure
def version() -> None:
    """Print the version."""
    from . import __version__
    typer.echo(__version__)


# -- boards: device configs, jobs on the agent, deploy (logic in remote.py / transport/) -----

@app.command()
@cli_errors
@sigterm_as_ctrl_c()  # --check waits on boards: SIGTERM stops it as Ctrl-C does (exit 130)
def devices(
    names: list[str] = typer.Argument(None, metavar="[NAME]...",
                                      help="device names or config paths (default: all)"),
    check: bool = typer.Option(False, "--check", help="connect to each board and report python"
                               "/torch versions, free RAM and disk"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """List the device configs (device_configs/*.toml); --check connects to each board."""
    from .remote import device_rows, devices_table

    from edge_remat_agent.units import counted
    rows = device_rows(names or [], check)
    failed = [r["name"] for r in rows if check and not r.get("check", {}).get("ok", False)]
    # a board that cannot be reached or used: the status `deploy` would exit with
    error = failed and (f"{len(failed)} of {counted(len(rows), 'board')} failed the check: "
                        f"{', '.join(failed)}")
    if as_json:  # the error contract's fields, as every command's --json has them
        print_json({"status": "failed" if failed else "done", "devices": rows,
                    **({"error": error} if failed else {})})
    else:
        typer.echo(devices_table(rows, check))
    from .devices import shared_names
    for note in shared_names([(r["name"], r["config"]) for r in rows if "kind" in r]):
        typer.echo(f"warning: {note}", err=True)
    if failed:
        from .errors import EXIT_UNREACHABLE
        where = "each board's `check.error` in the JSON" if as_json else "above"
        typer.echo(f"error: {error} (why: {where})", err=True)
        raise typer.Exit(EXIT_UNREACHABLE)


@app.command()
@cli_errors
@sigterm_as_ctrl_c()  # SIGTERM cancels the board's job as Ctrl-C does
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
    keep_running: bool = typer.Option(False, "--keep-running", help=KEEP_RUNNING_HELP),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Run a job on the board's agent; survives dropped links (reconnects, same job)."""
    from .devices import find_device
    from .outputs import output_folder
    from .remote import (host_page_outs, job_sent_line, parse_inputs, parse_params,
                         print_outcome, progress_printer, refuse_bad_job_params,
                         refuse_detached_host_pages, to_stderr)
    from .transport import Board
    from .transport.emulated import retired_at_exit
    from .transport.host_pages import host_pages

    from edge_remat_agent.daemon.layout import JOB_ID, JOB_ID_RULE

    from .errors import UserError
    if job_id is not None and not JOB_ID.match(job_id):  # before connecting: nothing is sent
        raise UserError(f"--id {job_id!r}: {JOB_ID_RULE}")
    values = parse_params(params, param)
    inputs = parse_inputs(input_file)
    if detach:  # no one waits for its record: what the board would refuse is refused now
        refuse_bad_job_params(kind, values, inputs)
        refuse_detached_host_pages(kind, values, inputs, device)  # no one holds its pages
    if out is not None:  # `--out ''` too, which is refused
        output_folder(out)
    with Board(find_device(device), on_event=to_stderr, keep_running=keep_running) as board, \
            retired_at_exit(board):
        if detach:
            record = board.submit(kind, board.push_inputs(values, inputs), job_id)
            if as_json:
                print_json({"status": record["state"], "job": record["id"]})
            else:
                print(record["id"])
            return
        # a plan that pages to the host: its page service for the job's life, as deploy's
        with host_pages(board, host_page_outs(kind, values, inputs) > 0,
                        to_stderr) as page_params:
            shown = job_sent_line(board) if as_json else progress_printer()
            record = board.run_job(kind, {**values, **page_params}, inputs, out, job_id,
                                   on_update=shown)
        if kind == "profile" and out is not None:  # as `profile` does
            from .run.profiles import remember_profiled
            remember_profiled(board, record["fetched"])
        print_outcome(record, as_json, board, shown)


EMULATED_BOARD_HELP = ("the board `run --memory-limit` emulated on this machine (its agent "
                       "works in a folder of its own)")


def _device(name: str, memory_limit: Optional[str]):
    """The device config NAME, or the board `run --device NAME --memory-limit` emulated."""
    from .transport.emulated import find_board
    from .units import parse_size
    return find_board(name, int(parse_size(memory_limit, "--memory-limit"))
                      if memory_limit else None)


@app.command("job-status")
@cli_errors
@sigterm_as_ctrl_c()  # SIGTERM stops waiting as Ctrl-C does
def job_status(
    job_id: Optional[str] = typer.Argument(None, metavar="[ID]", help="the job (left out: "
                                           "list the board's jobs)"),
    device: str = typer.Option(..., "--device", help="device name or config path"),
    wait: bool = typer.Option(False, "--wait", help="wait until the job is done"),
    out: Optional[str] = typer.Option(None, "--out", help="fetch its output files here"),
    memory_limit: Optional[str] = typer.Option(None, "--memory-limit",
                                               help=EMULATED_BOARD_HELP),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Come back for a job: its state, progress and result (the board keeps them); without
    an ID, the board's jobs, one a line (the id a `job-cancel` from another shell needs)."""
    from edge_remat_agent.wire.protocol import TERMINAL_STATES

    from .errors import Interrupted
    from .outputs import output_folder
    from .remote import progress_printer, to_stderr
    from .transport import Board
    from .transport.emulated import retire_emulated

    if job_id is None:
        if wait or out is not None:
            raise UserError(f"{'--wait' if wait else '--out'} needs a job ID: give one "
                            "(`edge-remat job-status --device D` lists them)")
        with Board(_device(device, memory_limit), on_event=to_stderr) as board:
            _list_jobs(board, as_json)
        return
    if out is not None:  # `--out ''` too, which is refused
        output_folder(out)
    with Board(_device(device, memory_limit), on_event=to_stderr) as board, \
            _emulated_twin_hinted(board, job_id):
        try:
            shown = None if as_json else progress_printer(since="job-status began waiting")
            record = (board.wait(job_id, shown) if wait
                      else board.job(job_id))
        except KeyboardInterrupt:  # someone else's job, maybe: waiting stops, the job goes on
            raise Interrupted(f"stopped waiting; job {job_id} keeps running on {board.name} "
                              f"(`edge-remat job-cancel {job_id} --device {device}` stops it)",
                              job=job_id, cancelled=False) from None
        try:
            _job_outcome(board, record, job_id, out, as_json, shown if wait else None)
        finally:
            if record["state"] in TERMINAL_STATES:  # as at a run's end (QA: after run
                retire_emulated(board)  # --keep-running and job-status --wait, both stayed up)


def _list_jobs(board, as_json: bool) -> None:
    """`job-status --device D`: the board's jobs, oldest first, as `job ID STATE [N%] [what]`
    lines (or --json's {"jobs": [records]})."""
    from .transport.board import summary
    jobs = sorted(board.jobs(), key=lambda record: (record.get("created_s") or 0,
                                                    str(record.get("id"))))
    if as_json:
        from .transport.errors import as_reported
        print_json({"status": "ok", "device": board.name,
                    "jobs": [as_reported(record) for record in jobs]})
    elif not jobs:
        typer.echo(f"no jobs on {board.name}")
    for record in jobs if not as_json else ():
        typer.echo(summary(record))


@contextlib.contextmanager
def _emulated_twin_hinted(board, job_id: str):
    """An unknown job that a `--memory-limit` run left on the board emulated on this device
    (its own folder) is said to be there, with the option that reaches it."""
    from .transport.emulated import emulated_twin_hint
    from .transport.errors import AgentError
    try:
        yield
    except AgentError as error:
        hint = emulated_twin_hint(board.device, job_id) if error.code == "unknown_job" else None
        if hint is None:
            raise
        raise AgentError(f"{error}; {hint}", error.code, error.details) from None


def _job_outcome(board, record: dict, job_id: str, out: Optional[str], as_json: bool,
                 shown=None) -> None:
    """job-status's answer for a job's record: its outputs fetched into `out` where it
    finished, a failure as its exit status, else the record printed (its state line by
    `shown`, the progress printer that waited for it, if one did)."""
    from pathlib import Path

    from edge_remat_agent.wire.protocol import TERMINAL_STATES

    from .remote import print_outcome, to_stderr
    from .run.come_back import settle_lost_report, settled_line
    from .transport.errors import job_failed
    if out and record["state"] == "finished":
        record["fetched"] = [str(p) for p in board.fetch_outputs(record, out)]
    if out and record["state"] in TERMINAL_STATES:  # a run's report said link_lost
        settled = settle_lost_report(Path(out), job_id, record)
        if settled is not None:
            to_stderr(settled_line(*settled, job_id, record))
    if record["state"] == "failed":
        raise job_failed(record, f"job {job_id}", board.name, board.stale_agent_cause())
    print_outcome(record, as_json, board, shown)


@app.command("job-cancel")
@cli_errors
def job_cancel(
    job_id: str = typer.Argument(..., metavar="ID"),
    device: str = typer.Option(..., "--device", help="device name or config path"),
    memory_limit: Optional[str] = typer.Option(None, "--memory-limit",
                                               help=EMULATED_BOARD_HELP),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Cancel a job on the board (queued: dropped; running: stopped, its files kept)."""
    from .remote import to_stderr
    from .transport import Board
    from .transport.board import CANCEL_WAIT_S
    from .transport.emulated import retire_emulated
    from edge_remat_agent.wire.protocol import TERMINAL_STATES

    with Board(_device(device, memory_limit), on_event=to_stderr) as board, \
            _emulated_twin_hinted(board, job_id):
        # A job that had ended before this cancel (finished, failed, cancelled before): the
        # cancel has nothing to do, which is no error of its own: a plain line saying so, exit
        # 0 (QA: a failed job's error was printed as the cancel's answer, with exit 0).
        record = board.job(job_id)
        already = record["state"] in TERMINAL_STATES
        if not already:
            record = board.cancel(job_id)
        if record["state"] not in TERMINAL_STATES:
            record = board.wait(job_id, timeout_s=CANCEL_WAIT_S)
        if record["state"] in TERMINAL_STATES:
            retire_emulated(board)
    from .transport.errors import as_reported
    if as_json:
        print_json({"status": as_reported(record)["state"], "job": job_id,
                    "error": record.get("error"), "already_ended": already})
    else:
        print(_cancel_line(record, job_id, board.name, already))


def _cancel_line(record: dict, job_id: str, board: str, already: bool) -> str:
    """job-cancel's answer: never an `error:` line, for the cancel did not fail."""
    from edge_remat_agent.wire.protocol import TERMINAL_STATES

    from .transport.errors import cancelled_by_host, killed_out_of_memory
    state, error = record["state"], record.get("error")
    if state not in TERMINAL_STATES:
        return f"job {job_id} on {board} was asked to stop and is still {state}"
    if state == "finished":
        return f"job {job_id} had already finished on {board}; nothing to cancel"
    if cancelled_by_host(record):
        return (f"job {job_id} on {board} had already been cancelled; nothing to cancel"
                if already else f"job {job_id} on {board}: {error}")
    if already and killed_out_of_memory(record):  # its state, as job-status says it
        return (f"job {job_id} had already been killed on {board} (out of memory); nothing "
                f"to cancel ({error})")
    if already:
        return (f"job {job_id} had already failed on {board}; nothing to cancel (it failed: "
                f"{error or 'no reason recorded'})")
    return f"job {job_id} on {board} failed as it was stopped: {error or state}"


@app.command("agent-stop")
@cli_errors
def agent_stop(
    device: str = typer.Option(..., "--device", help="device name or config path"),
    if_idle: bool = typer.Option(False, "--if-idle", help="only when no job runs or waits"),
    memory_limit: Optional[str] = typer.Option(None, "--memory-limit",
                                               help=EMULATED_BOARD_HELP),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Stop the agent daemon on the board cleanly (a running job starts again at its next
    start); with --if-idle a busy agent is left running (exit 0, and it says so)."""
    from .remote import stop_agent
    from .transport import Board

    # --memory-limit: the board `run --memory-limit` emulated, whose agent and cgroup were
    # otherwise left for good (QA)
    answer, line = stop_agent(Board(_device(device, memory_limit), reconnect_timeout_s=0),
                              if_idle)
    if as_json:
        print_json(answer)
    else:
        print(line)


@app.command()
@cli_errors
@sigterm_as_ctrl_c()  # SIGTERM cancels the board's job as Ctrl-C does
def deploy(
    plan_file: str = typer.Argument(..., metavar="PLAN"),
    device: str = typer.Option(..., "--device", help="device name or config path"),
    graph: str = typer.Option(..., "--graph", help="the graph the plan was made for"),
    steps: int = typer.Option(10, "--steps", help="training steps to run (at least 1)"),
    out: Optional[str] = typer.Option(None, "--out", help="folder for the run report and "
                                      "other outputs (default: this folder; --resume's)"),
    keep_running: bool = typer.Option(False, "--keep-running", help=KEEP_RUNNING_HELP),
    save: str = typer.Option(SAVE_DEFAULT, "--save", help=SAVE_HELP),
    init: Optional[str] = typer.Option(None, "--init", help=INIT_HELP),
    checkpoint_every: Optional[int] = typer.Option(None, "--checkpoint-every",
                                                   help=CHECKPOINT_EVERY_HELP),
    resume: Optional[str] = typer.Option(None, "--resume", help="OUT: go on from the "
                                         "checkpoint of the deploy in that folder (or on the "
                                         "board) to --steps in all, with the same plan's "
                                         "graph, --init, --lr-schedule, --warmup and --data "
                                         "(--lr may change); writes into OUT"),
    lr: Optional[float] = typer.Option(None, "--lr", help=LR_HELP),
    lr_schedule: str = typer.Option("constant", "--lr-schedule", help=LR_SCHEDULE_HELP),
    warmup: int = typer.Option(0, "--warmup", help=WARMUP_HELP),
    data: Optional[str] = typer.Option(None, "--data", help="example (default: the graph's "
                                       "example batch) | digits | text | MODULE:FUNCTION, "
                                       "as run's --data"),
    stop_on_nonfinite: bool = typer.Option(False, "--stop-on-nonfinite",
                                           help=STOP_ON_NONFINITE_HELP),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Push the agent, the plan and the graph; run the plan on the board; fetch the report
    and the trained weights (weights.pt), and with --checkpoint-every the last checkpoint."""
    from .checks import (check_plan, check_runnable, note_plan_above_ram,
                         recorded_figures_warning, replay_summary)
    from .devices import find_device
    from .importers.graph_import import load_graph_file
    from .outputs import output_folder
    from .remote import (fetched_file, job_sent_line, print_outcome, require_kind,
                         progress_printer, to_stderr)
    from .transport import Board

    # Everything the host can check, before anything is sent (the board checks again).
    from edge_remat_agent.lr_schedule import steps_refusal
    if (refusal := steps_refusal(steps)) is not None:
        raise UserError(refusal)
    from pathlib import Path

    from .run.options import (RunOptions, absolute_file_spec, check_data,
                               check_init_against_graph, check_learning_rate,
                               check_weights_options, run_default)
    opts = RunOptions(device=device, model="", steps=steps, save=save, init=init, lr=lr,
                      lr_schedule=lr_schedule, warmup=warmup, checkpoint_every=checkpoint_every,
                      resume=resume, out=run_default("out") if out is None else out,
                      stop_on_nonfinite=stop_on_nonfinite)
    out = resume or ("." if out is None else out)  # '' is refused as every --out is
    check_weights_options(opts)
    from .run.options import check_checkpoint_options
    check_checkpoint_options(opts)
    check_learning_rate(opts)
    plan = load_plan(plan_file)
    g = load_graph_file(graph)
    check_runnable(g, graph)
    replayed = check_plan(plan, g, plan_file, graph)
    check_init_against_graph(init, g)
    # the board reports against the plan's recorded figures: an edited one ("100 B predicted
    # (OVER the prediction)") is said before the run, as `simulate` says it
    stale = recorded_figures_warning(plan, plan_file, replay_summary(plan, g, replayed),
                                     then="the run's report compares the board's against the "
                                     "recorded ones; plan again for true predictions")
    if stale is not None:
        to_stderr(stale)
    from edge_remat_agent.executor.save_choice import CHECKPOINT_FILE, WEIGHTS_FILE
    output_folder(out, inputs={"--init": init}, writes=(WEIGHTS_FILE, CHECKPOINT_FILE))
    earlier = _earlier_deploy_outputs(Path(out), resumed=bool(resume))
    config = find_device(device)
    if data is not None:  # a board that reads its own disk needs the file's path there
        data = absolute_file_spec(data, "--data", config)
        check_data(data, config)
        opts.data = data
    note_plan_above_ram(config, replayed.peak_bytes, to_stderr)
    from .run.resume import (checkpoint_every as every_of, checkpoint_params, deploy_identity,
                             job_resume, note_job, start_resume, with_resume_hint)
    from .errors import Interrupted
    from .transport import JobFailed
    every = every_of(opts)
    # the graph's capture seed, as run seeds its job: without one each job's dropout drew
    # from wherever its generator stood, and no two deploys (nor a resumed one) trained alike
    seed = (g.capture.get("source") or {}).get("seed") or 0
    params: dict = {"steps": steps, "save": save, "seed": seed, **opts.lr_params,
                    **opts.nonfinite_params,
                    **({"data": data} if data is not None else {}),
                    **checkpoint_params(opts, every,
                                        deploy_identity(opts, plan.graph_fingerprint), out)}
    from .page_folder import page_dir_params
    params.update(page_dir_params(config))  # the board's flash, as its device config says
    from .transport.board import new_job_id
    from .transport.host_pages import host_pages, plan_uses_host
    from .profile_fit import plain_step_out_of_reach
    from .transport.emulated import retired_at_exit
    with Board(config, on_event=to_stderr, keep_running=keep_running) as board, \
            retired_at_exit(board):
        require_kind(board, "run", "execute plans")
        from .checks import note_plan_above_board_ram
        note_plan_above_board_ram(config, board.sysinfo, replayed.peak_bytes, to_stderr)
        # the board checks the plan's gradients against a plain eager step after training,
        # which a board without room for one cannot hold: the host checks them, as run does
        no_room = plain_step_out_of_reach(board, g) is not None
        if no_room:
            params["check_gradients"] = False
        resumed = start_resume(board, opts, Path(out), to_stderr, params["identity"]) \
            if resume else None
        resume_params, resume_inputs = job_resume(Path(out), resumed)
        job_id = new_job_id("run")
        if "identity" in params:  # written before the job: --resume finds it on the board
            note_job(Path(out), job_id, board.name, every, bool(resume))
        with host_pages(board, plan_uses_host(plan), to_stderr) as page_params:
            inputs = {"plan": plan_file, "graph": graph, **({"init": init} if init else {}),
                      **resume_inputs}
            shown = job_sent_line(board) if as_json else progress_printer()
            from .run.orchestrate import killed_failure
            from .transport.emulated import KernelWatch
            watch = KernelWatch.for_device(config)
            try:
                record = board.run_job("run", {**params, **resume_params, **page_params},
                                       inputs, out, job_id=job_id, on_update=shown)
            except (JobFailed, Interrupted) as failed:  # Ctrl-C too, as run's (QA: it named
                # no checkpoint)
                if isinstance(failed, JobFailed):
                    failed = killed_failure(failed, steps, board.name, watch.killed())
                raise with_resume_hint(failed, board, Path(out), job_id) \
                    if "identity" in params else failed
        if no_room and record.get("state") == "finished" and record.get("result"):
            from .run.orchestrate import host_gradient_check
            check = host_gradient_check(g, Path(plan_file), to_stderr, None, board.name)
            record["result"]["grad_check"] = check
            fetched = fetched_file(record, "run_report.json")  # the summary is read from it
            if fetched is not None:
                report = json.loads(fetched.read_text())
                from edge_remat_agent.formats.fields import dump_text  # atomic, names the file
                dump_text(json.dumps(dict(report, grad_check=check), indent=1), fetched)
        _say_earlier_outputs_kept(Path(out), earlier)
        print_outcome(record, as_json, board, shown)
    _exit_if_stopped(record.get("result"), steps)
    _exit_if_gradients_differ((record.get("result") or {}).get("grad_check"))


# What a deploy writes into --out (the board's report, the trained weights, the checkpoint
# and the record --resume reads).
DEPLOY_OUTPUTS = ("run_report.json", "weights.pt", "checkpoint.pt", "checkpoint.json")


def _earlier_deploy_outputs(out, resumed: bool) -> dict:
    """Before anything is sent: a folder that holds a `run`'s outputs (its report.json) is
    refused, for a deploy's files there would mix two trainings; an earlier deploy's outputs
    (not where --resume goes on from them) are said, as a warning line naming them, to be
    replaced; returns them, {path: file_stamp}, for _say_earlier_outputs_kept. QA: deploy
    wrote over an earlier deploy's weights.pt and run_report.json, and into a `run` folder,
    in silence."""
    from .outputs import file_stamp
    from .remote import to_stderr
    from .run.orchestrate import holds_a_run_report
    if resumed or not out.is_dir():
        return {}
    if holds_a_run_report(out):
        raise UserError(f"--out {out} holds the outputs of `edge-remat run` (report.json): a "
                        "deploy's run_report.json and weights.pt there would mix two "
                        "trainings; give another --out")
    earlier = {path: stamp for path in (out / name for name in DEPLOY_OUTPUTS)
               if (stamp := file_stamp(path)) is not None}
    if earlier:
        to_stderr(f"warning: --out {out} holds an earlier deploy's "
                  f"{', '.join(path.name for path in earlier)}: this deploy writes over them "
                  "(give another --out to keep them)")
    return earlier


def _say_earlier_outputs_kept(out, earlier: dict) -> None:
    """The earlier deploy's files this one did not write again (--save none, no
    --checkpoint-every), said as run says them: they are not this deploy's."""
    from .outputs import kept_note, written_since
    from .remote import to_stderr
    kept = [path.name for path in earlier if path.exists() and not written_since(path, earlier)]
    if kept:
        to_stderr(kept_note(kept, out, "deploy"))


def _exit_if_stopped(report, steps: int) -> None:
    """Exit 1 with its line where --stop-on-nonfinite stopped the run (its report written)."""
    from edge_remat_agent.run_command import stopped_at_nonfinite
    stopped = stopped_at_nonfinite(report, steps)
    if stopped:
        typer.echo(f"error: {stopped}", err=True)
        raise typer.Exit(EXIT_JOB_FAILED)


def _exit_if_gradients_differ(check) -> None:
    """Exit 1 with its line where the run's gradient check found the plan unlike eager."""
    from edge_remat_agent.run_command import gradient_mismatch
    mismatch = gradient_mismatch(check)
    if mismatch:
        typer.echo(f"error: {mismatch}", err=True)
        raise typer.Exit(EXIT_JOB_FAILED)


@app.command()
@cli_errors
@sigterm_as_ctrl_c()  # SIGTERM cancels the board's job as Ctrl-C does
def profile(
    device: str = typer.Option(..., "--device", help="device name or config path"),
    graph: Optional[str] = typer.Option(None, "--graph", help="graph whose nodes to measure"),
    param: list[str] = typer.Option([], "--param", help="KEY=VALUE for the profiler"),
    model: Optional[str] = typer.Option(None, "--model", help="the model whose runtime "
                                        "footprint to measure (with --graph: the graph's)"),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="--model's dtype, as the run "
                                        "trains it (with --graph: the graph's). " + DTYPE_HELP),
    trainable_dtype: Optional[str] = typer.Option(None, "--trainable-dtype",
                                                  help=TRAINABLE_DTYPE_HELP),
    out: str = typer.Option("profiles", "--out", help="folder for the measured profile"),
    force: bool = typer.Option(False, "--force", help="overwrite OUT/profile.json"),
    keep_running: bool = typer.Option(False, "--keep-running", help=KEEP_RUNNING_HELP),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Measure the board (operators, storage tiers, power) with its agent; fetch the profile."""
    from .checks import check_runnable
    from .devices import find_device
    from .importers.graph_import import load_graph_file
    from .outputs import output_folder
    from .remote import (fetched_json, job_sent_line, parse_params, print_outcome,
                         require_kind, progress_printer, to_stderr)
    from .transport import Board

    values = parse_params(None, param)
    named = {"model": model, "dtype": dtype, "trainable_dtype": trainable_dtype}
    for key, value in named.items():
        if value is not None and key in values:
            raise UserError(f"--{key.replace('_', '-')} and --param {key}= say the same: "
                            "give one")
    values.update({key: value for key, value in named.items() if value is not None})
    from edge_remat_agent.profiler.measure import ProfileOptions, refuse_other_dtypes
    loaded = load_graph_file(graph) if graph else None
    try:  # the board's own check, here: a bad param is bad input, not a job that failed
        options = ProfileOptions.from_params({**values, **({"graph": graph} if graph else {})})
        if loaded is not None:
            refuse_other_dtypes(options, loaded.capture.get("source") or {}, graph)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if loaded is not None:
        check_runnable(loaded, graph)
    if model is not None:
        _check_profile_model(model, loaded, graph, to_stderr)
    # QA: `--graph D/profile.json --out D` replaced the graph with the profile, and a second
    # profile into D replaced the first (minutes of a board's measuring) in silence
    output_folder(out, inputs={"--graph": graph}, writes=("profile.json",), force=force)
    config = find_device(device)
    from .page_folder import page_dir_params
    values = {**page_dir_params(config), **values}  # a --param page_dir=... wins
    from .transport.host_pages import link_pages
    from .profile_fit import plain_step_out_of_reach
    from .transport.emulated import retired_at_exit
    with Board(config, on_event=to_stderr, keep_running=keep_running) as board, \
            retired_at_exit(board):
        require_kind(board, "profile", "profile boards")
        inputs = {"graph": graph} if graph else {}
        if loaded is not None and (why := plain_step_out_of_reach(board, loaded)):
            to_stderr(f"warning: {why}")
            inputs = {}
        shown = job_sent_line(board) if as_json else progress_printer()
        with link_pages(board, to_stderr) as page_params:
            record = board.run_job("profile", {**page_params, **values}, inputs, out,
                                   on_update=shown)
        from .run.profiles import remember_profiled
        remember_profiled(board, record["fetched"])  # for a later run of that graph here
        fetched = fetched_json(record)
        if loaded is not None and not inputs and fetched:  # no room: time them under a plan
            from .profile_under_plan import time_nodes_under_plan
            timed = time_nodes_under_plan(board, loaded, graph, fetched[0],
                                          values.get("page_dir"), to_stderr,
                                          None if as_json else progress_printer(),
                                          values.get("device"))
            if timed and record.get("result") is not None:  # the summary as it is now
                from .node_times import FIGURES_KEY
                record["result"].update({"ops": len(load_profile(fetched[0]).ops),
                                         "nodes": timed["nodes"], FIGURES_KEY: timed})
        print_outcome(record, as_json, board, shown)


def _check_profile_model(model: str, loaded, graph_file, say) -> None:
    """profile --model, checked here as `run` checks it (QA: an unknown name failed on the
    board after the job was sent, exit 1), and said where it is not the --graph's model."""
    from edge_remat_agent.zoo import not_a_model
    if (why := not_a_model(model)) is not None:
        raise UserError(f"--model {model!r} is {why}")
    from edge_remat_agent.user_code import names_file
    module_part = model.rpartition(":")[0]
    if names_file(module_part):  # QA: the board found no such module after the measurements
        graph_command = f"edge-remat graph --model {model} --output graph.json"
        raise UserError(f"--model {model} names a file of this machine, and the board builds "
                        "--model itself (to measure the runtime's memory with it); capture "
                        f"its graph here and profile that (`{graph_command}`, then `edge-remat "
                        "profile --device ... --graph graph.json`), as `run` does, or give a "
                        "module the board can import")
    captured = ((loaded.capture.get("source") or {}).get("model") if loaded is not None
                else None)
    if captured and captured != model:
        say(f"warning: --model {model} is not the model {graph_file} was captured from "
            f"({captured}): the footprint measured is {model}'s")


# -- end to end: `run` (logic in run/, reports/, transport/emulated.py) -------------------

from .run.options import DEFAULT_DATA, run_default  # noqa: E402 - light (no torch)
from .transport.emulated import MIN_MEMORY_LIMIT_BYTES  # noqa: E402 - light

# --data's default, from the table `run` uses, so that the help cannot drift from it
# --lr's defaults, from the optimizers' own table, so that the help cannot drift from them
DATA_DEFAULT_HELP = "; ".join(
    f"{data} for {', '.join(m for m, d in DEFAULT_DATA.items() if d == data)}"
    for data in dict.fromkeys(DEFAULT_DATA.values())) + "; else example"


@app.command("run")
@cli_errors
@sigterm_as_ctrl_c()  # SIGTERM cancels the board's job as Ctrl-C does
def run_command(
    device: str = typer.Option(..., "--device", help="device name or config path (local: this "
                               "machine; emulated-board: this machine in a memory cgroup)"),
    model: str = typer.Option(..., "--model", help="a zoo model (digits-cnn, resnet18, ...) or "
                              "MODULE:FACTORY"),
    budget: Optional[str] = typer.Option(None, "--budget", help=BUDGET_HELP + " (default with "
                                         "--memory-limit: what the runtime leaves of it)"),
    objective: str = typer.Option(run_default("objective"), "--objective", help="time | energy"),
    deadline: Optional[str] = typer.Option(None, "--deadline", help="e.g. 1.3 = 1.3x plain time"),
    steps: int = typer.Option(run_default("steps"), "--steps", min=1, help="training steps"),
    data: Optional[str] = typer.Option(None, "--data", help="example | digits | text | "
                                       "MODULE:FUNCTION, MODULE a module or a .py file "
                                       f"(default: {DATA_DEFAULT_HELP})"),
    memory_limit: Optional[str] = typer.Option(None, "--memory-limit", help="emulate a board "
                                               "with this much RAM, e.g. 600MiB (a memory "
                                               "cgroup; local devices, root; at least "
                                               f"{MIN_MEMORY_LIMIT_BYTES // 2**20}MiB)"),
    plain: bool = typer.Option(False, "--plain", help="ordinary PyTorch training instead of the "
                               "plan (the comparison)"),
    batch: Optional[int] = typer.Option(None, "--batch", min=1),
    image: Optional[int] = typer.Option(None, "--image", min=1),
    seq: Optional[int] = typer.Option(None, "--seq", min=1),
    seed: int = typer.Option(run_default("seed"), "--seed"),
    optimizer: str = typer.Option(run_default("optimizer"), "--optimizer", help=OPTIMIZER_HELP),
    dtype: str = typer.Option(run_default("dtype"), "--dtype", help=DTYPE_HELP),
    trainable_dtype: Optional[str] = typer.Option(None, "--trainable-dtype",
                                                  help=TRAINABLE_DTYPE_HELP),
    lr: Optional[float] = typer.Option(None, "--lr", help=LR_HELP),
    lr_schedule: str = typer.Option(run_default("lr_schedule"), "--lr-schedule",
                                    help=LR_SCHEDULE_HELP),
    warmup: int = typer.Option(run_default("warmup"), "--warmup", help=WARMUP_HELP),
    clip_grad_norm: Optional[float] = typer.Option(None, "--clip-grad-norm", help=CLIP_HELP),
    accumulate: int = typer.Option(run_default("accumulate"), "--accumulate",
                                   help=ACCUMULATE_HELP),
    max_nodes: Optional[int] = typer.Option(None, "--max-nodes", min=5, help="at most this "
                                            "many planner nodes in the captured graph "
                                            f"(default {DEFAULT_MAX_NODES}; not with "
                                            "--operator-level)"),
    operator_level: bool = typer.Option(False, "--operator-level", help="one planner node per "
                                        "ATen op that allocates, as `graph --operator-level` "
                                        "(lower floors, longer solves)"),
    params_home: str = typer.Option(run_default("params_home"), "--params-home", help="ram | flash | auto (flash "
                                    "when the budget is below what RAM-homed parameters allow)"),
    train: Optional[list[str]] = typer.Option(None, "--train", help="train only parameters "
                                              "matching this pattern (repeatable); the rest "
                                              "are frozen"),
    profile_file: Optional[str] = typer.Option(None, "--profile", help="plan with this profile "
                                               "instead of measuring the board"),
    reprofile: bool = typer.Option(False, "--reprofile", help="measure again, ignoring the cache"),
    paging: Optional[str] = typer.Option(None, "--paging", help="none | flash | host | both"),
    solver: str = typer.Option(run_default("solver"), "--solver", help="auto | cpsat | milp | heuristic:NAME"),
    time_limit: float = typer.Option(run_default("time_limit"), "--time-limit", help="seconds for the solver"),
    sweep: Optional[str] = typer.Option(None, "--sweep", help="also plan a budget sweep, e.g. "
                                        "0.2:1.0:0.1, and plot it"),
    out: str = typer.Option(run_default("out"), "--out", help="folder for graph, plan, report, "
                            "plots"),
    no_plots: bool = typer.Option(False, "--no-plots", help="skip the PNG plots"),
    keep_running: bool = typer.Option(False, "--keep-running", help=KEEP_RUNNING_HELP),
    no_grad_check: bool = typer.Option(False, "--no-grad-check", help="skip the gradient "
                                       "check against eager PyTorch (it needs plain "
                                       "training's memory once, on the board or the host)"),
    allocator: str = typer.Option(run_default("allocator"), "--allocator", help="glibc (tensors from the C "
                                  "library's malloc) | arena (every planned tensor at its "
                                  "planned offset in one arena)"),
    arena: str = typer.Option(run_default("arena"), "--arena", help="how --allocator arena's "
                              "arena is laid out: best-fit | cpsat (exact, within "
                              "--arena-time-limit: a tighter arena, fewer re-plans)"),
    arena_time_limit: float = typer.Option(run_default("arena_time_limit"),
                                           "--arena-time-limit",
                                           help="seconds for the cpsat arena layout"),
    malloc: Optional[str] = typer.Option(None, "--malloc", help="the board's malloc for the "
                                         "run's process: glibc | jemalloc | tcmalloc "
                                         "(preloaded; default: jemalloc with --allocator "
                                         "arena where the board has it, else glibc)"),
    save: str = typer.Option(run_default("save"), "--save", help=SAVE_HELP),
    init: Optional[str] = typer.Option(None, "--init", help=INIT_HELP),
    checkpoint_every: Optional[int] = typer.Option(None, "--checkpoint-every",
                                                   help=CHECKPOINT_EVERY_HELP),
    stop_after: Optional[int] = typer.Option(None, "--stop-after", help="stop after this step "
                                             "of --steps (the schedule still spans --steps), "
                                             "with a checkpoint; --resume goes on"),
    resume: Optional[str] = typer.Option(None, "--resume", help="OUT: go on from the "
                                         "checkpoint of the run in that folder (or on the "
                                         "board) to --steps in all, with the same training "
                                         "options (--lr may change); writes into OUT"),
    stop_on_nonfinite: bool = typer.Option(False, "--stop-on-nonfinite",
                                           help=STOP_ON_NONFINITE_HELP),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Fine-tune MODEL on DEVICE within a memory budget: capture, profile, plan, deploy, train,
    and report planned against measured. Exit status 4: the run was killed (out of memory)."""
    from .remote import to_stderr
    from .run import RunOptions, run
    from .units import Budget, parse_size

    limit = int(parse_size(memory_limit, "--memory-limit")) if memory_limit else None
    if profile_file is not None and reprofile:  # alternatives: one was silently dropped
        raise UserError("--profile and --reprofile are alternatives: --profile plans with that "
                        "file, --reprofile measures the board again; give one")
    if objective not in ("time", "energy"):
        raise FormatError("command line", "--objective", "time or energy", objective)
    if allocator not in ("glibc", "arena"):
        raise FormatError("command line", "--allocator", "glibc or arena", allocator)
    from edge_remat_agent.allocator import MALLOCS
    if malloc is not None and malloc not in MALLOCS:
        raise FormatError("command line", "--malloc", " or ".join(MALLOCS), malloc)
    from edge_remat_agent.formats.graph_details import PARAM_HOMES
    if params_home not in ("auto", *PARAM_HOMES):  # before any capture starts
        raise FormatError("command line", "--params-home", " or ".join(("auto", *PARAM_HOMES)),
                          params_home)
    for line in _shape_options_without_effect(model, image, seq):
        to_stderr(f"warning: {line}")
    from .units import bare_bytes_note
    if budget and (note := bare_bytes_note(budget)) is not None:
        to_stderr(f"warning: {note}")
    options = RunOptions(
        device=device, model=model, budget=Budget.parse(budget) if budget else None,
        objective=objective,
        deadline=_deadline(deadline), steps=steps, data=data,
        memory_limit=limit, plain=plain, batch=batch, image=image, seq=seq, seed=seed,
        optimizer=optimizer, lr=lr, lr_schedule=lr_schedule, warmup=warmup,
        clip_grad_norm=clip_grad_norm, accumulate=accumulate, max_nodes=max_nodes,
        operator_level=operator_level,
        params_home=params_home, train=train,
        dtype=dtype, trainable_dtype=trainable_dtype, profile=profile_file,
        reprofile=reprofile, paging=paging, solver=solver, time_limit=time_limit, sweep=sweep,
        out=out, plots=not no_plots, keep_running=keep_running,
        check_gradients=not no_grad_check, allocator=allocator, arena=arena,
        arena_time_limit=arena_time_limit, save=save, init=init,
        checkpoint_every=checkpoint_every, stop_after=stop_after, resume=resume,
        stop_on_nonfinite=stop_on_nonfinite, extra={"malloc": malloc} if malloc else {})
    report = run(options, say=to_stderr)
    from .reports.run_report import report_text  # imports torch: not before the checks above
    killed = report["status"] == "killed"
    if as_json:
        if killed:  # as every failure with --json: `error` in the object, the line on stderr
            report = {**report, "error": _killed_line(report)}
            to_stderr(f"error: {report['error']}")
        print_json(report)
    elif killed:  # a failure's line, as every other's: on stderr (QA: it was on stdout alone)
        to_stderr(f"error: {_killed_line(report)}")
    else:
        typer.echo(report_text(report))
    if killed:
        raise typer.Exit(EXIT_KILLED)
    _exit_if_stopped(report, steps)
    _exit_if_gradients_differ(report.get("grad_check"))


PLOTTED_FIGURES = "workspaces in the memory traces"  # what plot's --profile changes


@app.command("plot")
@cli_errors
def plot_command(
    plan_file: Optional[str] = typer.Option(None, "--plan", help="a plan: schedule.png and "
                                            "memory.png"),
    graph: Optional[str] = typer.Option(None, "--graph", help="the graph the plan was made for"),
    sweep_file: Optional[str] = typer.Option(None, "--sweep", help="the folder `edge-remat plan "
                                             "--sweep ... -o DIR` wrote, or the JSON its --json "
                                             "prints: sweep.png"),
    out: str = typer.Option(".", "--out", help="folder for the PNG files"),
    profile: Optional[str] = typer.Option(None, "--profile", help="the profile the plan was "
                                          "made with: its workspaces in the memory traces"),
    force: bool = typer.Option(False, "--force", help="overwrite existing PNG files"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Draw a plan (stage x node schedule; memory over one step against the budget) and a
    budget sweep (energy and time per step against memory) as PNG files."""
    from pathlib import Path

    from .reports import plots
    from .checks import replay, replayed_profile_note
    from .importers.graph_import import load_graph_file
    from .outputs import output_file, output_folder

    if plan_file is None and sweep_file is None:
        raise FormatError("command line", "--plan/--sweep", "at least one of them")
    if plan_file is not None and graph is None:
        raise FormatError("command line", "--graph", "the graph the plan was made for")
    output_folder(out)
    # the PNGs to be written, checked as plan -o and graph -o check theirs: no one's file
    # replaced without --force, nor a file read here even with it
    inputs = {"--plan": plan_file, "--graph": graph, "--sweep": sweep_file, "--profile": profile}
    pngs = {name: output_file(Path(out) / f"{name}.png", force, "--out", inputs)
            for name in ((["schedule", "memory"] if plan_file is not None else [])
                         + (["sweep"] if sweep_file is not None else []))}
    # every input read and checked before the first PNG is written (QA: a bad --sweep was
    # refused after schedule.png and memory.png were written, and the retry then wanted --force)
    if plan_file is not None:
        from .remote import to_stderr
        g, p = load_graph_file(graph), load_plan(plan_file)
        prof = load_profile(profile) if profile else None
        # a plan for another graph: refused; the trace drawn and the warning below are of
        # this one replay, at the profile's costs as simulate's (QA: the warning replayed the
        # plan without the profile, so a plot drawn over the budget line had no word)
        replayed = replay(p, g, plan_file, graph, prof)
        planned, plain = replayed.memory_trace, plots.plain_trace(g, prof)
        # as simulate says it (QA: the legend's planned peak was not the plan's, no word)
        if (other_costs := replayed_profile_note(p, prof, PLOTTED_FIGURES)) is not None:
            to_stderr(other_costs)
        if not replayed.fits_budget:  # drawn, as its memory plot shows it (QA: no word)
            to_stderr(f"warning: {plan_file} peaks at {replayed.peak_bytes} bytes, over its "
                      f"budget of {p.budget_bytes} bytes (`edge-remat simulate` refuses it)")
    if sweep_file is not None:
        rows, units = _sweep_rows(sweep_file)
    written = []
    new = [png for png in pngs.values() if not png.exists()]
    try:
        if plan_file is not None:
            written += [plots.plot_schedule(g, p, pngs["schedule"]),
                        plots.plot_memory(planned, p.budget_bytes, pngs["memory"], plain=plain)]
        if sweep_file is not None:
            written.append(plots.plot_sweep(rows, pngs["sweep"], units=units))
    except BaseException:
        # a plot that fails leaves none of the PNGs it made (QA: a full disk after
        # schedule.png, whose retry then wanted --force); each is whole (plots._save)
        for png in new:
            png.unlink(missing_ok=True)
        raise
    if as_json:
        print_json({"plots": [str(p) for p in written]})
    else:
        typer.echo("\n".join(f"wrote {p}" for p in written))


def _sweep_rows(path: str) -> tuple[list, tuple[str, str]]:
    """The rows of a budget sweep's JSON and its (time, energy) units (seconds and joules
    where it says none); another file (a plan, a graph) is named as what it is."""
    from pathlib import Path

    from edge_remat_agent.formats.fields import Reader, load_json
    if Path(path).is_dir():  # the folder `plan --sweep -o DIR` wrote
        table = Path(path) / SWEEP_TABLE
        if not table.is_file():
            raise UserError(f"{path} holds no {SWEEP_TABLE}: give the folder `edge-remat plan "
                            "--sweep ... -o DIR` wrote, or the JSON its --json prints")
        path = str(table)
    data = load_json(path)
    if isinstance(data, dict) and isinstance(data.get("sweep"), list):
        # each row's figures checked as a plan's are: a hand-edited "x" was drawn as a
        # category on the energy axis, an empty sweep as an empty chart
        sweep = Reader(data, path)
        if not data["sweep"]:
            raise sweep.error("sweep", "at least one budget's row")
        for k in range(len(data["sweep"])):
            row = sweep.item("sweep", k)
            row.integer("budget_bytes", minimum=1)
            solved = [row.number(key, None) is not None for key in ("energy_j", "time_s")]
            if solved[0] != solved[1]:
                raise row.error("time_s", "a time where the row has an energy, and none where "
                                "it has none", row.raw("time_s", None))
        if all(row.get("energy_j") is None for row in data["sweep"]):
            # as `plan --sweep` refuses it (QA: an exit 0 and a chart with no line)
            raise UserError(f"{path}: no budget of the sweep has a plan (every row says "
                            f"\"no plan\"): nothing to draw; sweep larger budgets")
        units = sweep.child("units", None)
        return data["sweep"], ((units.str("time"), units.str("energy")) if units else ("s", "J"))
    if isinstance(data, dict):
        what = f"a file of format {data['format']}" if isinstance(data.get("format"), str) \
            else "an object with no \"sweep\" list"
    else:
        what = f"a JSON {type(data).__name__}"
    raise UserError(f"{path}: --sweep takes the JSON `edge-remat plan --sweep ... --json` "
                    f"prints (an object with a \"sweep\" list), got {what}")


def _deadline(text: Optional[str]) -> Optional[float]:
    """--deadline's multiple of the plain time (plan and run), None where not given."""
    from .units import parse_multiplier
    return parse_multiplier(text, "--deadline") if text else None


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


def _one_line_summaries(*typers: typer.Typer) -> None:
    """--help's command lists show each command's first docstring paragraph with its line
    breaks kept (rows that ended "with the board's", QA): each is given as one line."""
    import inspect
    for each in typers:
        for info in each.registered_commands:
            if info.short_help is None and info.callback is not None:
                first = inspect.cleandoc(info.callback.__doc__ or "").split("\n\n")[0]
                info.short_help = " ".join(first.split()) or None


_one_line_summaries(app, fleet_app)


def main() -> None:
    """Every command's failures end in cli_errors; what escapes them (typer's own machinery)
    still ends in one line here (--debug: after its traceback)."""
    from .entry import INTERRUPTED_LINE, ctrl_c_after_imports
    ctrl_c_after_imports()  # as the `edge-remat` entry does (`python -m edge_remat.cli`)
    try:  # a Ctrl-C put off by these imports lands after them, before any command
        from .errors import last_resort, leave_quietly, quiet_libraries, stdout_closed
        from .errors import EXIT_INTERRUPTED, EXIT_STDOUT_CLOSED, is_cli_machinery
        from .errors import broken_pipes_reach_us, classify, error_line_said, say_failure
        from .errors import take_debug_flag

        take_debug_flag(sys.argv)
        as_json = "--json" in sys.argv[1:]  # a script reads stdout: errors go there too
        quiet_libraries()
        broken_pipes_reach_us()
    except KeyboardInterrupt:
        sys.stderr.write(INTERRUPTED_LINE)
        sys.exit(130)
    try:
        code = app(prog_name="edge-remat", standalone_mode=False)
    except SystemExit as exc:  # typer ends a broken pipe outside a command (--help) in exit 1
        if isinstance(exc.__context__, BrokenPipeError) and stdout_closed(exc.__context__):
            leave_quietly()
        raise
    except BaseException as exc:  # noqa: BLE001
        if stdout_closed(exc):
            leave_quietly()
        if type(exc).__name__ == "NoArgsIsHelpError":  # the help is already shown
            sys.exit(getattr(exc, "exit_code", 2))
        if is_cli_machinery(exc) and hasattr(exc, "format_message"):  # a usage error
            where = getattr(getattr(exc, "ctx", None), "command_path", None) or "edge-remat"
            say_failure(f"{exc.format_message()} (see `{where} --help`)", as_json)
            sys.exit(getattr(exc, "exit_code", 2))
        if is_cli_machinery(exc) and type(exc).__name__ == "Abort":  # Ctrl-C at a prompt
            typer.echo("error: interrupted (Ctrl-C)", err=True)
            sys.exit(EXIT_INTERRUPTED)
        sys.exit(last_resort(exc))
    code = code if isinstance(code, int) else 0
    if code == EXIT_INTERRUPTED and not error_line_said():
        # typer (0.2x) ends a Ctrl-C that lands in its own machinery, outside every command's
        # handling (parsing the options, a command's set-up), in this status without a word:
        # said as a command's interruption is
        _, message, extra = classify(KeyboardInterrupt())
        say_failure(message, as_json, **extra)
    try:  # what is still buffered: a reader that has gone (`| head`) shows here, not at exit
        sys.stdout.flush()
    except OSError as exc:
        if stdout_closed(exc):
            leave_quietly(code or EXIT_STDOUT_CLOSED)  # a failure keeps its own status
        sys.exit(last_resort(exc))
    from .entry import status_with_ctrl_c_put_off
    sys.exit(status_with_ctrl_c_put_off(code))


if __name__ == "__main__":
    sys.exit(main())
