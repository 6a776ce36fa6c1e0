"""`edge-remat plan --sweep 0.3:1.0:0.1`: the cost of training against the memory budget.

Budgets are solved from the smallest up, each hinted with the plan found just below it (a plan
that fits a budget fits every larger one), so each solve starts from a schedule that is already
good and spends its time improving it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from .planner.interrupt import PlanInterrupted
from .planner.problem import InfeasibleBudget, InfeasibleDeadline, Problem
from .planner.solve import NoPlan, SolveReport, solve
from .units import Budget, UnitError


@dataclass
class SweepPoint:
    fraction: float
    budget_bytes: int | None
    status: str  # a plan status, or "infeasible" | "infeasible_deadline" | "no plan"
    report: SolveReport | None = None
    message: str = ""
    smallest_bytes: int | None = None  # where infeasible: the floor (a schedule needs at least)
    smallest_deadline: float | None = None  # where infeasible_deadline: the least one met


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C during a sweep: `points` are the budgets solved before it, and the one it
    stopped with its best plan so far (status "interrupted") where one existed."""

    def __init__(self, points: list[SweepPoint]):
        super().__init__()
        self.points = points


MAX_FRACTION = 15.0  # a bare number above this would be read as bytes (units.py)
MAX_POINTS = 1000


def parse_sweep(text: str) -> list[float]:
    """'0.3:1.0:0.1' -> [0.3, 0.4, ..., 1.0] (fractions of the plain peak; stop included)."""
    parts = text.replace("%", "").split(":")
    try:
        start, stop, step = (float(x) for x in parts)
    except ValueError:
        raise UnitError(f"cannot read sweep {text!r}: use START:STOP:STEP, e.g. 0.3:1.0:0.1")\
            from None
    if "%" in text:
        start, stop, step = start / 100, stop / 100, step / 100
    if not (0 < start <= stop and step > 0) or not math.isfinite(stop):
        raise UnitError(f"sweep {text!r} needs 0 < START <= STOP and STEP > 0")
    if stop > MAX_FRACTION or (stop - start) / step > MAX_POINTS:
        raise UnitError(f"sweep {text!r} is too wide: fractions up to {MAX_FRACTION:g} of the "
                        f"plain peak, at most {MAX_POINTS} budgets")
    count = int(round((stop - start) / step + 1e-9)) + 1
    # once each: a step finer than the rounding gives one budget several times
    return list(dict.fromkeys(round(start + k * step, 10) for k in range(count)
                              if start + k * step <= stop + 1e-9))


LABEL_DECIMALS = 2  # plan-0.30.json, ...: as many as every sweep of a step of 0.01 or more
MAX_LABEL_DECIMALS = 10  # parse_sweep's rounding: each of its fractions said exactly in as many


def fraction_labels(fractions: list[float]) -> dict[float, str]:
    """Each budget's label in the table, its plan file's name and sweep.json: two decimals
    (0.30), or the fewest beyond that which say every budget of the sweep as it is, and so
    tell them apart (QA: 0.505 and 0.51 were both "0.51", and the first's plan file was
    overwritten by the second's)."""
    for decimals in range(LABEL_DECIMALS, MAX_LABEL_DECIMALS + 1):
        labels = {fraction: f"{fraction:.{decimals}f}" for fraction in fractions}
        if all(float(label) == fraction for fraction, label in labels.items()) and \
                len(set(labels.values())) == len(labels):
            return labels
    return {fraction: repr(fraction) for fraction in fractions}  # not from parse_sweep


def run_sweep(make_problem: Callable[[Budget], Problem], fractions: list[float], solver: str,
              time_limit: float, backend: str, workers: int | None) -> list[SweepPoint]:
    """One point per budget, from the smallest up; Ctrl-C raises SweepInterrupted with the
    points solved so far."""
    points, hint = [], None
    for fraction in sorted(fractions):
        problem = None
        try:
            problem = make_problem(Budget(fraction=fraction))
            report = solve(problem, solver, time_limit, backend, workers, hint=hint)
        except InfeasibleBudget as exc:
            points.append(SweepPoint(fraction, problem.budget_bytes if problem else None,
                                     "infeasible", message=str(exc),
                                     smallest_bytes=exc.smallest_bytes))
            continue
        except InfeasibleDeadline as exc:  # a larger budget may meet it: the sweep goes on
            points.append(SweepPoint(fraction, problem.budget_bytes, "infeasible_deadline",
                                     message=str(exc), smallest_deadline=exc.smallest_deadline))
            continue
        except NoPlan as exc:
            points.append(SweepPoint(fraction, problem.budget_bytes, "no plan",
                                     message=str(exc)))
            continue
        except PlanInterrupted as stop:
            points.append(SweepPoint(fraction, problem.budget_bytes, "interrupted",
                                     stop.report))
            raise SweepInterrupted(points) from None
        except KeyboardInterrupt:
            raise SweepInterrupted(points) from None
        hint = report
        points.append(SweepPoint(fraction, problem.budget_bytes, report.plan.solver["status"],
                                 report))
    return points


def smallest_feasible(point: SweepPoint) -> dict:
    """A row's floor (with its older name, as `plan --json`'s error gives both) or smallest
    deadline, named as `plan --json`'s error names them."""
    return {key: value for key, value in (("budget_floor_bytes", point.smallest_bytes),
                                          ("smallest_feasible_budget_bytes", point.smallest_bytes),
                                          ("smallest_feasible_deadline", point.smallest_deadline))
            if value is not None}


def no_plan_error(points: list[SweepPoint]) -> Exception:
    """The error of a sweep in which no budget planned, as a single budget's would be: the
    floor (the least bytes a schedule needs) where every one was below it, the smallest
    deadline where the largest budget missed the deadline, else the largest budget's
    reason."""
    span = f"{points[0].fraction:g}-{points[-1].fraction:g}" if len(points) > 1 else \
        f"{points[0].fraction:g}"
    smallest = max((p.smallest_bytes for p in points if p.smallest_bytes), default=None)
    if all(p.status == "infeasible" for p in points) and smallest is not None:
        largest = points[-1]
        plain = largest.budget_bytes / largest.fraction if largest.budget_bytes else None
        share = f" ({smallest / plain:.3g} of the plain peak)" if plain else ""
        return InfeasibleBudget(
            f"no budget of the sweep ({span} of the plain peak) plans: every schedule needs at "
            f"least {smallest} bytes{share}; sweep from there", smallest)
    if points[-1].status == "infeasible_deadline":  # the largest budget: the least deadline
        return InfeasibleDeadline(f"no budget of the sweep ({span} of the plain peak) plans; "
                                  f"at {points[-1].fraction:g}: {points[-1].message}",
                                  points[-1].smallest_deadline)
    return NoPlan(f"no budget of the sweep ({span} of the plain peak) plans; at "
                  f"{points[-1].fraction:g}: {points[-1].message}")
