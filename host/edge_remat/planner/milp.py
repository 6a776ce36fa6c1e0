"""The POET-style MILP (stages x nodes, Checkmate's memory accounting, with paging) via PuLP.

Variables, for stage t and node i (frontier-advancing: stage t computes node t for the first
time; indices i <= t only):
  R[t,i]   compute i in stage t (R[t,t] = 1)
  S[t,i]   i is in RAM at the start of stage t
  In[t,i]  page i in from a tier at the start of stage t        (per tier)
  Out[t,i] page i out to a tier at the end of stage t            (per tier)
  F[t,i]   i is on a tier at the start of stage t (continuous)  (per tier)
  Free[t,i,k]  i leaves RAM right after computing k in stage t (continuous, k a user of i, or i)
  U[t,k]   RAM in use after computing k in stage t (continuous)
The memory accounting matches `stages.lower_stage` instruction for instruction, so a solution's
memory bound is exact for the plan it lowers to. Sizes are divided by the budget and costs by the
plain schedule's, so the solver never sees bytes next to joules.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import tempfile
import threading
import time as clock
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .build_deadline import OutOfTime, until
from .highs import quiet_highspy
from .problem import Problem
from .stages import StageDecision

BACKENDS = ("cbc", "highs")
# The solver's own limit is what is left of `time_limit` after building the model, less
# UNCOVERED_PER_BUILD x the build time for what that limit does not cover, all of which grows
# with the model: PuLP writing the model file and reading the solution back, and CBC's start
# (reading the model and the warm start, the root LP, preprocessing), which its limit does not
# interrupt. my_model at 50% (12,407 columns) on 2 shared cores: built in 0.58-0.76 s, then
# 0.45 s in PuLP's files and CBC 0.9-1.6 s past its -sec. Never below MIN_SOLVER_S.
UNCOVERED_PER_BUILD, MIN_SOLVER_S = 3.0, 0.5
# The model grows with n^2 (x the mean in-degree, x the tiers): random_layered(n, seed=0) at
# 0.8 without paging, built on 2 shared cores: 100 nodes 33,068 variables in 2.1 s and 123 MB,
# 200 nodes 151,577 in 13.7 s and 643 MB, 300 nodes 356,192 in 34 s and 1.6 GB (about 0.1 ms
# and 4.5 kB a variable; writing the model file for CBC takes longer again). An explicit
# `--solver milp` above MAX_VARIABLES is refused: 1000 nodes would take 9+ GB and minutes.
MAX_VARIABLES, BYTES_PER_VARIABLE = 400_000, 4500


@dataclass
class MilpOutcome:
    decisions: list[StageDecision] | None
    # "optimal" | "feasible" | "infeasible" | "timeout" | "failed" (solver crashed) |
    # "build-timeout" | "stopped at the time limit" (CBC killed past it, its plan lost)
    status: str
    objective: float | None  # in the problem's units (seconds or joules)
    bound: float | None
    solve_time_s: float
    backend: str


def model_variables(p: Problem) -> int:
    """How many variables the MILP of `p` has (what _Model builds), without building it."""
    n, tiers = p.n, len(p.tiers)
    pairs = n * (n - 1) // 2  # (t, i) with i < t
    free = sum((n - k) * (len(p.deps[k]) + 1) for k in range(n))
    held = sum(1 for z in p.tiers if p.costs.tiers[z].capacity_bytes is not None) * n
    return 2 * pairs + tiers * (3 * pairs + n) + free + pairs + n + held


def too_large(p: Problem) -> str | None:
    """Why the MILP of `p` is not worth building (None where it is)."""
    count = model_variables(p)
    if count <= MAX_VARIABLES:
        return None
    return (f"--solver milp on {p.n} nodes would build a {count:,}-variable model (about "
            f"{count * BYTES_PER_VARIABLE / 1e9:.1f} GB and minutes to build; the MILP is kept "
            f"to {MAX_VARIABLES:,}): use --solver auto or cpsat")


@contextmanager
def solver_files():
    """A folder for the solver's files (PuLP's model and warm start, CBC's solution and log)
    that, however it is left, leaves neither its files nor a process naming it: CBC runs on as
    an orphan where Ctrl-C interrupts PuLP's wait for it, or kills the isolated child that
    started it (minutes of CPU, and 68 MB model files in /tmp, at 241 nodes)."""
    folder = tempfile.mkdtemp(prefix="edge-remat-milp-")
    try:
        yield folder
    finally:
        _kill_processes_naming(folder)
        shutil.rmtree(folder, ignore_errors=True)


def _kill_processes_naming(folder: str, reap: bool = True) -> None:
    """SIGKILL (CBC may take minutes to obey SIGTERM) every process with a file of `folder` on
    its command line; reaped where it is this process's child, unless `reap` is false (another
    thread waits for it). Linux (/proc) only."""
    prefix = os.path.join(folder, "").encode()
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # gone, or not ours to read
        if int(entry.name) != os.getpid() and any(a.startswith(prefix) for a in args):
            try:
                os.kill(int(entry.name), signal.SIGKILL)
                if reap:
                    os.waitpid(int(entry.name), 0)
            except (ProcessLookupError, ChildProcessError, PermissionError):
                pass  # gone already, or an orphan that init reaps


class _Watchdog:
    """Kills the solver processes naming `files` at `deadline` (a time.perf_counter() time),
    unless cancelled first; `fired` says whether it did."""

    def __init__(self, files: str, deadline: float):
        self.files, self.fired = files, False
        self._timer = threading.Timer(max(0.0, deadline - clock.perf_counter()), self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        self.fired = True
        # PuLP's wait for CBC reaps it and sees its exit status: reaped here, it would read
        # as a clean exit
        _kill_processes_naming(self.files, reap=False)

    def cancel(self) -> None:
        self._timer.cancel()


def solve_milp(p: Problem, time_limit: float = 60.0, backend: str = "cbc",
               warm_start: list[StageDecision] | None = None, threads: int | None = None,
               budget_margin_bytes: int = 0, files: str | None = None) -> MilpOutcome:
    """The MILP's best schedule within `time_limit` seconds, model building included.
    `files`: a folder from solver_files() for the solver's files (one of its own otherwise)."""
    if files is None:
        with solver_files() as files:
            return solve_milp(p, time_limit, backend, warm_start, threads,
                              budget_margin_bytes, files)
    import pulp  # heavy, and only needed when this solver is chosen

    if backend not in BACKENDS:
        raise ValueError(f"MILP backend must be one of {BACKENDS}, got {backend!r}")
    started = clock.perf_counter()
    deadline = started + time_limit  # the whole limit, model building included
    # Past this the time left cannot cover the solver's start (see UNCOVERED_PER_BUILD), so
    # the build stops there and the solver is not started: 241 nodes once took 30 s of a 20 s
    # limit to build, then CBC ran for minutes.
    build_deadline = started + time_limit / (1 + UNCOVERED_PER_BUILD)
    try:
        model = _Model(p, pulp, p.budget_bytes - budget_margin_bytes, build_deadline)
    except OutOfTime:
        return MilpOutcome(None, "build-timeout", None, None, clock.perf_counter() - started,
                           backend)
    if warm_start is not None:
        model.set_start(warm_start)
    threads = threads or os.cpu_count() or 1
    built_s = clock.perf_counter() - started
    time_limit = max(MIN_SOLVER_S, time_limit - (1 + UNCOVERED_PER_BUILD) * built_s)
    log = Path(files) / "cbc.log"
    if backend == "cbc":
        solver = pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit, threads=threads,
                                   warmStart=warm_start is not None, logPath=str(log),
                                   gapRel=1e-6)
        solver.tmpDir = files  # its model, warm start and solution: see solver_files
    else:
        quiet_highspy()  # PuLP's HiGHS makes a solver: its banner is spent first
        solver = pulp.HiGHS(msg=False, timeLimit=time_limit, threads=threads, gapRel=1e-6)
    # CBC's limit does not reach its root LP: digits-cnn's 192 nodes with paging (204,296
    # columns) spent 133 s there under -sec 38.6, and `plan --time-limit 60` took 187 s. So
    # CBC is stopped when the whole limit has passed, with whatever it had found lost.
    watchdog = _Watchdog(files, deadline) if backend == "cbc" else None
    try:
        model.prob.solve(solver)
    except pulp.PulpSolverError:  # CBC exited non-zero (once in ~10 runs cut off at 0.5 s,
        # my_model at 50%): no answer from it, which the heuristics' plan outlives
        status = "stopped at the time limit" if watchdog and watchdog.fired else "failed"
        return MilpOutcome(None, status, None, None, clock.perf_counter() - started, backend)
    finally:
        if watchdog is not None:
            watchdog.cancel()
    bound = _cbc_bound(log) if backend == "cbc" else _highs_bound(model.prob)
    if bound is not None:  # solvers report the bound without the objective's constant term
        bound += model.prob.objective.constant
    stopped_early = _cbc_stopped(log) if backend == "cbc" else _highs_stopped(model.prob)
    cut_short = backend == "cbc" and _cbc_preprocessing_cut_short(log, time_limit)
    elapsed = clock.perf_counter() - started
    scale = model.objective_scale
    status_code, sol_status = model.prob.status, model.prob.sol_status
    infeasible = status_code == pulp.LpStatusInfeasible or sol_status == pulp.LpSolutionInfeasible
    if infeasible and not cut_short:
        return MilpOutcome(None, "infeasible", None, None, elapsed, backend)
    has_solution = sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible)
    if not has_solution:
        return MilpOutcome(None, "timeout", None, None if bound is None else bound * scale,
                           elapsed, backend)
    value = pulp.value(model.prob.objective) * scale
    optimal = sol_status == pulp.LpSolutionOptimal and not stopped_early
    if optimal and bound is None:
        bound = value / scale
    return MilpOutcome(model.decisions(), "optimal" if optimal else "timeout", value,
                       None if bound is None else min(bound * scale, value), elapsed, backend)


