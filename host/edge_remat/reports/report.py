"""Short human-readable tables for the terminal."""

from __future__ import annotations

import re
from typing import Any

from edge_remat_agent.lifetimes import ALIGNMENT
from edge_remat_agent.units import counted

from ..units import fmt_bytes


def _order_note(plan_dict: dict) -> str:
    """Which execution order the plan runs in, where it is not the captured one."""
    if plan_dict.get("problem", {}).get("order") != "memory":
        return ""
    seed = plan_dict["solver"].get("order_seed")
    return "; memory-aware order" + (f", seed {seed}" if seed else "")


# Costs that are not seconds: the node-link benchmark files' (FLOP-like `cost_cpu`, or
# `duration`), random layered graphs' (integers 1..999) and unit costs (a file with none).
COST_UNIT_SOURCES = ("published", "synthetic", "unit")


def cost_units(cost_source: str | None) -> tuple[str, str]:
    """(time unit, energy unit) of a plan's or replay's figures: seconds and joules, or the
    graph file's own units where its costs are not seconds."""
    return ("cost units", "cost units") if cost_source in COST_UNIT_SOURCES else ("s", "J")


def problem_cost_units(problem: dict[str, Any]) -> tuple[str, str]:
    """cost_units of a plan's `problem` record (plans before it recorded costs: seconds)."""
    return cost_units(problem.get("costs", {}).get("cost_source"))


def _num(value: Any, fmt: str = "{:.4g}") -> str:
    return "-" if value is None else fmt.format(value)


def _home_io(predicted: dict[str, Any], key: str, unit: str) -> str:
    """What of compute went to the parameters' home (params on flash or the host), if any,
    and how many of its reads go on the IO timeline (page_in from home)."""
    value, reads = predicted.get(key), predicted.get("home_reads")
    return (f"parameters' home IO {_num(value)} {unit}"
            + (f", {counted(reads, 'read')} of it issued ahead" if reads else "")
            + ", ") if value else ""


def _power_note(plan_dict: dict[str, Any]) -> str:
    """Where no power model costed the plan, its joules are 1 W x compute time (QA: energy_j
    equal to time_s, the units J, nothing said)."""
    costs = plan_dict.get("problem", {}).get("costs", {})
    if costs.get("power_source") != "default" or costs.get("cost_source") in COST_UNIT_SOURCES:
        return ""
    pr = plan_dict.get("predicted", {})
    if pr.get("paging_time_s") or pr.get("home_io_time_s"):
        # QA: "energy follows time" beside 2.49 s of time and 0.40 J, 2.40 s of it home IO
        if pr.get("energy_paging_j") or pr.get("home_io_energy_j"):
            return ("; no power model: computing at 1 W, moving bytes at the flash's joules "
                    "per byte (--profile: the board's)")
        return ("; no power model: computing at 1 W, so energy follows the compute time, and "
                "paging and the parameters' home IO cost none (--flash-energy-per-byte prices "
                "them; --profile: the board's)")
    return "; no power model: computing at 1 W, so energy follows time (--profile: the board's)"


