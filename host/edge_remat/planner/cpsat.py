"""The CP-SAT interval planner: Moccasin's O(n) residency intervals, with paging, energy, deadline.

For node v, residencies j = 0 .. C_v - 1 on the slot timeline of `intervals.Timeline`:
  x[v,j]   present (x[v,0] = 1: the first compute, in stage v, is mandatory)
  c[v,j]   opened by a (re)compute in stage T[v,j]:  start = W*T + 1 + v
  p[v,j,z] opened by a page-in from tier z in stage T[v,j]:  start = W*T
  o[v,j,z] closed by a page-out to tier z at the end of stage E[v,j]:  end = (W+1)*E + 1
  start[v,j] <= end[v,j]; residencies of one node are ordered, disjoint, in increasing stages
Every compute of a consumer lies inside a residency of each of its producers (one Boolean per
candidate residency, exactly one of them true). One cumulative constraint holds RAM (residencies
with their tensor's size, computes with their workspace) under the budget less the fixed memory.
Objective: the recomputations' and paging's time or energy (with static power), integer-scaled
(see scaling.py); the deadline counts paging unless the problem says paging time is free.
"""

from __future__ import annotations

import os
import signal
import threading
import time as clock
from dataclasses import dataclass, field
from typing import Callable

from ..errors import import_extension
from .build_deadline import OutOfTime, until
from .interrupt import SearchInterrupted
from .intervals import COMPUTE, Residency, Timeline, decisions_from_intervals, \
    intervals_from_decisions
from .problem import Problem
from .scaling import cost_scale, memory_scale
from .stages import StageDecision

DEFAULT_MAX_RESIDENCIES = 2
# Up to this many nodes every node gets all the residencies it could ever use, which makes the
# model exactly the stage model (and its bound a bound of the stage model).
EXACT_NODES = 40
# A wider search (solve_cpsat_widening) is started only with this many seconds left.
WIDEN_MIN_S = 1.0
# On graphs of up to EXACT_NODES, the share of the time the default residency limit is searched
# before the exact model (solve_cpsat_widening).
CAPPED_FIRST_SHARE = 1 / 3

Progress = Callable[[float, float, float], None]  # (seconds, objective, bound), problem units


@dataclass
class CpsatOutcome:
    decisions: list[StageDecision] | None
    # "optimal" | "timeout" | "infeasible" | "unknown"; "limited": proven infeasible, but only
    # with the residency limit per node (exact_model False), so a schedule may still exist;
    # "build-timeout": the model was not built within the time limit, so not solved
    status: str
    objective: float | None  # the solver's value, in the problem's units
    bound: float | None
    solve_time_s: float
    first_solution_s: float | None
    best_solution_s: float | None
    exact_model: bool  # every node had all the residencies it could use
    scaling: dict = field(default_factory=dict)
    workers: int = 1
    progress: list[tuple[float, float, float]] = field(default_factory=list)
    # the largest limit of residencies per node under which no schedule was proven to fit
    # (solve_cpsat_widening), None where no search proved that
    proven_limit: int | None = None
    # residencies a node was given (a node whose hint had more got as many as the hint)
    residency_limit: int | None = None


def default_residency_limit(p: Problem) -> int:
    """Every residency a node could use on small graphs, DEFAULT_MAX_RESIDENCIES above."""
    return p.n + 1 if p.n <= EXACT_NODES else DEFAULT_MAX_RESIDENCIES


def useful_residencies(p: Problem, v: int) -> int:
    """The most residencies node v could use: one per stage that holds a consumer, plus one to
    page out from."""
    users = p.users[v]
    return 1 if not users else p.n - users[0] + 1


def residency_limits(p: Problem, cap: int, hint: list[list[Residency]] | None) -> list[int]:
    """How many residencies each node may have: never more than it could use (one per stage
    that holds a consumer, plus one to page out from), at most `cap` unless the hint needs more."""
    limits = []
    for v in range(p.n):
        limit = min(useful_residencies(p, v), cap)
        if hint is not None:
            limit = max(limit, len(hint[v]))
        limits.append(limit)
    return limits