class _Model:
    def __init__(self, p: Problem, pulp, budget_bytes: int, deadline: float = float("inf")):
        self.p, n, tiers = p, p.n, p.tiers

        def stages(first=0):  # first..n-1, the deadline checked between stages
            return until(deadline, range(first, n))

        mem_scale = float(max(budget_bytes - p.fixed, 1))
        size = [s / mem_scale for s in p.sizes]
        ws = [w / mem_scale for w in p.workspace]
        cap = (budget_bytes - p.fixed) / mem_scale
        prob = pulp.LpProblem("remat_paging", pulp.LpMinimize)
        B, C = pulp.LpBinary, pulp.LpContinuous
        V = pulp.LpVariable
        one = 1  # R[t,t] is the constant 1
        R = {(t, i): V(f"R_{t}_{i}", cat=B) for t in stages() for i in range(t)}
        S = {(t, i): V(f"S_{t}_{i}", cat=B) for t in stages(1) for i in range(t)}
        In = {(z, t, i): V(f"In_{z}_{t}_{i}", cat=B) for z in tiers for t in stages(1)
              for i in range(t)}
        Out = {(z, t, i): V(f"Out_{z}_{t}_{i}", cat=B) for z in tiers for t in stages()
               for i in range(t + 1)}
        F = {(z, t, i): V(f"F_{z}_{t}_{i}", 0, 1, cat=C) for z in tiers for t in stages(1)
             for i in range(t)}

        def r(t, i):
            return one if i == t else R[t, i]

        def s(t, i):
            return S.get((t, i), 0)

        def paged_in(t, i):
            return pulp.lpSum(In[z, t, i] for z in tiers) if t > 0 and i < t else 0

        def paged_out(t, i):
            return pulp.lpSum(Out[z, t, i] for z in tiers)

        def available(t, i):  # in RAM before stage t's computes reach node i
            return s(t, i) + paged_in(t, i) + (r(t, i) if i <= t else 0)

        for t in stages():
            for i in range(t):
                # a tensor enters RAM once per stage: resident, paged in, or computed
                prob += s(t, i) + paged_in(t, i) + R[t, i] <= 1
                if t > p.stepped.get(i, t):  # computed after its update: stepped weights
                    prob += R[t, i] == 0
            for k in range(t + 1):
                for i in p.deps[k]:
                    prob += r(t, k) <= available(t, i)
            if t + 1 < n:
                for i in range(t + 1):
                    prob += S[t + 1, i] <= available(t, i) - paged_out(t, i)
            for i in range(t + 1):
                prob += paged_out(t, i) <= available(t, i)
            for z in tiers:
                if t + 1 < n:
                    for i in range(t + 1):
                        prob += F[z, t + 1, i] <= F.get((z, t, i), 0) + Out[z, t, i]
                for i in range(t):
                    prob += In[z, t, i] <= F[z, t, i]
        # Free[t,i,k]: i leaves RAM after computing k; only if k is i's last computed user in the
        # stage and i is neither kept nor paged out. Upper bounds suffice: freeing only helps.
        free_terms: dict[tuple[int, int], list] = {}
        for t in stages():
            for k in range(t + 1):
                terms = []
                for i in (*p.deps[k], k):
                    fr = V(f"Free_{t}_{i}_{k}", 0, 1, cat=C)
                    prob += fr <= r(t, k)
                    if t + 1 < n:
                        prob += fr <= 1 - S[t + 1, i]
                    if tiers:
                        prob += fr <= 1 - paged_out(t, i)
                    for j in p.users[i]:
                        if k < j <= t:
                            prob += fr <= 1 - r(t, j)
                    terms.append(size[i] * fr)
                free_terms[t, k] = terms
        for t in stages():
            start = pulp.lpSum(size[i] * (s(t, i) + paged_in(t, i)) for i in range(t))
            prev = None
            for k in range(t + 1):
                u = V(f"U_{t}_{k}", 0, None, cat=C)
                base = start if prev is None else prev - pulp.lpSum(free_terms[t, k - 1])
                prob += u == base + size[k] * r(t, k)
                prob += u + ws[k] * r(t, k) <= cap
                prev = u
        # tier capacity: every tensor ever paged out stays there until the end of the step
        for z in tiers:
            capacity = p.costs.tiers[z].capacity_bytes
            if capacity is not None:
                held = {i: V(f"Held_{z}_{i}", 0, 1, cat=C) for i in range(n)}
                for (zz, t, i), var in Out.items():
                    if zz == z:
                        prob += held[i] >= var
                prob += pulp.lpSum(p.sizes[i] * held[i] for i in range(n)) <= capacity

        c = p.costs
        compute_time = pulp.lpSum(c.time_s[i] * var for (t, i), var in R.items()) + p.plain_time
        paging_time = (pulp.lpSum(c.tiers[z].in_time_s[i] * var for (z, t, i), var in In.items())
                       + pulp.lpSum(c.tiers[z].out_time_s[i] * var
                                    for (z, t, i), var in Out.items()))
        deadline = p.deadline_s()
        if deadline is not None:
            counted = compute_time + (paging_time if p.paging_time == "counted" else 0)
            scale_t = max(p.plain_time, 1e-30)
            prob += (1.0 / scale_t) * counted <= deadline / scale_t
        if p.objective == "time":
            total = compute_time + paging_time
            self.objective_scale = max(p.plain_time, 1e-30)
        else:
            total = (pulp.lpSum(c.energy_j[i] * var for (t, i), var in R.items()) + sum(c.energy_j)
                     + pulp.lpSum(c.tiers[z].in_energy_j[i] * var for (z, t, i), var in In.items())
                     + pulp.lpSum(c.tiers[z].out_energy_j[i] * var
                                  for (z, t, i), var in Out.items())
                     + c.static_w * (compute_time + paging_time))
            self.objective_scale = max(sum(c.energy_j) + c.static_w * p.plain_time, 1e-30)
        prob += (1.0 / self.objective_scale) * total
        self.prob, self.R, self.S, self.In, self.Out = prob, R, S, In, Out

    def set_start(self, decisions: list[StageDecision]) -> None:
        for key, var in (*self.R.items(), *self.S.items()):
            var.setInitialValue(0)
        for var in (*self.In.values(), *self.Out.values()):
            var.setInitialValue(0)
        for t, d in enumerate(decisions):
            for i in d.compute[:-1]:
                self.R[t, i].setInitialValue(1)
            for i in d.keep:
                if (t + 1, i) in self.S:
                    self.S[t + 1, i].setInitialValue(1)
            for i, z in d.page_in:
                self.In[z, t, i].setInitialValue(1)
            for i, z in d.page_out:
                self.Out[z, t, i].setInitialValue(1)

    def decisions(self) -> list[StageDecision]:
        p, on = self.p, (lambda var: var.value() is not None and var.value() > 0.5)
        out = []
        for t in range(p.n):
            compute = [i for i in range(t) if on(self.R[t, i])] + [t]
            keep = {i for i in range(t + 1) if t + 1 < p.n and on(self.S[t + 1, i])}
            page_in = [(i, z) for z in p.tiers for i in range(t) if t > 0 and on(self.In[z, t, i])]
            page_out = [(i, z) for z in p.tiers for i in range(t + 1) if on(self.Out[z, t, i])]
            out.append(StageDecision(compute, keep, page_in, page_out))
        return out


