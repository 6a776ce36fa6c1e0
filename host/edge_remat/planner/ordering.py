"""A memory-aware execution order for graphs whose order is free.

The stage model (Checkmate's, and ours) computes nodes in the graph's given topological
order; the peak, and every recomputation a budget forces, follows from that order. Where
nothing but the edges ties the nodes (`Graph.order_is_free`: a graph the executor does not
replay, whose ops therefore draw no random numbers and update nothing in place in that
order), any topological order computes the same values, and one that frees tensors sooner
leaves less to recompute. This is the question "Neural Topological Ordering for Computation
Graphs" asks of the random layered graphs; here it is answered greedily:

  - among the nodes whose inputs are all computed, run the one that adds the fewest bytes:
    its output, less the inputs it is the last user of (ties: the given order);
  - repeat with a fixed random jitter on each node's score (seeded), and keep the order whose
    RAM lies least above the budget, summed over its compute events, then the lowest peak;
  - where that order is still over the budget, improve it by local search (planner/
    order_search.py): single nodes moved within their windows across over-budget events,
    on the same objective, for a number of moves that grows with the graph.

Each order costs O(edges log nodes) (a heap, re-scored only where a tensor gets its last
user). The planner then plans on the chosen order exactly as on a given one; the plan's
instructions name node ids, so it replays on the graph as given.
"""

from __future__ import annotations

import heapq
import random
import time
from dataclasses import dataclass, replace

from edge_remat_agent.formats import Graph

from .order_search import improve_order

ORDERS = ("auto", "given", "memory")
TRIES = 24  # orders tried: the plain greedy, then jittered ones
JITTERS = (0.25, 0.5, 1.0, 2.0)  # jitter scales, in mean output sizes, cycled over the tries
# Moves of the local search: its gains level off by 20-40 a node on random layered graphs
# (1000 nodes seed 2: 20k moves 0.93 -> 0.87x the given peak, 100k no lower; 2000 nodes
# seed 0: 20k 0.921x, 100k 0.913x); capped so that 5000 nodes take ~7 s of search. The time
# cap only guards a slow host.
SEARCH_MOVES_PER_NODE = 40
SEARCH_MOVES_MAX = 120_000
SEARCH_TIME_S = 10.0
GREEDY_TIME_S = 3.0  # the greedy's tries stop after this (5000 nodes: ~24 tries in 2.5-4 s)
# Where the caller has a time limit, the order gets at most this share of it (its time is
# counted in the plan's: solve() starts its clock at the order search's start).
ORDER_SHARE = 0.2


@dataclass
class OrderFigures:
    """How an order sweeps: the plain schedule's peak and its bytes above a budget, summed
    over compute events, as the greedy counts them (outputs, inputs, workspace)."""
    peak_bytes: int
    excess_bytes: int


