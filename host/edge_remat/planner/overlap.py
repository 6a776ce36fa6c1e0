"""The overlap post-pass: where to issue each page-in and page-out so that paging hides behind
compute, scored on the simulator's IO timeline (edge_remat_agent/timeline.py).

The solvers keep their stop-the-world model of paging (an upper bound on the overlapped cost)
and decide what to page; this pass decides when. Every solver's schedule goes through it (in
evaluate), so plans are compared, and reported, by their overlapped step time.

  1. each page_out moves up to just after the last instruction that needs its tensor: its RAM
     goes (once written) and its write starts as early as it can;
  2. each page_in, in plan order, is hoisted to the candidate issue point with the shortest
     makespan among those where RAM, with the page held from there on, stays within the
     budget (candidates: just before each of the 16 computes before its first use, then the
     32nd, 64th, ..., and the earliest point memory allows; ties go to the latest, which holds
     the page least); in the same scan, each compute of a param node whose group lives on a
     page tier is tried as a page_in from "home" (formats/plan.py: the same read, on the IO
     timeline), issued in its place or at those candidates, and kept where that shortens the
     step;
  3. on the plan solve() returns (delay_page_outs): each page_out issued later where that
     shortens the step, then the page-ins hoisted again.

A trial (a page-in moved up, a page-out down) runs on from the base's timeline state where it
parts from the base and stops once its state is the base's shifted in time (`_Trials`), instead
of running the whole step each time (`_WholeRuns`, the reference it is tested against, with the
same plans): the pass then grows with page-ins x the stretch each is moved over, not x the
step. On a random layered graph of 2000 nodes at 35% with flash (963 page-ins) it takes 0.96 s
where whole runs of the same trials take 49.5 s; on operator-level GPT-2 small at 25% with
rpi4's flash (258 page-ins, its param nodes tried as reads from home) 1.19 s against 9.84 s
(`python benchmarks/overlap_pass.py --sizes 2000 --repeats 1`, 2026-12-05). Within
`hoisting_until(t)` (solve() sets its time limit, and run_baselines each baseline's share) the
page-ins not reached by t stay where the plan put them, as in the stop-the-world model.
"""

from __future__ import annotations

import time as clock
from contextlib import contextmanager
from contextvars import ContextVar

from edge_remat_agent.formats import HOME, Instruction, Stages
from edge_remat_agent.timeline import (COMPUTE, FREE, OP_CODES, PAGE_IN, PAGE_OUT,
                                      first_writes)

from .problem import Problem

Op = tuple[int, int, "str | None"]

# A page-in may be issued before each of this many computes before its first use, then before
# the 32nd, 64th, ... (ResNet-50 operator-level, 25% with rpi4's flash: a step of 44.82 s with
# powers of two alone, 43.29 s with 16, 43.28 s with 32; the pass 0.46, 0.57, 0.69 s).
NEAR_ISSUE_POINTS = 16

_hoisting_deadline: ContextVar["float | None"] = ContextVar("hoisting_deadline", default=None)


@contextmanager
def hoisting_until(deadline: "float | None"):
    """Within it, schedule_io hoists no page-in after `deadline` (a time.perf_counter() time;
    None: no deadline of its own), nor after the deadline of an enclosing hoisting_until."""
    outer = _hoisting_deadline.get()
    token = _hoisting_deadline.set(min((d for d in (outer, deadline) if d is not None),
                                       default=None))
    try:
        yield
    finally:
        _hoisting_deadline.reset(token)


