"""An exact recreate for the LNS: CP-SAT re-chooses the recomputations of a window of stages,
everything outside the window fixed, on the event model of events.py.

In the event model a tensor x is in RAM at an event q iff q computes x, or some use of x at or
after q comes before x's next compute: residency at q depends only on the events from q on.
So the recomputations placed in stages a .. b-1 change RAM at the events of the window and
BEFORE it (an input kept for a use in the window stays from its last compute before; a tensor
recomputed in the window may leave RAM at its last use before), never after it. The model:

  r[v,t]      v is recomputed in window stage t (candidates: the stage's current
              recomputations, and its node's inputs and their inputs, DEPTH levels)
  live/R/S    per tensor, backwards over its window events: live_j = use_j or (live_{j+1} and
              not compute_{j+1}); resident at its event j (R_j = live_j or compute_j) and
              between events j and j+1 (S_j); past the window, whether it is needed there
              (fixed); B_x = the copy made before the window is still needed in it
  RAM         a cumulative over the window's events (fixed workspace and stays as fixed
              intervals); before the window, B_x adds x's size to the events from its last use
              (or compute) there up to the window: one linear row per group of such events
  minimise    the recompute cost of the r[v,t]

Every auxiliary literal is only bounded below by what it stands for (so the model may only
over-count RAM): any solution's compute sets fit the budget in the event model as well. The
current schedule's choices are the hint, so the model is feasible from the start.
"""

from __future__ import annotations

import bisect
import time as clock
from dataclasses import dataclass

import numpy as np

from ..errors import import_extension
from .events import EventSchedule, recompute_cost
from .scaling import cost_scale, memory_scale

# Candidates at a window stage: its node's inputs, their inputs, ... DEPTH levels deep (the
# greedy's cascades rarely go deeper), at most PER_STAGE of them (nearest levels first).
DEPTH, PER_STAGE = 2, 24


@dataclass
class WindowResult:
    computes: list[list[int]] | None  # the new compute sets, None if nothing cheaper was found
    cost_before: float
    cost_after: float
    status: str
    candidates: int
    solve_s: float
    deterministic_s: float = 0.0  # CP-SAT's deterministic time


def recomputed_in(sched: EventSchedule, a: int, b: int) -> dict[int, list[int]]:
    """Stage -> the nodes recomputed in it, for stages a .. b-1."""
    out: dict[int, list[int]] = {}
    for v, stages in enumerate(sched.computes):
        for t in stages:
            if t != v and a <= t < b:
                out.setdefault(t, []).append(v)
    return out


def candidates_at(sched: EventSchedule, t: int, now: list[int]) -> list[int]:
    """The nodes the model may recompute in stage t: those recomputed there `now`, then t's
    inputs and theirs (DEPTH levels, at most PER_STAGE in all). A parameter reader is no
    candidate after its update, which steps the weights it reads (CP-SAT's and the MILP's
    rule): lowering would have to undo such a recomputation."""
    p = sched.p
    chosen, seen = list(now), set(now) | {t}
    level = [t, *now]
    for _ in range(DEPTH):
        following = []
        for w in level:
            for x in p.deps[w]:
                if x not in seen:
                    seen.add(x)
                    if t <= p.stepped.get(x, t):
                        following.append(x)
        room = PER_STAGE - len(chosen)
        if room <= 0:
            break
        chosen += following[:room]
        level = following
    return sorted(chosen)


def _fixed(value) -> bool:
    return isinstance(value, int)


def _is(lit, constant: int) -> bool:
    return _fixed(lit[0]) and lit[0] == constant


class _Lits:
    """Literals that are constants (0/1) or CP-SAT Booleans, each with its hinted value."""

    def __init__(self, model):
        self.m = model
        self.hints: list[tuple] = []

    def new(self, hint: int):
        var = self.m.NewBoolVar("")
        self.hints.append((var, hint))
        return var, hint

    def either(self, a, b):
        """At least (a or b)."""
        (x, hx), (y, hy) = a, b
        if (_fixed(x) and x == 1) or (_fixed(y) and y == 1):
            return 1, 1
        if _fixed(x) and x == 0:
            return b
        if _fixed(y) and y == 0:
            return a
        z = self.new(hx | hy)
        self.m.AddImplication(x, z[0])
        self.m.AddImplication(y, z[0])
        return z

    def but_not(self, a, c):
        """At least (a and not c)."""
        (x, hx), (y, hy) = a, c
        if (_fixed(x) and x == 0) or (_fixed(y) and y == 1):
            return 0, 0
        if _fixed(y) and y == 0:
            return a
        z = self.new(hx & (1 - hy))
        self.m.AddBoolOr(([] if _fixed(x) else [x.Not()]) + [y, z[0]])
        return z


