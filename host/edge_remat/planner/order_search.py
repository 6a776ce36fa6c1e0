"""Local search on an execution order, after the greedy (planner/ordering.py).

The greedy picks, among the ready nodes, the one that adds the fewest bytes now; it cannot
see that a node run a little later (or earlier) would leave less RAM at an event further on.
The search moves one node at a time within its window (after its last input, before its first
user) to the other side of an event that is over the budget, and keeps the move when the RAM
above the budget, summed over the compute events (what the planner must take out by
recomputation), does not grow; a few worse moves are taken too, fewer as the search cools
(simulated annealing), and the best order seen is returned.

A move changes the keep-all sweep only between the node's old and new place, so it is scored
on that span alone (numpy), not by a new sweep: the events in between shift by one and gain
the node's output (moved earlier) or lose it (moved later), and an input whose last user the
node is, or becomes, is freed sooner or later.
"""

from __future__ import annotations

import math
import random
import time

import numpy as np

PROPOSALS_PER_EVENT_TRIES = 64  # proposals between refreshes of the over-budget events
NEIGHBOURHOOD = 60  # a moved node is drawn within this many positions of an over-budget event
TEMPERATURE = 1.0  # the starting temperature, in mean output sizes (bytes of summed excess)


class OrderSweep:
    """The keep-all sweep of one order (each tensor freed after its last user, an output nothing
    reads freed at once), kept up to date under single-node moves. `ram[t]`: RAM at the t-th
    compute event (live tensors, the output and its workspace), as ordering._sweep counts it."""

    def __init__(self, order: list[int], deps: list[list[int]], users: list[list[int]],
                 size: list[int], workspace: list[int]):
        self.deps, self.users, self.size = deps, users, size
        n = len(order)
        self.order = np.array(order, dtype=np.int64)
        self.pos = np.empty(n, dtype=np.int64)
        self.pos[self.order] = np.arange(n)
        self.kept = np.array([size[v] if users[v] else 0 for v in range(n)], dtype=np.int64)
        self.own = np.array([size[v] + workspace[v] for v in range(n)], dtype=np.int64)
        self.live = np.zeros(n, dtype=np.int64)  # RAM held before each event
        users_left = [len(u) for u in users]
        live = 0
        for t, v in enumerate(order):
            self.live[t] = live
            live += int(self.kept[v])
            for d in deps[v]:
                users_left[d] -= 1
                if not users_left[d]:
                    live -= size[d]
        self.ram = self.live + self.own[self.order]
        pos = self.pos
        self.last_user = [max(us, key=lambda u: pos[u]) if us else -1 for us in users]

    def window(self, v: int) -> tuple[int, int]:
        """The positions v may take: after its inputs, before its users."""
        pos = self.pos
        lo = max((int(pos[d]) for d in self.deps[v]), default=-1) + 1
        hi = min((int(pos[u]) for u in self.users[v]), default=len(pos)) - 1
        return lo, hi

    def trial(self, v: int, j: int) -> tuple[int, int, np.ndarray, np.ndarray]:
        """Moving v to position j (within its window): the span (a, b) it changes, the order
        and the RAM held before each event there."""
        pos, size = self.pos, self.size
        i = int(pos[v])
        if j < i:  # earlier: the events at i-1 ... j shift one later and hold v's output
            shift = np.full(i - j, self.kept[v], dtype=np.int64)
            for d in self.deps[v]:
                if self.last_user[d] != v:
                    continue
                # d is now freed after its last other user, or after v where that comes first
                other = max((int(pos[u]) for u in self.users[d] if u != v), default=-1)
                start = other + 1 if other >= j else j
                if start < i:
                    shift[start - j:] -= size[d]
            order = np.concatenate(([v], self.order[j:i]))
            live = np.concatenate(([self.live[j]], self.live[j:i] + shift))
            return j, i, order, live
        # later: the events at i+1 ... j shift one earlier and no longer hold v's output
        shift = np.full(j - i, -self.kept[v], dtype=np.int64)
        held = 0  # inputs freed by j in the old order, held until v's new place
        for d in self.deps[v]:
            last = int(pos[self.last_user[d]])
            if last == i:
                shift += size[d]
            elif last <= j:
                shift[last - i:] += size[d]
            else:
                continue
            held += size[d]
        w = int(self.order[j])  # RAM after old event j: v's new place starts from there
        after = int(self.live[j]) + int(self.kept[w]) - sum(
            size[d] for d in self.deps[w] if self.last_user[d] == w)
        order = np.concatenate((self.order[i + 1:j + 1], [v]))
        live = np.concatenate((self.live[i + 1:j + 1] + shift,
                               [after - int(self.kept[v]) + held]))
        return i, j, order, live

    def apply(self, a: int, b: int, order: np.ndarray, live: np.ndarray, v: int) -> None:
        self.order[a:b + 1] = order
        self.pos[order] = np.arange(a, b + 1)
        self.live[a:b + 1] = live
        self.ram[a:b + 1] = live + self.own[order]
        pos = self.pos
        for d in self.deps[v]:  # only v's inputs can have changed their last user
            self.last_user[d] = max(self.users[d], key=lambda u: pos[u])