def solve_cpsat(p: Problem, time_limit: float = 60.0, hint: list[StageDecision] | None = None,
                workers: int | None = None, max_residencies: int | None = None,
                progress: Progress | None = None,
                parameters: dict | None = None) -> CpsatOutcome:
    started = clock.perf_counter()
    # heavy, and clashes with highspy (see DESIGN.md)
    cp_model = import_extension("ortools.sat.python.cp_model")

    workers = workers or os.cpu_count() or 1
    hint_runs = intervals_from_decisions(p, hint) if hint is not None else None
    if max_residencies is None:
        max_residencies = default_residency_limit(p)
    limits = residency_limits(p, max_residencies, hint_runs)
    exact = all(limit >= useful_residencies(p, v) for v, limit in enumerate(limits))
    # leave time to decode and validate the answer within the limit
    tail = min(0.25 * time_limit, 0.1 + 0.001 * p.n)
    try:
        # the build is Python and grows with the graph: 5000 nodes took longer than a 10 s
        # limit, and CP-SAT then ran its minimum on top
        model = _Model(p, limits, cp_model, started + time_limit - tail)
        if hint_runs is not None:
            model.add_hint(hint_runs)
    except OutOfTime:
        return CpsatOutcome(None, "build-timeout", None, None, clock.perf_counter() - started,
                            None, None, exact, workers=workers,
                            residency_limit=max_residencies)

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.05, time_limit - tail
                                                - (clock.perf_counter() - started))
    solver.parameters.num_workers = workers
    for name, value in (parameters or {}).items():
        setattr(solver.parameters, name, value)
    listener = _Listener(model, started, progress, cp_model)
    try:
        code = solve_interruptibly(solver, model.model, listener.callback)
    except KeyboardInterrupt:
        if listener.first is None:
            raise
        # the stopped search still holds its best solution: Ctrl-C keeps it
        try:
            found = model.residencies(solver)
        except RuntimeError:  # the search ended without one to read: a plain Ctrl-C
            raise KeyboardInterrupt from None
        raise SearchInterrupted(decisions_from_intervals(p, found), "cpsat") from None
    elapsed = clock.perf_counter() - started

    status_name = {cp_model.OPTIMAL: "optimal", cp_model.FEASIBLE: "timeout",
                   cp_model.INFEASIBLE: "infeasible"}.get(code, "unknown")
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        if status_name == "infeasible" and not exact:
            status_name = "limited"  # infeasible only with the residency limit
        return CpsatOutcome(None, status_name, None, None, elapsed, None, None, exact,
                            model.scaling(), workers, listener.trace,
                            residency_limit=max_residencies)
    objective = model.to_units(solver.ObjectiveValue())
    bound = model.to_units(solver.BestObjectiveBound())
    decisions = decisions_from_intervals(p, model.residencies(solver))
    return CpsatOutcome(decisions, status_name, objective, min(bound, objective), elapsed,
                        listener.first, listener.best, exact, model.scaling(), workers,
                        listener.trace, residency_limit=max_residencies)


def solve_cpsat_widening(p: Problem, time_limit: float = 60.0,
                         hint: list[StageDecision] | None = None, workers: int | None = None,
                         progress: Progress | None = None) -> CpsatOutcome:
    """solve_cpsat, and where it proves only that no schedule fits under its limit of
    residencies per node (which it can do in a second where a plan needs a node recomputed more
    often), the time left goes to a search with twice the limit, and so on up to every residency
    a node could use (the exact stage model). The last search's outcome, with the time of all,
    and the largest limit proven too small. Once the limit gives every node all it could use,
    the model is exact and its status is never "limited": the widening stops there.

    On a graph small enough for the exact model (EXACT_NODES), the default limit is searched
    first, for at most CAPPED_FIRST_SHARE of the time, and the exact model then starts from its
    plan: with every residency open, CP-SAT can find no plan in a minute where the limited
    model proves its optimum in two seconds (a 30-node random layered graph at 0.7)."""
    started = clock.perf_counter()
    exact_limit = default_residency_limit(p)
    limit = min(exact_limit, DEFAULT_MAX_RESIDENCIES)
    capped_until = time_limit * CAPPED_FIRST_SHARE if limit < exact_limit else time_limit
    proven, trace = None, []
    while True:
        offset = clock.perf_counter() - started
        outcome = solve_cpsat(p, capped_until - offset, hint=hint, workers=workers,
                              max_residencies=limit, progress=_shifted(progress, offset))
        trace += [(offset + s, objective, bound) for s, objective, bound in outcome.progress]
        if outcome.status == "limited":
            proven = limit
        left = capped_until - (clock.perf_counter() - started)
        if outcome.status != "limited" or left < WIDEN_MIN_S:
            break
        limit *= 2  # residency_limits caps each node at what it could use
    _shift_times(outcome, offset)  # found by the last search, timed from the first
    left = time_limit - (clock.perf_counter() - started)
    if not outcome.exact_model and limit < exact_limit and left >= WIDEN_MIN_S \
            and outcome.status not in ("infeasible", "build-timeout"):
        outcome = _exact_from(p, outcome, left, hint, workers, progress, started, trace)
    outcome.solve_time_s = clock.perf_counter() - started
    outcome.progress, outcome.proven_limit = trace, proven
    return outcome