def schedule_io(p: Problem, stages: Stages, *, whole_runs: bool = False) -> Stages:
    """The same instructions, page-ins and page-outs placed for overlap (never a higher peak
    than the budget, never a longer makespan than the schedule given). `whole_runs`: score
    each trial on the whole step's timeline (the reference the shortcut is checked against)."""
    flat = [(s, ins) for s, stage in enumerate(stages) for ins in stage]
    reads = p.hidden_home_reads()
    ops = _resolved(p, flat)
    if not any(op[0] in (PAGE_IN, PAGE_OUT) or op[0] == COMPUTE and reads[op[1]] for op in ops):
        return stages
    best = _makespan(p, ops)
    moved_flat, moved_ops = _issue_page_outs_early(flat, ops, p.deps)
    score = _makespan(p, moved_ops)
    if score <= best:
        flat, ops, best = moved_flat, moved_ops, score
    trials = (_WholeRuns if whole_runs else _Trials)(p, ops, best)
    return _staged(_scan(p, flat, trials, _placing(reads)), len(stages))


def _placing(reads: list[bool]):
    """Step 2's choice: op -> what places it (a page-in, or the compute of a node `reads`
    marks, read from home), or None."""

    def place(op: Op):
        if op[0] == PAGE_IN:
            return _hoist_page_in
        return _read_ahead if op[0] == COMPUTE and reads[op[1]] else None
    return place


def delay_page_outs(p: Problem, stages: Stages, *, whole_runs: bool = False) -> Stages:
    """A schedule placed by schedule_io with its page-outs issued later where that shortens the
    step (a write ahead of reads on the one IO timeline holds them back), then its page-ins
    hoisted again into what that frees. Its trials converge slowly (the IO queue's order
    changes until it drains): several times schedule_io's time, so solve() runs it on the
    chosen plan only. ResNet-50 and GPT-2 small operator-level at 25% with rpi4's flash: steps
    1.6% and 1.3% shorter (benchmarks/overlap_pass.py)."""
    flat = [(s, ins) for s, stage in enumerate(stages) for ins in stage]
    deadline = _hoisting_deadline.get()
    if not any(ins.op == "page_out" for _, ins in flat) or \
            deadline is not None and clock.perf_counter() > deadline:
        return stages  # past the deadline, even the base's timeline (0.2 s on 2000 nodes)
    ops = _resolved(p, flat)
    trials = (_WholeRuns if whole_runs else _Trials)(p, ops, _makespan(p, ops))
    flat = _scan(p, flat, trials, lambda op: _delay_page_out if op[0] == PAGE_OUT else None)
    flat = _scan(p, flat, trials, _placing(p.hidden_home_reads()))
    # nothing moved: the schedule given, which the caller then need not replay again
    return stages if trials.ops is ops else _staged(flat, len(stages))


def _resolved(p: Problem, flat) -> list[Op]:
    index = p.graph.index
    return [(OP_CODES[ins.op], index[ins.node], ins.tier) for _, ins in flat]


def _staged(flat, count: int) -> Stages:
    out: Stages = [[] for _ in range(count)]
    for s, ins in flat:
        out[s].append(ins)
    return out


def _scan(p: Problem, flat, trials: "_WholeRuns", placing):
    """Each instruction that `placing` (op -> function or None) gives a function, in order,
    placed by it (trials' base follows), until the deadline of hoisting_until."""
    deadline, ops, k = _hoisting_deadline.get(), trials.ops, 0
    while k < len(ops):
        place = placing(ops[k])
        if place is not None:
            if deadline is not None and clock.perf_counter() > deadline:
                break
            flat, ops, k = place(p, flat, ops, k, trials)
        k += 1
    return flat


def sync_trace(p: Problem, ops: list[Op]) -> list[int]:
    """RAM at each instruction in the synchronous model (simulate.py's memory_trace)."""
    return _sync_levels(p, ops)[0]


def _sync_levels(p: Problem, ops: list[Op]) -> tuple[list[int], list[int]]:
    """sync_trace, and the RAM held before each instruction and after the last (fixed memory
    left out)."""
    ram, trace, before = 0, [], []
    for op, i, _ in ops:
        before.append(ram)
        now = ram
        if op == COMPUTE:
            now = ram + p.sizes[i] + p.workspace[i]
            ram += p.sizes[i]
        elif op == PAGE_IN:
            ram += p.sizes[i]
            now = ram
        else:
            ram -= p.sizes[i]
        trace.append(now + p.fixed)
    return trace, before + [ram]