def excess_of(ram: np.ndarray, budget: int) -> int:
    return int(np.maximum(ram - budget, 0).sum())


def improve_order(order: list[int], deps: list[list[int]], users: list[list[int]],
                  size: list[int], workspace: list[int], budget: int, seed: int,
                  proposals: int, time_limit_s: float) -> list[int]:
    """The best order found by `proposals` moves from `order` (fewest bytes above `budget`
    summed over events, then the lowest peak). Deterministic for a seed unless `time_limit_s`
    stops it first."""
    sweep = OrderSweep(order, deps, users, size, workspace)
    rng = random.Random(seed)
    n = len(order)
    mean = max(1.0, sum(size) / max(1, n))
    excess = excess_of(sweep.ram, budget)
    best = (excess, int(sweep.ram.max()))
    best_order = sweep.order.copy()
    started = time.perf_counter()
    done = 0
    while done < proposals and excess > 0:
        if time.perf_counter() - started > time_limit_s:
            break
        over = np.flatnonzero(sweep.ram > budget)
        for _ in range(PROPOSALS_PER_EVENT_TRIES):
            done += 1
            temperature = TEMPERATURE * mean * (1.0 - done / proposals)
            t = int(over[rng.randrange(len(over))])
            p = rng.randint(max(0, t - NEIGHBOURHOOD), min(n - 1, t + NEIGHBOURHOOD))
            v = int(sweep.order[p])
            lo, hi = sweep.window(v)
            # to the other side of event t: just past it, to the window's end, or between
            if p <= t:
                if hi < t:
                    continue
                targets = {t, hi, rng.randint(t, hi)}
            else:
                if lo > t:
                    continue
                targets = {t, lo, rng.randint(lo, t)}
            targets.discard(p)
            chosen = None
            for j in sorted(targets):
                a, b, new_order, live = sweep.trial(v, j)
                ram = live + sweep.own[new_order]
                delta = excess_of(ram, budget) - excess_of(sweep.ram[a:b + 1], budget)
                if chosen is None or delta < chosen[0]:
                    chosen = (delta, a, b, new_order, live)
            if chosen is None:
                continue
            delta = chosen[0]
            if delta <= 0 or (temperature > 0 and rng.random() < math.exp(-delta / temperature)):
                sweep.apply(*chosen[1:], v)
                excess += delta
                if excess <= best[0]:
                    figures = (excess, int(sweep.ram.max()))
                    if figures < best:
                        best, best_order = figures, sweep.order.copy()
                if excess <= 0:
                    break
            if done >= proposals:
                break
    return [int(v) for v in best_order]
