"""What a run leaves in OUT besides its report: the trained weights the board saved, moved
there from OUT/board, and the plots. The run (orchestrate.py) and the way back for a job it
left running (come_back.py) both write them."""

from __future__ import annotations

from pathlib import Path
from typing import Optional


def trained_weights_into(out: Path, outcome: dict) -> Optional[dict]:
    """The trained weights the board's job saved, moved from OUT/board to OUT (a rename:
    the fetch wrote them whole under a temporary name first), with the board's figures of
    them; None when it saved none (--save none, a killed run)."""
    from edge_remat_agent.executor.save_choice import WEIGHTS_FILE
    saved = (outcome.get("result") or {}).get("saved_weights")
    fetched = out / "board" / WEIGHTS_FILE
    if outcome.get("status") != "finished" or not saved or not fetched.is_file():
        return None
    target = out / WEIGHTS_FILE
    fetched.replace(target)
    return {**saved, "file": str(target)}


def draw_plots(graph, plan_path: Path, report: dict, out: Path, profile=None) -> list[str]:
    """schedule.png and memory.png (the plan's memory over one step, the plain schedule's
    beside it, the run's measured peaks across), and sweep.png where OUT holds a sweep."""
    from edge_remat_agent.formats import load_plan

    from ..reports import plots
    plan = load_plan(plan_path)
    planned, plain = plots.memory_traces(graph, plan, profile)
    measured = {"tensor_peak_bytes": report.get("tensor_peak_bytes"),
                "process_peak_bytes": report.get("measured_peak_bytes"),
                "kernel_peak_bytes": report.get("kernel_peak_bytes"),
                "limit_bytes": report.get("memory_limit_bytes")}
    paths = [plots.plot_schedule(graph, plan, out / "schedule.png",
                                 f"{report['model']}: schedule at "
                                 f"{plan.budget_bytes / 2**20:.0f} MiB"),
             plots.plot_memory(planned, plan.budget_bytes, out / "memory.png", plain=plain,
                               measured=measured, title=f"{report['model']} on "
                               f"{report['device']}: memory over one step")]
    sweep = out / "sweep.json"
    if sweep.is_file():
        import json
        rows = json.loads(sweep.read_text())["sweep"]
        paths.append(plots.plot_sweep(rows, out / "sweep.png", f"{report['model']}: budget sweep"))
    return [str(p) for p in paths]
