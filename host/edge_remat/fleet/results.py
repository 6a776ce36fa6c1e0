"""The fleet's results: one row per task, written as results.json and results.csv, and one plot
per model (energy and time per step against the memory budget, one line per board)."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any, Optional

from edge_remat_agent.formats.fields import dump_json, dump_text

from .tasks import PlanTask

COLUMNS = ("model", "board", "budget", "deadline", "status", "solver", "budget_bytes",
           "peak_bytes", "time_s", "energy_j", "tdi_percent", "recomputed", "page_ins",
           "page_outs", "lower_bound", "gap", "solve_time_s", "workers", "task_s", "resumed",
           "plan", "budget_floor_bytes", "smallest_feasible_budget_bytes",
           "smallest_feasible_deadline", "board_ram_bytes", "fits_board", "error")
# A budget or deadline below what the graph allows is an answer of the sweep, not a failure:
# its row gives the floor (the least bytes any schedule needs) or the smallest deadline met (as
# `edge-remat plan --json` names them) and the why.
INFEASIBLE = {"infeasible": "budget_floor_bytes",
              "infeasible_deadline": "smallest_feasible_deadline"}
# smallest_feasible_budget_bytes: budget_floor_bytes's older name, kept for existing readers
SMALLEST = (*INFEASIBLE.values(), "smallest_feasible_budget_bytes")


def is_failure(row: dict) -> bool:
    """A task that gave neither a plan nor an infeasibility answer (its error says why)."""
    return row["error"] is not None and row["status"] not in INFEASIBLE


def infeasible_text(row: dict) -> str:
    """'needs at least 21078136 bytes (20.10 MiB)' (a floor), or the smallest deadline."""
    from ..units import fmt_bytes
    smallest = row[INFEASIBLE[row["status"]]]
    if smallest is None:  # the planner's line says why
        return row["error"]
    if row["status"] == "infeasible":
        return f"needs at least {smallest} bytes ({fmt_bytes(smallest)})"
    return f"smallest feasible deadline {smallest:g}x the plain time"


def row_units(rows: list[dict]) -> tuple[str, str]:
    """(time, energy) units of a model's planned rows (one graph: one kind of costs); seconds
    and joules where none planned, or rows written before they said."""
    units = next((row["units"] for row in rows if row.get("units")), None)
    return (units["time"], units["energy"]) if units else ("s", "J")


def plan_row(task: PlanTask, plan: dict, seconds: Optional[float], resumed: bool,
             board_ram_bytes: Optional[int]) -> dict:
    """A planned task's row; `fits_board` whether its peak is within the board's RAM (the
    profile's), None where the profile gives none (QA: a 14.74 GiB plan for a 4 GiB board
    was "optimal" without a word)."""
    from ..reports.report import problem_cost_units
    pr, s = plan["predicted"], plan["solver"]
    # as `plan --json` names them: a graph file's cost units where its costs are not seconds
    units = dict(zip(("time", "energy"), problem_cost_units(plan.get("problem", {}))))
    return {**_keys(task), "status": s["status"], "solver": s["name"], "units": units,
            "budget_bytes": plan["budget_bytes"], "peak_bytes": pr["peak_bytes"],
            "time_s": pr["time_s"], "energy_j": pr["energy_j"],
            "tdi_percent": pr["tdi_percent"], "recomputed": pr["recomputed"],
            "page_ins": pr["page_ins"], "page_outs": pr["page_outs"],
            "lower_bound": s["lower_bound"], "gap": s["gap"],
            "solve_time_s": s["solve_time_s"], "workers": s.get("workers"),
            "task_s": seconds, "resumed": resumed, "plan": task.relpath,
            **{key: None for key in SMALLEST}, "board_ram_bytes": board_ram_bytes,
            "fits_board": None if not board_ram_bytes else pr["peak_bytes"] <= board_ram_bytes,
            "error": None}


def failed_row(task: PlanTask, outcome: dict) -> dict:
    row: dict[str, Any] = {key: None for key in COLUMNS}
    row.update(_keys(task), units=None, status=outcome["status"], budget_bytes=outcome.get("budget_bytes"),
               task_s=outcome.get("seconds"), resumed=False, error=outcome["error"],
               **{key: outcome.get(key) for key in SMALLEST})
    return row


def _keys(task: PlanTask) -> dict:
    return {"model": task.model, "board": task.board, "budget": task.budget,
            "deadline": task.deadline}


def write_results(rows: list[dict], out: Path, manifest: str) -> list[Path]:
    """results.json, results.csv and OUT/MODEL/sweep.png for each model with a plan."""
    return [*write_tables(rows, out, manifest), *plot_models(rows, out)]


def write_tables(rows: list[dict], out: Path, manifest: str) -> list[Path]:
    """results.json and results.csv (OUT made if need be)."""
    out.mkdir(parents=True, exist_ok=True)
    json_path, csv_path = out / "results.json", out / "results.csv"
    dump_json({"format": "edge-remat/fleet-results", "version": 1, "manifest": manifest,
               "rows": rows}, json_path)
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows({key: ("" if row.get(key) is None else row[key]) for key in COLUMNS}
                     for row in rows)
    dump_text(text.getvalue(), csv_path)
    return [json_path, csv_path]


def plot_models(rows: list[dict], out: Path) -> list[Path]:
    from ..reports.plots import plot_sweeps
    written = []
    for model in dict.fromkeys(row["model"] for row in rows):
        mine = [row for row in rows if row["model"] == model]
        if not any(row["energy_j"] is not None for row in mine):
            continue
        several_deadlines = len({row["deadline"] for row in mine}) > 1
        series: dict[str, list[dict]] = {}
        for row in mine:
            label = row["board"] + (f", deadline {row['deadline']:g}x"
                                    if several_deadlines and row["deadline"] else "")
            series.setdefault(label, []).append(row)
        written.append(plot_sweeps(series, out / model / "sweep.png",
                                   f"{model}: cost of training against the memory budget",
                                   row_units(mine)))
    return written