def _makespan(p: Problem, ops: list[Op]) -> float:
    return p.costs.timeline(ops, p.deps, p.sizes, sync_trace(p, ops)).step_time_s


def _moved(items: list, c: int, j: int, item=None) -> list:
    """`items` with item j moved to position c (up or down), as `item` where given."""
    return items[:min(c, j)] + _moved_between(items, c, j, item) + items[max(c, j) + 1:]


def _moved_between(items: list, c: int, j: int, item=None) -> list:
    """_moved's items from position min(c, j) to max(c, j): elsewhere they stay."""
    moved = items[j] if item is None else item
    return [moved] + items[c:j] if c < j else items[j + 1:c + 1] + [moved]


class _WholeRuns:
    """The makespans of a base order's trials (a page-in moved up, or a page-out down), each
    trial run as a whole step."""

    def __init__(self, p: Problem, ops: list[Op], makespan: float) -> None:
        self.p = p
        self._set_base(ops, makespan)

    def _set_base(self, ops: list[Op], makespan: float) -> None:
        self.ops, self.makespan = ops, makespan
        self.trace, self.before = _sync_levels(self.p, ops)

    def score(self, c: int, j: int, op: "Op | None" = None) -> float:
        """The makespan with the page-in at j issued just before instruction c < j, or the
        page-out at j just after instruction c > j; `op`: a page-in from home that replaces
        the param node's compute at j, issued just before instruction c <= j."""
        return _makespan(self.p, _moved(self.ops, c, j, op))

    def accept(self, c: int, j: int, makespan: float, op: "Op | None" = None) -> list[Op]:
        """Trial (c, j) (with `op`), which scored `makespan`, is the base now: its
        instructions."""
        first, last = min(c, j), max(c, j)
        size = self.p.sizes[self.ops[j][1]]
        before = self.before  # a page-in issued earlier holds its bytes from c on, a
        # page-out issued later until it
        held = (before[c:c + 1] + [b + size for b in before[c:j]] if c <= j else
                [b + size for b in before[j + 1:c + 2]])
        self.trace = self.trace[:first] + self._trace_between(c, j) + self.trace[last + 1:]
        self.before = before[:first] + held + before[last + 1:]
        self.ops, self.makespan = _moved(self.ops, c, j, op), makespan
        return self.ops

    def _trace_between(self, c: int, j: int) -> list[int]:
        """Trial (c, j)'s sync_trace from min(c, j) to max(c, j): elsewhere it is the base's
        (a compute at j read from home instead: its workspace goes)."""
        size, fixed = self.p.sizes[self.ops[j][1]], self.p.fixed
        trace, before = self.trace, self.before
        if c <= j:  # a page-in issued earlier: its bytes held from c on
            return [before[c] + size + fixed] + [t + size for t in trace[c:j]]
        # a page-out issued later: its bytes held until it
        return [t + size for t in trace[j + 1:c + 1]] + [before[c + 1] + size + fixed]


