"""The `edge-remat` command line. Planning and simulating import neither torch nor OR-Tools."""

from __future__ import annotations

import functools
import json
import sys
from typing import Optional

import typer

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
        from edge_remat_agent.simulate import PlanError

        from .planner.problem import InfeasibleBudget, ProblemError
        from .planner.solve import NoPlan
        from .units import UnitError
        as_json = bool(kwargs.get("as_json"))
        try:
            return command(*args, **kwargs)
        except InfeasibleBudget as exc:
            _fail(str(exc), as_json, status="infeasible",
                  smallest_feasible_budget_bytes=exc.smallest_bytes)
        except (FormatError, UnitError, NoPlan, PlanError, ProblemError) as exc:
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
    budget: str = typer.Option(..., "--budget", help="0.8 or 80% of the plain peak, or 512MiB"),
    output: Optional[str] = typer.Option(None, "-o", "--output", help="where to write the plan"),
    profile: Optional[str] = typer.Option(None, "--profile", help="device profile JSON"),
    objective: str = typer.Option("time", "--objective", help="time | energy"),
    deadline: Optional[str] = typer.Option(None, "--deadline", help="e.g. 1.3 = 1.3x plain time"),
    solver: str = typer.Option("auto", "--solver", help="auto | milp | heuristic:NAME"),
    time_limit: float = typer.Option(60.0, "--time-limit", help="seconds for the solver"),
    paging: Optional[str] = typer.Option(None, "--paging", help="none | flash | host | both"),
    paging_time: str = typer.Option("counted", "--paging-time",
                                    help="counted (paging takes time) | free (POET's model)"),
    backend: str = typer.Option("cbc", "--backend", help="MILP backend: cbc | highs"),
    threads: Optional[int] = typer.Option(None, "--threads", help="solver threads"),
    flash_read_bw: Optional[str] = typer.Option(None, "--flash-read-bw", help="bytes/s, e.g. 90MB"),
    flash_write_bw: Optional[str] = typer.Option(None, "--flash-write-bw", help="bytes/s"),
    flash_latency: Optional[float] = typer.Option(None, "--flash-latency", help="seconds"),
    flash_energy_per_byte: Optional[float] = typer.Option(None, "--flash-energy-per-byte",
                                                          help="joules per byte moved"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Solve for the cheapest schedule that fits the memory budget; write it as a plan."""
    from .graph_import import load_graph_file
    from .planner.build import PAGING_CHOICES, build_problem
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
    problem = build_problem(g, budget, prof, objective,
                            parse_multiplier(deadline) if deadline else None, paging, tiers,
                            paging_time)
    report = solve(problem, solver, time_limit, backend, threads)
    result = report.plan.to_dict()
    result["problem"]["tier_params"] = {name: tier.to_dict() for name, tier in
                                        ({**(prof.tiers if prof else {}), **tiers}).items()
                                        if name in problem.tiers}
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
def version() -> None:
    """Print the version."""
    from . import __version__
    typer.echo(__version__)


def main() -> None:
    app(prog_name="edge-remat")


if __name__ == "__main__":
    sys.exit(main())