def plan_table(plan_dict: dict[str, Any]) -> str:
    s, pr = plan_dict["solver"], plan_dict["predicted"]
    budget, asked = plan_dict["budget_bytes"], asked_budget(plan_dict)
    sec, joule = problem_cost_units(plan_dict.get("problem", {}))
    rows = [
        ("status", f"{s['status']} ({s['name']}" + (f", fallback from {s['fallback_from']}"
                                                    if s.get("fallback_from") else "")
                   + (f", proven optimal by {s['proven_optimal_by']}"
                      if s.get("proven_optimal_by") else "") + ")"),
        # the budget asked (QA: --arena-fit's lower one was shown as the budget), and where
        # the schedule was planned lower so that the arena fits, that one beside it
        ("budget", f"{fmt_bytes(asked)} ({asked} B)" + (
            f"; the schedule planned at {fmt_bytes(budget)} ({budget} B) so that the arena "
            "fits it" if asked != budget else "")),
        ("predicted peak", f"{fmt_bytes(pr['peak_bytes'])} "
                           f"({share_of_budget(pr['peak_bytes'], asked)})"),
        ("TDI", f"{pr['tdi_percent']:.2f} %  ({counted(pr['recomputed'], 'recomputation')}"
                + _order_note(plan_dict) + ")"),
        ("time", f"{_num(pr['time_s'])} {sec}  (" + _home_io(pr, "home_io_time_s", sec)
                 + f"paging {_num(pr['paging_time_s'])} {sec}, "
                 f"{counted(pr['page_outs'], 'page-out')}, {counted(pr['page_ins'], 'page-in')}"
                 + (f"; {pr['paging_hidden_share']:.0%} of the IO hidden behind compute"
                    if pr.get("paging_hidden_share") is not None else "") + ")"),
        ("energy", f"{_num(pr['energy_j'])} {joule}  (compute {_num(pr['energy_compute_j'])}"
                   + (f" with parameters' home IO {_num(pr['home_io_energy_j'])}"
                      if pr.get("home_io_energy_j") else "") + ", paging "
                   f"{_num(pr['energy_paging_j'])}, static {_num(pr['energy_static_j'])})"
                   + _power_note(plan_dict)),
        *_accumulated_row(pr, sec, joule),
        ("bound", _num(s.get("lower_bound"))),
        ("gap", _num(None if s.get("gap") is None else 100 * s["gap"], "{:.2f} %")
                + _gap_note(s)),
        ("solve time", f"{s['solve_time_s']:.2f} s" + _overrun_note(s)),
    ]
    arena = plan_dict.get("arena")
    if arena is not None:
        d = arena["details"]
        over = d.get("over_tensor_peak")
        # the layout's status is about packing (optimal or not proven so), never about the
        # budget: "feasible" beside an arena past the budget read as "fits"
        packing = ", optimal layout" if d.get("status") == "optimal" else ""
        rows.append(("arena", f"{fmt_bytes(arena['size_bytes'])} ({arena['method']}{packing}; "
                              + (f"{over:.3f}x " if over else "") + "the planned tensor peak)"))
        rows.append(("arena fits", ("no: " if arena_over_budget(plan_dict) else "")
                     + arena_fit_note(plan_dict)))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _accumulated_row(predicted: dict[str, Any], sec: str, joule: str) -> list[tuple[str, str]]:
    """With --accumulate K, what a step of K micro-passes costs (time and energy above are a
    pass's); none without."""
    step = predicted.get("accumulated_step")
    if not step:
        return []
    return [("a step", f"{_num(step['time_s'])} {sec}, {_num(step['energy_j'])} {joule}  "
                       f"({step['micro_batches']} micro-passes, --accumulate; the time and "
                       "energy above are one pass's, and the optimizer steps, and its state "
                       "moves, in the last pass only)")]


def _overrun_note(s: dict[str, Any]) -> str:
    """Where the first plan came after the time limit (a short limit on a large graph), say
    so: the search does not stop before it has a plan, and a solve time past the limit with no
    word read as the limit ignored."""
    limit, first = s.get("time_limit_s"), s.get("first_plan_s")
    if limit is None or first is None or first <= limit or s["solve_time_s"] <= limit:
        return ""
    return (f"  (past the {limit:g} s time limit: the first plan took {first:.2f} s, and "
            "planning does not stop before it has one)")


def _gap_note(s: dict[str, Any]) -> str:
    """Why a status and its gap seem to disagree. "optimal" is the solver's proof in its own
    model (paging counted stop-the-world, costs scaled to integers), the gap is the plan's
    exact cost against the bound kept (bound_scope); "timeout" with no gap left is optimal by
    that bound."""
    gap = s.get("gap")
    if gap is None:
        return ""
    if str(s.get("proven_optimal_by")).startswith("its cost") and gap > 1e-6:
        # QA: "costs scaled to integers" was said of a plan no solver proved
        return (f"  (optimal by its cost, as the status says; the bound, "
                f"{s.get('bound_scope', 'the solver')}, does not reach it)")
    if s["status"] == "optimal" and gap > 1e-6:
        model = "paging counted stop-the-world" if "stop_the_world_bound" in s else \
            "costs scaled to integers"
        return (f"  (optimal in the solver's own model, {model}; the gap is the plan's exact "
                f"cost against the bound: {s.get('bound_scope', 'the solver')})")
    if s["status"] == "timeout" and gap <= 1e-9:
        return "  (the bound meets the plan: optimal by the bound, though the solver's proof "\
            "ran out of time)"
    return ""