class _Trials(_WholeRuns):
    """The same makespans, without running the whole step for each trial. A trial runs on from
    the base's timeline state where it parts from the base (same instructions, same RAM
    before it), and stops where its state is the base's shifted in time
    (TimelineRun.lag_behind): the rest of the step then runs as the base's, that much later.
    The base's states are kept for each instruction, computed as trials need them.

    A trial that raises the synchronous peak raises the timeline's limit for writes in flight
    with it, which changes the whole step wherever the base waited at its limit: such a trial
    runs whole if the base waited before it parts, and to the end if the base waits after."""

    def __init__(self, p: Problem, ops: list[Op], makespan: float) -> None:
        super().__init__(p, ops, makespan)
        self._waits_from(0)

    def _set_base(self, ops: list[Op], makespan: float) -> None:
        super()._set_base(ops, makespan)
        self.writes = first_writes(ops)
        self.limit = max(self.trace, default=0)
        self.states = [self.p.costs.timeline_run(self.p.deps, self.p.sizes, self.limit)]
        self.waits: int | None = None  # how often the base waits at its limit, once known
        # (c, j, op) -> the same for that trial, which its base's is as soon as it is accepted
        self.trial_waits: dict[tuple[int, int, Op | None], int] = {}

    def accept(self, c: int, j: int, makespan: float, op: "Op | None" = None) -> list[Op]:
        waits, limit = self.trial_waits.get((c, j, op)), self.limit
        ops = super().accept(c, j, makespan, op)
        self.writes = _moved(self.writes, c, j)
        self.limit = max(self.trace, default=0)
        if self.limit == limit:  # states[k]: before instruction k, the same before both
            del self.states[min(c, j) + 1:]
        else:
            self.states = self.states[:1]
            self.states[0].limit = self.limit
        self.waits, self.trial_waits = waits, {}
        self._waits_from(0)  # one run of the rest of the step where not known
        return ops

    def _state_before(self, k: int):
        states = self.states
        if len(states) <= k:
            run = states[-1].copy()
            for q in range(len(states) - 1, k):
                run.run(self.ops, self.trace, self.writes, q, q + 1)
                states.append(run.copy())
        return states[k]

    def _waits_from(self, k: int) -> int:
        """How often the base waits at its limit from instruction k on."""
        if self.waits is None:  # the rest of the step in one run, its states not kept
            run = self.states[-1].copy()
            run.run(self.ops, self.trace, self.writes, len(self.states) - 1)
            self.waits = run.limit_waits
        return self.waits - self._state_before(k).limit_waits

    def score(self, c: int, j: int, op: "Op | None" = None) -> float:
        ops = self.ops  # the base's: after max(c, j) the trial's are the same
        part_trace = self._trace_between(c, j)
        first, last = min(c, j), max(c, j)
        limit = max(self.limit, *part_trace)
        # a compute read from home leaves its workspace out: at the base's peak, the limit
        # may fall, which the base's states do not know
        lowered = op is not None and self.p.workspace[op[1]] and self.trace[j] == self.limit
        if lowered or limit > self.limit and self._state_before(first).limit_waits:
            return super().score(c, j, op)
        run = self._state_before(first).copy()
        run.limit = limit
        run.run(_moved_between(ops, c, j, op), part_trace, _moved_between(self.writes, c, j))
        q, stride = last + 1, 1
        while q < len(ops):
            base = self._state_before(q)
            lag = run.lag_behind(base)
            if lag is not None and (limit == self.limit or not self._waits_from(q)):
                self.trial_waits[c, j, op] = run.limit_waits + self._waits_from(q)
                return self.makespan + lag
            stop = min(len(ops), q + stride)
            run.run(ops, self.trace, self.writes, q, stop)
            q, stride = stop, stride * 2
        self.trial_waits[c, j, op] = run.limit_waits
        return run.finish().step_time_s


def _needs(op: Op, node: int, deps: list[list[int]]) -> bool:
    code, i, _ = op
    return i == node or (code == COMPUTE and node in deps[i])


def _issue_page_outs_early(flat, ops, deps):
    flat, ops = list(flat), list(ops)
    for j in range(len(ops)):
        if ops[j][0] != PAGE_OUT:
            continue
        node = ops[j][1]
        q = j - 1
        while q >= 0 and not _needs(ops[q], node, deps):
            q -= 1
        if q + 1 < j:
            entry, op = flat.pop(j), ops.pop(j)
            flat.insert(q + 1, (flat[q][0] if q >= 0 else entry[0], entry[1]))
            ops.insert(q + 1, op)
    return flat, ops


def _hoist_page_in(p: Problem, flat, ops, j: int, trials: _WholeRuns):
    candidates = _issue_candidates(p, ops, j, trials)[1:]  # not j itself: where it is
    if candidates:  # moving it up shifts c..j-1 down by one: position j + 1 is unchanged,
        # where the scan goes on
        flat, ops, _ = _move_to_best(flat, j, trials, candidates)
    return flat, ops, j


