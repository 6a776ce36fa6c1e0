"""`edge-remat fleet ...`: the fleet's commands (added to the main CLI as a group)."""

from __future__ import annotations

from typing import Optional

import typer

from ..errors import EXIT_JOB_FAILED, UserError, cli_errors
from ..planner.interrupt import sigterm_as_ctrl_c

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Plan for a fleet: many models x boards x budgets, as Ray tasks.")


@app.command("plan")
@cli_errors
@sigterm_as_ctrl_c()  # SIGTERM stops the fleet as Ctrl-C does, while Ray starts too
def plan_command(
    manifest_file: str = typer.Argument(..., metavar="MANIFEST.toml",
                                        help="models, boards (profiles or device configs), "
                                             "budgets and deadlines"),
    out: Optional[str] = typer.Option(None, "--out", help="the output tree (default: the "
                                      "manifest's `out`, else edge-remat-fleet)"),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="an existing Ray "
                                              "cluster (e.g. 10.0.0.5:6379 or auto); default: a "
                                              "local Ray instance on this machine"),
    no_ray: bool = typer.Option(False, "--no-ray", help="run the tasks one by one in this "
                                "process (no Ray needed)"),
    threads: Optional[int] = typer.Option(None, "--threads", min=1, help="solver threads per "
                                          "task (default: the cores shared out among the tasks "
                                          "in flight)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
) -> None:
    """Capture each model once, plan every (model, board, budget, deadline) with the board's
    profile, check each plan in the simulator, write the plans, a results table and a plot per
    model. Re-running skips what is already written and valid. A budget or deadline below
    what a model allows is a result (infeasible: the floor it needs), not a failure.
    Exit status 1: some tasks failed (each is in the table with its error)."""
    from pathlib import Path

    from ..outputs import output_folder, print_json
    from ..remote import to_stderr
    from .manifest import load_manifest
    from .runner import run_fleet

    if no_ray and ray_address:
        raise UserError("--no-ray and --ray-address contradict each other: give one of them")
    manifest = load_manifest(manifest_file)
    from ..units import bare_bytes_note
    for i, text in enumerate(manifest.budgets):  # as `plan --budget 50` warns of it
        if (note := bare_bytes_note(text, f"budgets[{i}] =")) is not None:
            to_stderr(f"warning: {manifest.path}: {note}")
    if no_ray:
        from .backends import InProcess
        backend = InProcess()
    else:
        from .backends import RayBackend
        backend = RayBackend(ray_address)  # a cluster that cannot be reached: nothing made
    try:
        folder = output_folder(out if out is not None else  # `--out ''` is refused
                               manifest.out or "edge-remat-fleet")
        result = run_fleet(manifest, Path(folder), backend, threads, say=to_stderr)
    finally:
        backend.close()
    failed = result.failed
    if as_json:
        print_json({"status": "failed" if failed else "done", "out": str(folder),
                    "tasks": len(result.rows), "failed": len(failed),
                    "infeasible": len(result.infeasible),
                    "workers_per_task": result.workers, "in_flight": result.in_flight,
                    "seconds": result.seconds, "rows": result.rows,
                    "files": [str(p) for p in result.files]})
    else:
        typer.echo(summary_text(result, folder))
    if failed:
        raise typer.Exit(EXIT_JOB_FAILED)


def summary_text(result, folder) -> str:
    from edge_remat_agent.units import counted

    from ..units import fmt_bytes
    from .results import INFEASIBLE, infeasible_text, row_units
    rows = result.rows
    resumed = sum(1 for row in rows if row["resumed"])
    planned = len(rows) - len(result.failed) - len(result.infeasible)
    # how tasks ran where any did (QA: a resume that kept every task said "1 at a time")
    ran = f" ({result.in_flight} at a time, {counted(result.workers, 'solver thread')} each)" \
        if resumed < len(rows) else ""
    lines = [f"{counted(len(rows), 'task')}: {planned} planned ({resumed} kept from before), "
             f"{len(result.infeasible)} infeasible, {len(result.failed)} failed, in "
             f"{result.seconds:.1f} s{ran}"]
    # budget @deadline: a deadline as a multiple of the plain time
    # the status column as wide as its widest entry ("infeasible_deadline" is 19)
    width = max([len("status")] + [len(row["status"]) for row in rows])
    header = f"{'model':<16} {'board':<18} {'budget':>14} {'status':<{width}} {'peak':>10} " \
             f"{'time/step':>10} {'energy':>9}"
    lines += ["", header]
    for row in rows:
        budget = row["budget"] + (f" @{row['deadline']:g}x" if row["deadline"] else "")
        start = f"{row['model']:<16} {row['board']:<18} {budget:>14} {row['status']:<{width}}"
        if row["error"] is not None:  # an infeasible row says what is feasible instead
            lines.append(f"{start} " + (infeasible_text(row) if row["status"] in INFEASIBLE
                                        else row["error"]))
            continue
        seconds = row_units([row]) == ("s", "J")  # else the graph's cost units: no suffix
        lines.append(f"{start} {fmt_bytes(row['peak_bytes']):>10} "
                     f"{row['time_s']:>9.4g}{'s' if seconds else ' '} "
                     f"{row['energy_j']:>8.4g}{'J' if seconds else ' '}"
                     + ("  > board RAM" if row.get("fits_board") is False else ""))
    over_ram = [row for row in rows if row.get("fits_board") is False]
    if over_ram:
        lines += ["", f"warning: {counted(len(over_ram), 'plan')} marked > board RAM: each "
                  "peaks above the RAM of its board's profile and will not fit there "
                  "(fits_board false in the results)"]
    in_cost_units = sorted({row["model"] for row in rows if row_units([row])[0] != "s"})
    if in_cost_units:
        lines += ["", f"time and energy of {', '.join(in_cost_units)} are in the graph's cost "
                  "units (its file's costs are not seconds), not s and J"]
    if result.slowest:
        lines += ["", "slowest: " + "; ".join(f"{label} {seconds:.1f} s"
                                               for seconds, label in result.slowest)]
    lines.append(f"results: {folder}/results.csv, {folder}/results.json; plans and plots "
                 f"under {folder}/")
    return "\n".join(lines)