def asked_budget(plan_dict: dict[str, Any]) -> int | None:
    """The budget asked: the plan's own, or, where --arena-fit planned the schedule lower so
    that the arena fits, the one before that (the plan's is then the lower one)."""
    arena = plan_dict.get("arena") or {"details": {}}
    return arena["details"].get("fit", {}).get("budget_bytes", plan_dict.get("budget_bytes"))


def arena_footprint(plan_dict: dict[str, Any]) -> int:
    """What `run --allocator arena` allocates for the plan: its arena and fixed memory."""
    return plan_dict["arena"]["size_bytes"] + plan_dict["problem"]["fixed_bytes"]


def arena_over_budget(plan_dict: dict[str, Any]) -> int:
    """Bytes by which the arena and fixed memory (what `run --allocator arena` allocates) pass
    the budget asked (the one before any --arena-fit re-planning); 0 where they fit."""
    return max(0, arena_footprint(plan_dict) - asked_budget(plan_dict))


def arena_fit_note(plan_dict: dict[str, Any]) -> str:
    """Whether the arena and fixed memory fit the budget, in words: by how much they pass it,
    what --arena-fit tried and what to do."""
    arena, over = plan_dict["arena"], arena_over_budget(plan_dict)
    fit = arena["details"].get("fit", {})
    if over == 0:
        lowered = fit.get("planned_at_bytes", plan_dict["budget_bytes"]) < fit.get(
            "budget_bytes", plan_dict["budget_bytes"])
        return "yes, with fixed memory" + (
            f" (--arena-fit planned the schedule at {fit['planned_at_bytes']} B)" if lowered
            else "")
    footprint = arena_footprint(plan_dict)
    # an optimal layout "1.000x the planned peak" that still passes the budget read as a
    # contradiction: where the excess is no more than the storages' alignment, say so
    # (the layout's lower bound counts each storage at its aligned size, the peak at its own)
    details = arena["details"]
    padding = details.get("lower_bound_bytes", 0) - details.get("planned_tensor_peak_bytes", 0)
    cause = (f", no more than the alignment padding, {fmt_bytes(padding)}: each storage "
             f"starts on a {ALIGNMENT}-byte boundary" if 0 < over <= padding else "")
    said = (f"arena + fixed memory {fmt_bytes(footprint)} pass the budget by "
            f"{fmt_bytes(over)} ({over} B{cause}), so `run --allocator arena` needs that much "
            "more")
    if "tries" not in fit:
        return f"{said}; --arena-fit re-plans at lower budgets until it fits"
    tries = fit["tries"]
    last = tries[-1]
    if "no_plan" in last:
        why = f"no schedule plans at {last['budget_bytes']} B"
        todo = "a larger budget"
    else:
        why = f"the lowest, {last['budget_bytes']} B, still {fmt_bytes(last['footprint_bytes'])}"
        todo = f"a lower --budget for the schedule (below {last['budget_bytes']} B)"
    # the exact layout first, where it can fit: no arena is below the most bytes live at once
    asked = fit.get("budget_bytes", plan_dict["budget_bytes"])
    fixed = plan_dict["problem"]["fixed_bytes"]
    if arena["method"] != "cpsat" and \
            arena["details"].get("lower_bound_bytes", asked) + fixed <= asked:
        todo = f"--arena cpsat (a tighter layout, which can fit), else {todo}"
    return (f"{said}; --arena-fit could not fit it in {counted(len(tries), 'solve')} "
            f"({why}): try {todo}")


def share_of_budget(peak: int, budget: int) -> str:
    """"79.2% of budget"; far over it, a factor (QA: a plan edited to a 10-byte budget read
    "38051280.0% of budget")."""
    share = peak / budget
    return f"{share:.1%} of budget" if share <= 10 else f"{share:,.0f}x the budget of " \
        f"{fmt_bytes(budget)}"