def solve_window(sched: EventSchedule, capacity: int, first: int, stages: int,
                 time_limit: float = 1.0, deterministic_time: float | None = None,
                 seed: int = 0) -> WindowResult:
    """The cheapest recomputations of stages first .. first+stages-1 that CP-SAT finds (1
    worker) with the rest of `sched` (within `capacity`) fixed; computes None unless cheaper."""
    # never beside highspy: see isolated.py
    cp_model = import_extension("ortools.sat.python.cp_model")

    from .cpsat import solve_interruptibly

    started = clock.perf_counter()
    p, width = sched.p, sched.width
    a, b = first, min(p.n, first + stages)
    K_a, K_b = a * width, b * width
    m = cp_model.CpModel()
    lits = _Lits(m)

    # the window's events: each stage's own node (fixed) and candidate recomputations
    recomputes = {}  # (v, t) -> literal
    points = []  # (key, node, literal)
    now = recomputed_in(sched, a, b)
    for t in range(a, b):
        points.append((sched.key(t, t), t, (1, 1)))
        for v in candidates_at(sched, t, now.get(t, [])):
            lit = lits.new(int(t in sched.computes[v]))
            recomputes[v, t] = lit
            points.append((sched.key(t, v), v, lit))
    points.sort(key=lambda point: point[0])
    count = len(points)
    current = [(v, t) for (v, t), lit in recomputes.items() if lit[1]]

    # per tensor, its events in the window: (point, compute literal, use literal)
    events: dict[int, list[tuple[int, tuple, tuple]]] = {}
    for i, (_, k, lit) in enumerate(points):
        events.setdefault(k, []).append((i, lit, (0, 0)))
        for x in p.deps[k]:
            events.setdefault(x, []).append((i, (0, 0), lit))

    intervals, demands, pre_copies = [], [], []
    mem = memory_scale([*p.sizes, *p.workspace], capacity)
    fixed = np.zeros(count + 1, dtype=np.int64)  # RAM at each point that no choice changes

    def stay(lo: int, hi: int, size: int, lit) -> None:
        """x of `size` in RAM at points lo .. hi-1 if lit."""
        if hi <= lo or size == 0 or _is(lit, 0):
            return
        if _is(lit, 1):
            fixed[lo] += size
            fixed[hi] -= size
            return
        intervals.append(m.NewOptionalFixedSizeIntervalVar(lo, hi - lo, lit[0], ""))
        demands.append(mem.up(size))

    for i, (_, k, lit) in enumerate(points):
        stay(i, i + 1, p.workspace[k], lit)

    for x in range(min(a, p.n)):  # tensors made before the window, with no event in it
        if x not in events and _needed_after(sched, x, K_b):
            stay(0, count, p.sizes[x], (1, 1))
    for x, own in events.items():
        needed = int(_needed_after(sched, x, K_b))
        live, computed, upper = (needed, needed), (0, 0), count
        for i, compute, use in reversed(own):
            between = lits.but_not(live, computed)  # the copy before `upper` still needed
            stay(i + 1, upper, p.sizes[x], between)
            live = lits.either(use, between)
            stay(i, i + 1, p.sizes[x], lits.either(live, compute))
            computed, upper = compute, i
        if x < a:
            before = lits.but_not(live, computed)
            stay(0, upper, p.sizes[x], before)
            if not _is(before, 0):
                pre_copies.append((x, before))

    cumulative_capacity = mem.down(capacity)
    at_points = np.cumsum(fixed)[:count]
    for i in range(count):  # the RAM no choice changes, as a fixed interval per point
        if at_points[i]:
            intervals.append(m.NewFixedSizeIntervalVar(i, 1, ""))
            demands.append(mem.up(int(at_points[i])))
    m.AddCumulative(intervals, demands, cumulative_capacity)
    _before_window(m, sched, capacity, K_a, pre_copies, mem)

    cost_before = recompute_cost(sched)
    scale = cost_scale([sched.cost[v] for v, _ in recomputes], max(cost_before, 1.0))
    m.Minimize(sum(scale.down(sched.cost[v]) * lit[0] for (v, _), lit in recomputes.items()))
    for var, hint in lits.hints:
        m.AddHint(var, hint)

    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = seed
    # probing takes over a second on a 20-stage window's few thousand Booleans at 500 nodes,
    # before the search even starts from the hint; without it the search gets the time
    solver.parameters.cp_model_probing_level = 0
    # the model's build counts: on 1000 nodes near the LNS's deadline it ran 0.7 s past it
    solver.parameters.max_time_in_seconds = max(0.01, time_limit - (clock.perf_counter() -
                                                                     started))
    if deterministic_time is not None:
        solver.parameters.max_deterministic_time = deterministic_time
    # Ctrl-C is the caller's (solve_interruptibly): Solve alone swallowed it during a solve and
    # left the C default handler after it (the next Ctrl-C killed `plan` without a word)
    code = solve_interruptibly(solver, m, None)
    status = {cp_model.OPTIMAL: "optimal", cp_model.FEASIBLE: "feasible",
              cp_model.INFEASIBLE: "infeasible"}.get(code, "unknown")
    result = WindowResult(None, cost_before, cost_before, status, len(recomputes),
                          clock.perf_counter() - started, solver.ResponseProto().deterministic_time)
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return result
    chosen = [(v, t) for (v, t), lit in recomputes.items() if solver.Value(lit[0])]
    computes = [[t for t in st if t == v or not a <= t < b] for v, st in enumerate(sched.computes)]
    for v, t in chosen:
        bisect.insort(computes[v], t)
    after = cost_before - sum(sched.cost[v] for v, _ in current) \
        + sum(sched.cost[v] for v, _ in chosen)
    if after < cost_before * (1 - 1e-12):
        result.computes, result.cost_after = computes, after
    return result


