"""A floor on the budget that recomputation cannot get under: a depth-limited pebbling game.

The working-set floor (floor.py) asks only that a node's inputs, output and workspace be in RAM
at once. Recomputation must also bring those inputs about, and while it computes the last of
them to arrive, the others are already held. Formally: let S be tensors all in RAM at some
moment. Take y in S whose latest computation came last; from then until that moment every other
member of S was already held (a member dropped in between would have had to be computed again,
later than y). So when y was computed, RAM held S, y's inputs and y's workspace; and S - {y} +
inputs(y) were all in RAM then, which is the same situation one step back. The scheduler picks
y (the min), the bound holds for all of its choices (the max):

    need(S) >= max(size(S), min over y in S of max(size(S | inputs(y)) + workspace(y),
                                                   need(S - {y} | inputs(y))))

starting from S = inputs(v) for every node v. A source (no inputs) just leaves S. Searched a
few levels deep, with a cap on the positions visited, every proof found is sound; a position
the search does not finish counts as unproven.

Only without paging: a tensor paged back in needs none of its inputs. Of the plain peak, the
floor rises from 11.7% to 19.2% on resnet18 (benchmarks/floors.py's graph; a plan at 1.05x it
trains), from 9.2% to 12.2% on ResNet-50's operator graph (batch 8, 64x64), and from 11.2% to
16.7% on a random layered graph of 5000 nodes (seed 1, in the 2 s given); GPT-2 small's
stays the working-set floor.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

MAX_DEPTH = 8  # levels of the game searched back from a node's inputs
NODE_VISITS = 4000  # positions one node's search may visit before it gives up (no proof)


@dataclass(frozen=True)
class PebblingFloor:
    bytes: int  # below this (fixed memory not included), no schedule without paging fits
    node: int  # the node whose inputs the proof starts from


class _Game:
    def __init__(self, sizes: list[int], deps: list[list[int]], workspace: list[int]):
        self.sizes, self.workspace = sizes, workspace
        self.deps = [frozenset(d) for d in deps]
        # what a node needs besides what is held: its inputs and workspace (a sort key)
        self.demand = [self.weight(d) + w for d, w in zip(self.deps, workspace)]
        self.visits = 0  # positions the current node's search has visited
        self.spent = 0  # positions visited by all searches so far

    def weight(self, tensors) -> int:
        sizes = self.sizes
        return sum(sizes[x] for x in tensors)

    def exceeds(self, v: int, capacity: int) -> bool:
        """Whether every way of bringing node v's inputs about, then running it, needs more
        than `capacity` bytes at some moment (as far as MAX_DEPTH levels and NODE_VISITS show)."""
        held = self.deps[v]
        total = self.weight(held)
        if total + self.sizes[v] + self.workspace[v] > capacity:
            return True
        self.visits = 0
        try:
            return bool(held) and self._all_exceed(held, total, MAX_DEPTH, capacity)
        except _GaveUp:
            return False
        finally:
            self.spent += self.visits

    def _all_exceed(self, held: frozenset, total: int, depth: int, capacity: int) -> bool:
        self.visits += 1
        if self.visits > NODE_VISITS:
            raise _GaveUp()
        if total > capacity:
            return True
        if depth == 0 or not held:
            return False
        # the last arrivals that add least first (an escape, if any, is found soonest); the
        # order is by what each needs outright, so that a move is weighed only when tried
        for y in sorted(held, key=self.demand.__getitem__):
            new = self.deps[y] - held
            grow = self.weight(new)
            if total + grow + self.workspace[y] > capacity:
                continue
            if not self._all_exceed((held - {y}) | new, total - self.sizes[y] + grow,
                                    depth - 1, capacity):
                return False
        return True

    def node_floor(self, v: int, low: int, high: int, stop: float, visits: float) -> int:
        """The largest capacity in [low, high) that v's game proves too small, to the byte, so
        that the floor named is the same whatever budget the search starts from (or the
        largest proven when the clock passes `stop` or the searches `visits` positions), given
        that it proves `low` too small (bisection: a proof at a capacity holds at every
        capacity below it)."""
        while high - low > 1 and time.perf_counter() < stop and self.spent <= visits:
            mid = (low + high) // 2
            if self.exceeds(v, mid):
                low = mid
            else:
                high = mid
        return low


class _GaveUp(Exception):
    pass


def proves_too_small(sizes: list[int], deps: list[list[int]], workspace: list[int],
                     capacity: int) -> int | None:
    """A node whose game shows that no schedule without paging runs within `capacity` bytes,
    or None where none does."""
    game = _Game(sizes, deps, workspace)
    for v in _most_demanding_first(game):
        if game.exceeds(v, capacity):
            return v
    return None


def pebbling_floor(sizes: list[int], deps: list[list[int]], workspace: list[int],
                   at_least: int, seconds: float = 2.0,
                   visits: float = math.inf) -> PebblingFloor | None:
    """The highest floor the game proves above `at_least` (capacity in bytes: no schedule
    without paging fits below it); None if none is above. After `seconds`, or once the searches
    have visited `visits` positions in all (a cap that, unlike the clock, stops at the same
    place on every machine), the search stops: the floor proven so far stands."""
    game = _Game(sizes, deps, workspace)
    upper = sum(sizes) + max(workspace, default=0) + 1  # keeping everything fits this
    best, stop = None, time.perf_counter() + seconds
    for v in _most_demanding_first(game):
        if time.perf_counter() > stop or game.spent > visits:
            break
        floor = at_least if best is None else best.bytes
        if game.exceeds(v, floor):
            best = PebblingFloor(game.node_floor(v, floor, upper, stop, visits) + 1, v)
    return best


def _most_demanding_first(game: _Game) -> list[int]:
    n = len(game.sizes)
    return sorted(range(n), key=lambda v: -(game.demand[v] + game.sizes[v]))
