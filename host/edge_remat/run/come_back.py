"""A run that gave up on its link wrote OUT/report.json saying `link_lost` (orchestrate.py);
the job may go on and end on the board. `job-status ID --wait --out OUT/board`, the way back the
line named, then rewrites that report with the job's real final state."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from edge_remat_agent.formats.fields import dump_json

from ..remote import full_result
from ..transport.errors import as_reported
from .job_end import ENDED_WELL, ended_well_status


def settled_line(path: Path, was: str, job_id: str, record: dict) -> str:
    """What job-status says of the run report it rewrote."""
    if record.get("kind") == "profile":
        return (f"{path} now says that the run's profile job {job_id} ended: "
                f"{final_status(record)}; the run itself planned and trained nothing (it said "
                f"{was})")
    return f"{path} now says how job {job_id} ended: {final_status(record)} (it said {was})"


def _settle_profile_stage(report: dict, was: str, record: dict) -> None:
    """A run that lost its link while it profiled the board: the job that went on was the
    profile, so the run stays as it ended, and the report says how the profile did (QA: it
    was rewritten 'finished', the run never having planned or trained)."""
    status = final_status(record)
    report.update({"message": f"{report.get('message')}; its profile job then ended on the "
                   f"board: {status}" + (f" ({record['error']})" if record.get("error") else "")
                   + ": the run planned and trained nothing; the same command again starts it",
                   "profile_job_state": record["state"]})


def final_status(record: dict) -> str:
    """A run report's status for an ended job's record, as `run` would have said it."""
    if record["state"] != "failed":
        return ended_well_status(record.get("result") or {})
    state = as_reported(record)["state"]  # cancelled, killed (out of memory) or failed
    return state if state in ("cancelled", "killed") else "failed"


# A run report's status where the run ended and its job may have gone on (the words for it):
# the link given up on, or Ctrl-C with --keep-running (QA: its report stayed "interrupted ...
# keeps running" after the way back fetched the finished job)
LEFT_RUNNING = {"link_lost": "the link was lost",
                "interrupted": "the run was interrupted and its job kept running"}


def settle_lost_report(out: Path, job_id: str, record: dict) -> Optional[tuple[Path, str]]:
    """Rewrite the run report of job `job_id` that the run left saying the job may go on
    (LEFT_RUNNING; an interrupted run's only where it did not cancel the job), ended as
    `record` says (in `out`, or its parent: the run's OUT, where `out` is OUT/board) with the
    job's final state and the steps its result gives; its path and the status it said, or
    None where there is no such report. The earlier message stays under that status's key."""
    for path in (out.parent / "report.json", out / "report.json"):
        try:
            report = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(report, dict) or report.get("job") != job_id:
            continue
        was = report.get("status")
        if was not in LEFT_RUNNING or was == "interrupted" and report.get("cancelled"):
            continue
        if record.get("kind") == "profile":
            _settle_profile_stage(report, was, record)
            dump_json(report, path)
            return path, was
        status = final_status(record)
        board_report = out / "run_report.json"
        from .orchestrate import with_run_limit  # the limit the job ran under, as run says it
        report = with_run_limit(report, record.get("memory_limit_bytes"))
        report.update({was: report.get("message"), "status": status,
                       "message": f"{LEFT_RUNNING[was]}, and the job then ended on the board: "
                       f"{status}" + (f" ({record['error']})" if record.get("error") else ""),
                       "job_state": record["state"]})
        result = full_result(record)  # the board's run_report.json where it was fetched
        if status in ENDED_WELL and isinstance(report.get("come_back"), dict):
            report = _completed(report, status, result, path.parent, out)
        elif result.get("steps") or result.get("per_step"):  # its steps, as `run` says them
            from ..reports.run_report import step_figures  # imports torch: only here
            report.update(step_figures(result))
        if status in ENDED_WELL and board_report.is_file():
            report["board_report"] = str(board_report)
        dump_json(report, path)
        if "come_back" in report.get("completed_from", ()):
            from edge_remat_agent.formats.fields import dump_text

            from ..reports.run_report import report_text
            dump_text(report_text(report) + "\n", path.parent / "report.txt")
        return path, was
    return None


def _completed(report: dict, status: str, result: dict, run_out: Path, fetched: Path) -> dict:
    """The report the run would have written had it waited for its job (orchestrate's
    build_report), from what the host knew once the job was sent (the stopped report's
    `come_back`: the plan in OUT/plan.json, the profile, the options) and the job's result;
    the trained weights moved from the fetch to OUT, the plots drawn. What only the waiting
    run could know is null with a note (a gradient check the host was to make). The stopped
    report's words stay: its status's key, `written`, `job`. QA: after --keep-running and
    job-status --wait --out OUT/board, report.json had steps null and no grad_check,
    predicted_*, recomputed, page_ins, plots nor profile, and weights.pt stayed in OUT/board."""
    from ..reports.run_report import build_report  # imports torch: only here
    from .out_files import draw_plots, trained_weights_into
    # the run's arguments, with the limit the job ran under (settle_lost_report's)
    known = {**report["come_back"], "memory_limit_bytes": report.get("memory_limit_bytes")}
    notes = []
    plan = None
    plan_file = known.pop("plan_file", None)
    if plan_file:
        try:
            plan = json.loads(Path(plan_file).read_text())
        except (OSError, ValueError) as error:
            notes.append(f"the plan {plan_file} could not be read ({error}): its figures are "
                         "null")
    schedule = known.pop("schedule", None)
    plots = known.pop("plots", False)
    host_check = known.pop("host_grad_check", False)
    kernel = result.get("kernel_peak") or {}
    full = build_report(**known, plan=plan, status=status,
                        message=report["message"],
                        result=result,
                        kernel_peak_bytes=kernel.get("bytes"),
                        kernel_peak_source=kernel.get("source", ""))
    if schedule and isinstance(full.get("optimizer"), dict):
        full["optimizer"].update(schedule)
    if host_check:
        notes.append("grad_check is null: the host was to check the gradients after the job "
                     "(the board had no room for a plain step beside it), and the run stopped "
                     "before; `run` again checks them")
    if run_out / "board" == fetched:
        full["weights"] = trained_weights_into(run_out, {"status": status, "result": result})
    else:
        full["weights"] = None
        notes.append(f"weights: fetched into {fetched}, not the run's {run_out / 'board'}; "
                     "left there")
    if plots and plan is not None and status == "finished":
        try:
            full["plots"] = draw_plots(_load_graph(known), Path(plan_file), full, run_out,
                                       _load_profile(known))
        except Exception as error:  # noqa: BLE001 - the report comes first
            notes.append(f"plots: not drawn ({type(error).__name__}: {error})")
    keep = {k: report[k] for k in ("job", "written", "link_lost", "interrupted", "reconnects")
            if k in report}
    full.update(keep, message=report["message"], job_state=report.get("job_state"),
                report=str(run_out / "report.json"),
                completed_from=["come_back", "the job's result"], notes=notes)
    return full


def _load_graph(known: dict):
    from edge_remat_agent.formats import load_graph
    return load_graph((known.get("paths") or {})["graph"])


def _load_profile(known: dict):
    path = (known.get("profile") or {}).get("path")
    if not path:
        return None
    from edge_remat_agent.formats import load_profile
    return load_profile(path)