def _exact_from(p: Problem, capped: CpsatOutcome, time_limit: float,
                hint: list[StageDecision] | None, workers: int | None,
                progress: Progress | None, started: float,
                trace: list) -> CpsatOutcome:
    """The exact model's search, hinted with the limited search's plan (else the caller's): its
    outcome where it found a plan at least as good or proved there is none; else the limited
    search's plan, with the exact model's bound where it has one (a bound of every schedule)."""
    offset = clock.perf_counter() - started
    exact = solve_cpsat(p, time_limit, hint=capped.decisions or hint, workers=workers,
                        progress=_shifted(progress, offset))
    trace += [(offset + s, objective, bound) for s, objective, bound in exact.progress]
    _shift_times(exact, offset)
    if exact.status == "infeasible" or exact.decisions is not None and (
            capped.decisions is None or exact.objective <= capped.objective):
        return exact
    if exact.bound is not None and capped.decisions is not None:
        capped.bound, capped.exact_model = exact.bound, True
        capped.status = "optimal" if exact.bound >= capped.objective * (1 - 1e-9) \
            else "timeout"
    return capped


def _shifted(progress: Progress | None, offset: float) -> Progress | None:
    return None if progress is None else \
        (lambda s, objective, bound: progress(offset + s, objective, bound))


def _shift_times(outcome: CpsatOutcome, offset: float) -> None:
    """An outcome's solution times, counted from an earlier start."""
    if outcome.first_solution_s is not None:
        outcome.first_solution_s += offset
    if outcome.best_solution_s is not None:
        outcome.best_solution_s += offset


def solve_interruptibly(solver, model, callback) -> int:
    """solver.Solve in a thread while this one waits in Python, so that Ctrl-C raises
    KeyboardInterrupt here at once (a thread blocked inside Solve would only see it when the
    time limit ends the search): the search is stopped and the interrupt goes on. CP-SAT's own
    SIGINT catching, which swallows Ctrl-C during a solve and puts the C default handler in
    Python's place for good after it, is turned off here, for every caller; the handler is put
    back all the same, in case a library set another."""
    solver.parameters.catch_sigint_signal = False
    handler = signal.getsignal(signal.SIGINT) \
        if threading.current_thread() is threading.main_thread() else None
    outcome: dict = {}
    done = threading.Event()

    def search() -> None:
        try:
            outcome["code"] = solver.Solve(model, callback)
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            outcome["error"] = exc
        finally:
            done.set()

    # Polling an Event in sleeps, not Thread.join or Event.wait: a join that Ctrl-C interrupts
    # can leave the thread looking finished while CP-SAT's threads still run, and an
    # interrupt landing inside Event.wait's lock handling broke the lock ("release unlocked
    # lock", exit 70, QA: `timeout -s TERM 6 plan` on rl250); is_set takes no lock.
    threading.Thread(target=search, name="cp-sat", daemon=True).start()
    try:
        while not done.is_set():
            clock.sleep(POLL_S)
    except KeyboardInterrupt:
        solver.StopSearch()
        _wait_through_interrupts(done)  # leaving first aborts at exit, the search unread
        raise
    finally:
        if handler is not None and signal.getsignal(signal.SIGINT) is not handler:
            signal.signal(signal.SIGINT, handler)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["code"]


POLL_S = 0.05  # how often the waiting thread looks whether the search has returned


def _wait_through_interrupts(done: threading.Event) -> None:
    """Wait for the stopped search to return, through any further Ctrl-C or SIGTERM."""
    while not done.is_set():
        try:
            clock.sleep(POLL_S)
        except KeyboardInterrupt:
            pass


class _Listener:
    """Records (and optionally reports) each improving solution with the current bound."""

    def __init__(self, model: "_Model", started: float, progress: Progress | None, cp_model):
        outer = self

        class Callback(cp_model.CpSolverSolutionCallback):
            def on_solution_callback(self) -> None:
                outer.on_solution(self.ObjectiveValue(), self.BestObjectiveBound())

        self.callback = Callback()
        self.model, self.started, self.progress = model, started, progress
        self.first: float | None = None
        self.best: float | None = None
        self.trace: list[tuple[float, float, float]] = []

    def on_solution(self, objective: float, bound: float) -> None:
        now = clock.perf_counter() - self.started
        if self.first is None:
            self.first = now
        self.best = now
        value, low = self.model.to_units(objective), self.model.to_units(bound)
        self.trace.append((now, value, low))
        if self.progress is not None:
            self.progress(now, value, low)