def _issue_candidates(p: Problem, ops, j: int, trials: _WholeRuns) -> list[int]:
    """Where the read of node ops[j][1] may be issued, latest first (ties keep the shorter
    hold): j, before each of the 16 computes before it, the 32nd, 64th, ..., and the earliest
    point that neither passes what last needed the tensor or removed it from RAM, nor takes
    RAM, with the tensor held, over the budget."""
    node, size = ops[j][1], p.sizes[ops[j][1]]
    trace = trials.trace
    earliest = j
    while earliest > 0:
        op = ops[earliest - 1]
        if _needs(op, node, p.deps) or (op[1] == node and op[0] in (FREE, PAGE_OUT)):
            break
        if trace[earliest - 1] + size > p.budget_bytes:
            break
        earliest -= 1
    computes = [c for c in range(j - 1, earliest - 1, -1) if ops[c][0] == COMPUTE]
    picks = {earliest} | _issue_points(computes, NEAR_ISSUE_POINTS)
    return [j] + sorted(picks - {j}, reverse=True)


def _read_ahead(p: Problem, flat, ops, j: int, trials: _WholeRuns):
    """The param node computed at j read from its home instead, where (and if) that shortens
    the step: issued in its place or hoisted as a page-in is (the same candidates). A read
    shares the one IO timeline with paging, so where pages queue a compute can be shorter
    (Belady's plan on GPT-2 small at 25% with rpi4's flash: 124.8 s with its param nodes
    computed, 137.8 s with every one read ahead)."""
    flat, ops, _ = _move_to_best(flat, j, trials, _issue_candidates(p, ops, j, trials),
                                 (PAGE_IN, ops[j][1], HOME))
    return flat, ops, j


def _delay_page_out(p: Problem, flat, ops, j: int, trials: _WholeRuns):
    """The page-out at j issued later where that shortens the step: a write that shares the
    IO timeline with the reads after it can hold them back (candidates: just after the 1st,
    2nd, 4th, 8th, ... compute after it, and the latest point memory allows, before anything
    touches the tensor again; ties go to the earliest, which holds its RAM least; 16 nearest
    computes gave ResNet-50 and GPT-2 the same steps in 1.6x the time)."""
    node, size = ops[j][1], p.sizes[ops[j][1]]
    trace = trials.trace
    latest = j
    while latest + 1 < len(ops):
        op = ops[latest + 1]
        if op[1] == node or _needs(op, node, p.deps) or trace[latest + 1] + size > p.budget_bytes:
            break
        latest += 1
    computes = [c for c in range(j + 1, latest + 1) if ops[c][0] == COMPUTE]
    picks = ({latest} | _issue_points(computes, 1)) - {j}
    flat, ops, moved = _move_to_best(flat, j, trials, sorted(picks))
    return flat, ops, j - 1 if moved else j  # moved: the scan goes on at j, the next one


def _issue_points(computes: list[int], near: int) -> set[int]:
    """The first `near` of `computes`, then the 2 near-th, 4 near-th, ..."""
    picks = set(computes[:near])
    step = near * 2
    while step <= len(computes):
        picks.add(computes[step - 1])
        step *= 2
    return picks


def _move_to_best(flat, j: int, trials: _WholeRuns, candidates: list[int],
                  op: "Op | None" = None):
    """The instruction at j (as `op`, where given: a param node's compute read from home)
    moved to the candidate position with the shortest step, if that is shorter than the
    base's (ties: the first candidate); (flat, ops, whether it moved). It goes into the stage
    of the instruction it lands beside."""
    best, chosen = trials.makespan, None
    for c in candidates:
        score = trials.score(c, j, op)
        if score < best * (1 - 1e-12):
            chosen, best = c, score
    if chosen is None:
        return flat, trials.ops, False
    ops = trials.accept(chosen, j, best, op)
    ins = flat[j][1] if op is None else Instruction("page_in", flat[j][1].node, HOME)
    return _moved(flat[:j] + [(flat[chosen][0], ins)] + flat[j + 1:], chosen, j), ops, True