def sim_table(summary: dict[str, Any], budget: int | None,
              cost_source: str | None = None) -> str:
    sec, joule = cost_units(cost_source)
    rows = [("peak", fmt_bytes(summary["peak_bytes"]) + (
        f" ({share_of_budget(summary['peak_bytes'], budget)})" if budget else "")),
            ("TDI", f"{summary['tdi_percent']:.2f} %"),
            ("time", f"{summary['time_s']:.4g} {sec}"
                     + (f" (parameters' home IO {summary['home_io_time_s']:.4g} {sec})"
                        if summary.get("home_io_time_s") else "")),
            ("energy", f"{summary['energy_j']:.4g} {joule}"),
            ("recomputed", str(summary["recomputed"])),
            ("paged", f"{summary['page_outs']} out, {summary['page_ins']} in"),
            *_accumulated_row(summary, sec, joule)]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def sweep_cost_units(points) -> tuple[str, str]:
    """(time unit, energy unit) of a sweep's figures: its plans', seconds and joules where
    none planned."""
    planned = next((p.report.plan for p in points if p.report is not None), None)
    return problem_cost_units(planned.problem) if planned is not None else ("s", "J")


def sweep_table(points, objective: str, labels: dict[float, str] | None = None) -> str:
    """One line per budget of a sweep: what the plan costs and how sure the solver is.
    `labels`: each budget's, as its plan file is named (sweep.fraction_labels of the whole
    sweep; by default of these points)."""
    if labels is None:
        from ..sweep import fraction_labels
        labels = fraction_labels([point.fraction for point in points])
    label = max([7] + [len(labels[point.fraction]) for point in points])
    units = sweep_cost_units(points)[0] != "s"
    energy, time = ("energy", "time") if units else ("energy J", "time s")
    # the status column as wide as its widest entry ("infeasible_deadline" is 19)
    width = max([11] + [len(point.status) for point in points])
    # the solver column as wide as its widest name ("heuristic:keep-all" is 18)
    named = max([16] + [len(p.report.plan.solver["name"]) for p in points if p.report])
    header = (f"{'budget':>{label}}  {'bytes':>12}  {'TDI %':>7}  {energy:>10}  {time:>10}  "
              f"{'status':<{width}}  {'gap %':>6}  {'solver':<{named}}  {'solve s':>7}")
    lines = [f"# objective: {objective}" + ("; energy and time in the graph file's cost units"
                                            if units else ""), header, "-" * len(header)]
    for point in points:
        if point.report is None:
            lines.append(f"{labels[point.fraction]:>{label}}  {_num(point.budget_bytes, '{:d}'):>12}  "
                         f"{'-':>7}  {'-':>10}  {'-':>10}  {point.status:<{width}}  {'-':>6}  "
                         f"{'-':<{named}}  {'-':>7}")
            continue
        plan = point.report.plan
        pr, s = plan.predicted, plan.solver
        gap = None if s.get("gap") is None else 100 * s["gap"]
        lines.append(f"{labels[point.fraction]:>{label}}  {plan.budget_bytes:>12d}  "
                     f"{pr['tdi_percent']:>7.2f}  {pr['energy_j']:>10.4g}  {pr['time_s']:>10.4g}  "
                     f"{s['status']:<{width}}  {_num(gap, '{:.2f}'):>6}  {s['name']:<{named}}  "
                     f"{s['solve_time_s']:>7.2f}")
    return "\n".join(lines + _sweep_notes(points, labels))


def _sweep_notes(points, labels: dict[float, str]) -> list[str]:
    """Each budget's message under the table, said once: budgets whose message differs from
    an earlier one's only in its figures (the same long 'no plan' explanation at each budget)
    are named on one line after it."""
    first: dict[str, Any] = {}  # a message with its figures blanked -> (first point, the rest)
    for point in points:
        if point.message:
            first.setdefault(re.sub(r"\d+(\.\d+)?", "#", point.message), (point, []))[1].append(
                point)
    notes = []
    for said, alike in first.values():
        notes.append(f"{labels[said.fraction]}: {said.message}")
        rest = alike[1:]
        if rest:
            own = "" if all(p.message == said.message for p in rest) else \
                f", with {'its' if len(rest) == 1 else 'their'} own figures (--json has " \
                "each budget's message)"
            notes.append(", ".join(labels[p.fraction] for p in rest)
                         + f": the same as {labels[said.fraction]}{own}")
    return notes