def _needed_after(sched: EventSchedule, x: int, key: int) -> bool:
    """Whether x's copy in RAM at `key` (a stage boundary) is read before x is next computed:
    fixed by the events from `key` on."""
    uses = sched.use_keys(x)
    use = bisect.bisect_left(uses, key)
    if use == len(uses):
        return False
    width = sched.width
    later = [t * width + 1 + x for t in sched.computes[x] if t * width + 1 + x >= key]
    return not later or uses[use] < min(later)


def _before_window(m, sched: EventSchedule, capacity: int, K_a: int, pre_copies, mem) -> None:
    """RAM at the events before the window: x's copy made there, if still needed in the window
    (B_x), stays from its last use (or compute) before the window up to it."""
    if not pre_copies:
        return
    p = sched.p
    spans = []  # (first event key x's copy adds to, x, literal, whether it does now)
    for x, lit in pre_copies:
        made = max(key for key in (t * sched.width + 1 + x for t in sched.computes[x])
                   if key < K_a)
        uses = sched.use_keys(x)
        last_use = uses[bisect.bisect_left(uses, K_a) - 1] if uses and uses[0] < K_a else -1
        now = any(start < K_a <= end for start, end in sched.runs[x])
        spans.append((max(made, last_use) + 1, x, lit, now))
    keys, at = sched.keys, sched.at
    lo = int(np.searchsorted(keys, min(s for s, _, _, _ in spans)))
    hi = int(np.searchsorted(keys, K_a))
    if hi <= lo:
        return
    base = at[lo:hi].copy()
    for start, x, _, now in spans:
        if now:
            base[int(np.searchsorted(keys[lo:hi], start)):] -= p.sizes[x]
    spans.sort(key=lambda s: s[0])
    starts = [s for s, _, _, _ in spans]
    for g, (start, _, _, _) in enumerate(spans):
        end = starts[g + 1] if g + 1 < len(spans) else K_a
        i = int(np.searchsorted(keys[lo:hi], start))
        j = int(np.searchsorted(keys[lo:hi], end))
        if j <= i:
            continue
        slack = capacity - int(base[i:j].max())
        m.Add(sum(mem.up(p.sizes[x]) * lit[0] for _, x, lit, _ in spans[:g + 1]
                  if not _is(lit, 1))
              <= mem.down(slack) - sum(mem.up(p.sizes[x]) for _, x, lit, _ in spans[:g + 1]
                                       if _is(lit, 1)))