class _Model:
    def __init__(self, p: Problem, limits: list[int], cp_model,
                 deadline: float = float("inf")):
        self.p, self.limits, self.cp = p, limits, cp_model
        m = self.model = cp_model.CpModel()
        n, line, tiers = p.n, Timeline(p.n), p.tiers
        self.line = line
        W, H = line.width, line.horizon
        self.mem = memory_scale([*p.sizes, *p.workspace], p.budget_bytes - p.fixed)
        capacity = self.mem.down(p.budget_bytes - p.fixed)

        self.x, self.c, self.pin, self.out = {}, {}, {}, {}
        self.start, self.end, self.stage, self.out_stage = {}, {}, {}, {}
        ram_intervals, ram_demands = [], []
        for v in until(deadline, range(n)):
            for j in range(limits[v]):
                first = j == 0
                x = m.NewConstant(1) if first else m.NewBoolVar(f"x{v}_{j}")
                start = m.NewConstant(line.compute(v, v)) if first else \
                    m.NewIntVar(line.base(v + 1), H - 1, f"s{v}_{j}")
                end = m.NewIntVar(line.compute(v, v), H - 1, f"e{v}_{j}")
                m.Add(end >= start)
                size = m.NewIntVar(1, H, f"d{v}_{j}")
                interval = m.NewOptionalIntervalVar(start, size, end + 1, x, f"r{v}_{j}")
                self.x[v, j], self.start[v, j], self.end[v, j] = x, start, end
                demand = self.mem.up(p.sizes[v])
                if demand:
                    ram_intervals.append(interval)
                    ram_demands.append(demand)
                if first:
                    self.c[v, j] = m.NewConstant(1)
                else:
                    stage = m.NewIntVar(v + 1, n - 1, f"T{v}_{j}")
                    self.stage[v, j] = stage
                    c = m.NewBoolVar(f"c{v}_{j}")
                    m.Add(start == W * stage + 1 + v).OnlyEnforceIf(c)
                    if v in p.stepped:  # not computed after its update: stepped weights
                        m.Add(stage <= p.stepped[v]).OnlyEnforceIf(c)
                    openers = [c]
                    for z in tiers:
                        pin = m.NewBoolVar(f"p{v}_{j}_{z}")
                        m.Add(start == W * stage).OnlyEnforceIf(pin)
                        # only what was paged out before can be paged in
                        m.AddBoolOr([self.out[v, jj, z] for jj in range(j)]).OnlyEnforceIf(pin)
                        self.pin[v, j, z] = pin
                        openers.append(pin)
                    m.Add(sum(openers) == x)
                    self.c[v, j] = c
                    previous = (v, j - 1)
                    m.Add(start >= self.end[previous] + 1).OnlyEnforceIf(x)
                    if j > 1:
                        m.AddImplication(x, self.x[previous])
                        m.Add(stage >= self.stage[previous] + 1).OnlyEnforceIf(x)
                    m.Add(stage == n - 1).OnlyEnforceIf(x.Not())  # pin down absent ones
                    m.Add(start == H - 1).OnlyEnforceIf(x.Not())
                if tiers:
                    out_stage = m.NewIntVar(v, n - 1, f"E{v}_{j}")
                    self.out_stage[v, j] = out_stage
                    outs = []
                    for z in tiers:
                        o = m.NewBoolVar(f"o{v}_{j}_{z}")
                        m.Add(end == (W + 1) * out_stage + 1).OnlyEnforceIf(o)
                        self.out[v, j, z] = o
                        outs.append(o)
                    m.Add(sum(outs) <= x)
                if p.workspace[v]:
                    ws = m.NewOptionalFixedSizeIntervalVar(start, 1, self.c[v, j], f"w{v}_{j}")
                    ram_intervals.append(ws)
                    ram_demands.append(self.mem.up(p.workspace[v]))
        self.capacity = capacity
        m.AddCumulative(ram_intervals, ram_demands, capacity)

        # every compute of w finds each input in exactly one residency that covers it
        self.cover = {}
        for w in until(deadline, range(n)):
            for jw in range(limits[w]):
                computed, at = self.c[w, jw], self.start[w, jw]
                for u in p.deps[w]:
                    choices = []
                    for ju in range(limits[u]):
                        y = m.NewBoolVar(f"y{w}_{jw}_{u}_{ju}")
                        if ju:
                            m.AddImplication(y, self.x[u, ju])
                        m.Add(self.start[u, ju] <= at - 1).OnlyEnforceIf(y)
                        m.Add(self.end[u, ju] >= at).OnlyEnforceIf(y)
                        self.cover[w, jw, u, ju] = y
                        choices.append(y)
                    m.Add(sum(choices) == computed)

        for z in tiers:
            capacity_bytes = p.costs.tiers[z].capacity_bytes
            if capacity_bytes is not None:
                held = []
                for v in range(n):
                    h = m.NewBoolVar(f"h{v}_{z}")
                    for j in range(limits[v]):
                        m.AddImplication(self.out[v, j, z], h)
                    held.append((h, p.sizes[v]))
                scale = memory_scale([s for _, s in held], capacity_bytes)
                m.Add(sum(scale.up(s) * h for h, s in held) <= scale.down(capacity_bytes))

        self._objective_and_deadline()

    def _events(self):
        """(literal, seconds, objective cost, is paging) of every optional event."""
        p, costs = self.p, self.p.costs
        energy = p.objective == "energy"
        per_second = costs.static_w if energy else 1.0  # time costs itself, or static power

        def cost(seconds: float, joules: float) -> float:
            return seconds * per_second + (joules if energy else 0.0)

        for (v, j), c in self.c.items():
            if j:
                yield c, costs.time_s[v], cost(costs.time_s[v], costs.energy_j[v]), False
        for (v, j, z), lit in self.pin.items():
            tier = costs.tiers[z]
            yield lit, tier.in_time_s[v], cost(tier.in_time_s[v], tier.in_energy_j[v]), True
        for (v, j, z), lit in self.out.items():
            tier = costs.tiers[z]
            yield lit, tier.out_time_s[v], cost(tier.out_time_s[v], tier.out_energy_j[v]), True

    def _objective_and_deadline(self) -> None:
        p, costs, m = self.p, self.p.costs, self.model
        events = list(self._events())
        if p.objective == "time":
            self.constant = p.plain_time
        else:
            self.constant = sum(costs.energy_j) + costs.static_w * p.plain_time
        self.cost = cost_scale([cost for _, _, cost, _ in events], self.constant)
        m.Minimize(sum(self.cost.down(cost) * lit for lit, _, cost, _ in events if cost))
        deadline = p.deadline_s()
        self.time = None
        if deadline is not None:
            counted = [(lit, t) for lit, t, _, paging in events
                       if t and (not paging or p.paging_time == "counted")]
            slack = deadline - p.plain_time
            self.time = cost_scale([t for _, t in counted], max(p.plain_time, slack))
            m.Add(sum(self.time.up(t) * lit for lit, t in counted)
                  <= max(-1, self.time.down(slack * (1 + 1e-12))))

    def to_units(self, scaled: float) -> float:
        return scaled * self.cost.unit + self.constant

    def scaling(self) -> dict:
        out = {"memory": self.mem.describe(), "objective": self.cost.describe()}
        if self.time is not None:
            out["deadline"] = self.time.describe()
        return out

    def add_hint(self, runs: list[list[Residency]]) -> None:
        m, p, line = self.model, self.p, self.line
        for v in range(p.n):
            for j in range(self.limits[v]):
                present = j < len(runs[v])
                if j:
                    m.AddHint(self.x[v, j], present)
                r = runs[v][j] if present else None
                if r is None:
                    continue
                if j:
                    m.AddHint(self.start[v, j], r.start)
                    m.AddHint(self.stage[v, j], line.stage(r.start))
                    m.AddHint(self.c[v, j], r.opener == COMPUTE)
                    for z in p.tiers:
                        m.AddHint(self.pin[v, j, z], r.opener == z)
                m.AddHint(self.end[v, j], r.end)
                for z in p.tiers:
                    m.AddHint(self.out[v, j, z], r.page_out == z)
                if r.page_out is not None:
                    m.AddHint(self.out_stage[v, j], line.stage(r.end))
        for (w, jw, u, ju), y in self.cover.items():
            if jw < len(runs[w]) and ju < len(runs[u]) and runs[w][jw].opener == COMPUTE:
                at, r = runs[w][jw].start, runs[u][ju]
                m.AddHint(y, r.start < at <= r.end)
            else:
                m.AddHint(y, False)

    def residencies(self, solver) -> list[list[Residency]]:
        p, value = self.p, solver.Value
        runs: list[list[Residency]] = [[] for _ in range(p.n)]
        for v in range(p.n):
            for j in range(self.limits[v]):
                if not value(self.x[v, j]):
                    continue
                opener = COMPUTE
                for z in p.tiers:
                    if j and value(self.pin[v, j, z]):
                        opener = z
                page_out = next((z for z in p.tiers if value(self.out[v, j, z])), None)
                runs[v].append(Residency(value(self.start[v, j]), value(self.end[v, j]), opener,
                                         page_out))
        return runs