def memory_order(graph: Graph, workspace: list[int], budget_bytes: int, seed: int = 0,
                 time_limit_s: float | None = None, search_moves: int | None = None
                 ) -> tuple[Graph, OrderFigures, OrderFigures]:
    """(the graph in the best order found, its figures, the given order's figures).
    `search_moves`: the local search's moves (None: SEARCH_MOVES_PER_NODE a node, at most
    SEARCH_MOVES_MAX; 0: the greedy alone). `time_limit_s`: for greedy and search together
    (None: GREEDY_TIME_S + SEARCH_TIME_S). Deterministic for a seed unless a time cap stops
    the greedy's tries or the search early."""
    if time_limit_s is None:
        time_limit_s = GREEDY_TIME_S + SEARCH_TIME_S
    greedy_s = min(GREEDY_TIME_S, 0.3 * time_limit_s)
    given = _sweep(graph, workspace, list(range(len(graph))), budget_bytes)
    rng = random.Random(seed)
    best_order, best = None, given
    started = time.perf_counter()
    for k in range(TRIES):
        jitter = 0.0 if k == 0 else JITTERS[(k - 1) % len(JITTERS)]
        order = _greedy(graph, workspace, rng, jitter)
        figures = _sweep(graph, workspace, order, budget_bytes)
        if (figures.excess_bytes, figures.peak_bytes) < (best.excess_bytes, best.peak_bytes):
            best_order, best = order, figures
        if k and time.perf_counter() - started > greedy_s:
            break
    if search_moves is None:
        search_moves = min(SEARCH_MOVES_MAX, SEARCH_MOVES_PER_NODE * len(graph))
    if search_moves and best.excess_bytes > 0:
        start = best_order if best_order is not None else list(range(len(graph)))
        deps, users = _structure(graph)
        left = min(SEARCH_TIME_S, time_limit_s - (time.perf_counter() - started))
        searched = improve_order(start, deps, users, [node.out_bytes for node in graph.nodes],
                                 workspace, budget_bytes, seed, search_moves, left)
        figures = _sweep(graph, workspace, searched, budget_bytes)
        if (figures.excess_bytes, figures.peak_bytes) < (best.excess_bytes, best.peak_bytes):
            best_order, best = searched, figures
    if best_order is None:
        return graph, given, given
    return replace(graph, nodes=[graph.nodes[i] for i in best_order]), best, given


def _structure(graph: Graph) -> tuple[list[list[int]], list[list[int]]]:
    deps = [sorted({graph.index[d] for d in node.inputs}) for node in graph.nodes]
    users: list[list[int]] = [[] for _ in graph.nodes]
    for k, ds in enumerate(deps):
        for d in ds:
            users[d].append(k)
    return deps, users


def _greedy(graph: Graph, workspace: list[int], rng: random.Random,
            jitter: float) -> list[int]:
    deps, users = _structure(graph)
    n = len(graph)
    size = [node.out_bytes for node in graph.nodes]
    mean = max(1.0, sum(size) / max(1, n))
    noise = [int(rng.random() * jitter * mean) if jitter else 0 for _ in range(n)]
    users_left = [len(u) for u in users]
    inputs_missing = [len(d) for d in deps]
    done = [False] * n
    score = [0] * n
    heap: list[tuple[int, int]] = []

    def push(v: int) -> None:
        score[v] = size[v] + workspace[v] + noise[v] - sum(
            size[d] for d in deps[v] if users_left[d] == 1)
        heapq.heappush(heap, (score[v], v))

    for v in range(n):
        if not inputs_missing[v]:
            push(v)
    order = []
    while heap:
        s, v = heapq.heappop(heap)
        if done[v] or s != score[v]:
            continue  # a stale entry: v was re-scored since
        done[v] = True
        order.append(v)
        for d in deps[v]:
            users_left[d] -= 1
            if users_left[d] == 1:  # its last user now frees it: that user, if ready, gains
                last = next(u for u in users[d] if not done[u])
                if not inputs_missing[last]:
                    push(last)
        for u in users[v]:
            inputs_missing[u] -= 1
            if not inputs_missing[u]:
                push(u)
    if len(order) != n:
        raise ValueError(f"graph '{graph.name}' has a cycle: no topological order")
    return order


def _sweep(graph: Graph, workspace: list[int], order: list[int],
           budget_bytes: int) -> OrderFigures:
    """Peak and summed excess of running `order` once, each tensor freed after its last user
    (the keep-all schedule's)."""
    deps, users = _structure(graph)
    size = [node.out_bytes for node in graph.nodes]
    users_left = [len(u) for u in users]
    live = peak = excess = 0
    for v in order:
        at = live + size[v] + workspace[v]
        peak = max(peak, at)
        excess += max(0, at - budget_bytes)
        if users[v]:  # an output nothing reads is freed at once, as keep-all frees it
            live += size[v]
        for d in deps[v]:
            users_left[d] -= 1
            if not users_left[d]:
                live -= size[d]
    return OrderFigures(peak, excess)