def _read(log: Path) -> str:
    try:
        return log.read_text(errors="replace")
    except OSError:
        return ""


def _cbc_bound(log: Path) -> float | None:
    """CBC's final best bound, from its log (PuLP does not return it)."""
    text = _read(log)
    found = re.findall(r"Lower bound:\s*([-+0-9.eE]+)", text)
    if found:
        return float(found[-1])
    found = re.findall(r"best possible\s*([-+0-9.eE]+)", text)
    return float(found[-1]) if found else None


def _cbc_stopped(log: Path) -> bool:
    return bool(re.search(r"Stopped on (time|iterations|nodes)", _read(log)))


def _cbc_preprocessing_cut_short(log: Path, time_limit: float) -> bool:
    """Whether CBC's "infeasible" is its preprocessing stopped by the time limit, not a proof:
    cut off in its cut generators, CBC says "Pre-processing says infeasible" (my_model at 50%,
    -sec 1.87, with a plan that fits as its warm start)."""
    text = _read(log)
    if "Pre-processing says infeasible" not in text:
        return False
    wall = re.findall(r"Wallclock seconds\):\s*([0-9.]+)", text)
    return bool(wall) and float(wall[-1]) >= time_limit


def _highs_bound(prob) -> float | None:
    model = getattr(prob, "solverModel", None)
    if model is None:
        return None
    bound = model.getInfo().mip_dual_bound
    return None if bound is None or abs(bound) == float("inf") else float(bound)


def _highs_stopped(prob) -> bool:
    model = getattr(prob, "solverModel", None)
    if model is None:
        return False
    return "time limit" in model.modelStatusToString(model.getModelStatus()).lower()
