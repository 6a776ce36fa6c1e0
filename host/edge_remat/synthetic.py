"""Random layered graphs, the published "RL" benchmarks' family (Appendix A of "Neural
Topological Ordering for Computation Graphs"), at any size.

The published graphs name their parameters (`random_layered_n250_w0.43_nlv0.75_ed0.2_scd0.14`);
the rules below were inferred from rl100.json and rl250.json and checked against them
(`layered_stats` measures both; tests/test_synthetic.py compares):

  - one source (id 0) and one sink (id 1), both with cost 0; inner nodes 2.. in layers;
  - inner layers have widths drawn uniformly from [m (1 - nlv), m (1 + nlv)] with mean
    m = 2 w sqrt(n) (rl100: w 0.27, 19 layers of 2..9; rl250: w 0.43, 22 layers of 4..22);
  - each pair of nodes in adjacent layers is an edge with probability `adjacent_p` (the
    published large layers measure 0.24-0.27; the name's "ed0.2" does not match it directly);
    a node without an input gets one from the layer before, a node without a user one in the
    layer after (so the source feeds all of layer 1 and the last layer feeds the sink);
  - skip edges make a share `scd` of all edges (measured 0.140 and 0.137): a random target in
    layer >= 2 reads a node some layers back, short spans more likely than long ones;
  - output sizes are 10 * round(|N(0, 260)|) bytes, at least 10 (half-normal: quantiles
    of both graphs within 10%), compute costs uniform integers 1..999;
  - the execution order is a random depth-first topological order (as the published `order`).
Deterministic for a seed, so tests and benchmarks see the same graph every time.
"""

from __future__ import annotations

import math
import random
import statistics

from edge_remat_agent.formats import Graph, Node

# The width parameter of each published graph, by size: rl100 and rl250 are in
# shared/benchmarks; the 500- and 1000-node graphs that Moccasin plans are named
# `random_layered_n500_w0.36_...` and `random_layered_n1000_w0.31_...` (not published here).
# A smaller w: fewer, narrower layers.
PUBLISHED_W_BY_SIZE = {100: 0.27, 250: 0.43, 500: 0.36, 1000: 0.31}
PUBLISHED_W = PUBLISHED_W_BY_SIZE[250]  # the generator's default: rl250's


def published_w(n: int) -> float:
    """The w of the published graph nearest in size to n (on a log scale; ties to the larger).
    Beyond 1000 nodes nothing is published, so 2000 and 5000 take the 1000-node graph's."""
    return min(PUBLISHED_W_BY_SIZE.items(),
               key=lambda item: (abs(math.log(item[0] / n)), -item[0]))[1]


def random_layered(n: int, seed: int = 0, w: float = PUBLISHED_W, nlv: float = 0.75,
                   adjacent_p: float = 0.25, scd: float = 0.14,
                   size_sigma: float = 260.0) -> Graph:
    if n < 3:
        raise ValueError("a random layered graph needs at least 3 nodes (source, sink, one more)")
    rng = random.Random(seed)
    mean_width = max(1.0, 2 * w * math.sqrt(n))
    low, high = max(1, round(mean_width * (1 - nlv))), max(1, round(mean_width * (1 + nlv)))
    layers: list[list[int]] = [[0]]
    next_id = 2
    while next_id < n:
        width = min(rng.randint(low, high), n - next_id)
        layers.append(list(range(next_id, next_id + width)))
        next_id += width
    layers.append([1])
    layer_of = {v: k for k, layer in enumerate(layers) for v in layer}

    inputs: dict[int, set[int]] = {v: set() for v in range(n)}
    adjacent = 0
    for before, after in zip(layers, layers[1:]):
        has_user = set()
        for b in after:
            for a in before:
                if rng.random() < adjacent_p:
                    inputs[b].add(a)
            if not inputs[b]:
                inputs[b].add(rng.choice(before))
            has_user |= inputs[b]
        for a in before:
            if a not in has_user:
                inputs[rng.choice(after)].add(a)
        adjacent += sum(len(inputs[b]) for b in after)
    inner = [v for layer in layers[2:-1] for v in layer]
    skips = round(adjacent * scd / (1 - scd))
    for _ in range(skips if inner else 0):
        target = rng.choice(inner)
        top = layer_of[target] - 2
        span = int(rng.expovariate(1 / 4.0))  # extra layers beyond 2, mean ~4 (both graphs)
        source_layer = top - span if span <= top else rng.randint(0, top)
        inputs[target].add(rng.choice(layers[source_layer]))

    order = _random_depth_first_order(n, inputs, rng)
    sizes = [max(10, 10 * round(abs(rng.gauss(0.0, size_sigma)))) for _ in range(n)]
    costs = [0.0 if v < 2 else float(rng.randint(1, 999)) for v in range(n)]
    nodes = [Node(id=v, name=f"n{v}", kind="forward", op="random", inputs=sorted(inputs[v]),
                  out_bytes=sizes[v], time_s=costs[v]) for v in order]
    name = f"random_layered_n{n}_w{w:g}_nlv{nlv:g}_ed{adjacent_p:g}_scd{scd:g}_seed{seed}"
    return Graph(nodes, name=name, cost_source="synthetic",  # costs 1..999, not seconds
                 capture={"tool": "synthetic.random_layered", "seed": seed, "w": w, "nlv": nlv,
                          "adjacent_p": adjacent_p, "scd": scd})


def _random_depth_first_order(n: int, inputs: dict[int, set[int]],
                              rng: random.Random) -> list[int]:
    """Kahn's algorithm with a stack, newly ready nodes pushed in random order."""
    users: dict[int, list[int]] = {v: [] for v in range(n)}
    missing = {v: len(ins) for v, ins in inputs.items()}
    for v, ins in inputs.items():
        for u in ins:
            users[u].append(v)
    stack = [v for v in range(n) if missing[v] == 0]
    order = []
    while stack:
        v = stack.pop()
        order.append(v)
        ready = []
        for k in users[v]:
            missing[k] -= 1
            if missing[k] == 0:
                ready.append(k)
        rng.shuffle(ready)
        stack.extend(ready)
    return order


def layered_stats(graph: Graph) -> dict[str, float]:
    """Shape statistics that the published graphs and the generator are compared on."""
    sizes = sorted(node.out_bytes for node in graph.nodes)
    inner = [node for node in graph.nodes if node.inputs]
    edges = sum(len(node.inputs) for node in graph.nodes)
    depth: dict = {}
    for node in graph.nodes:  # longest path from a source: the layer in a layered graph
        depth[node.id] = 1 + max((depth[i] for i in node.inputs), default=-1)
    spans = [depth[node.id] - depth[i] for node in graph.nodes for i in node.inputs]
    costs = [node.time_s or 0.0 for node in inner]
    return {"nodes": len(graph), "edges_per_node": edges / len(graph),
            "long_edge_share": sum(1 for s in spans if s > 1) / max(1, len(spans)),
            "depth": max(depth.values()), "size_mean": statistics.mean(sizes),
            "size_median": sizes[len(sizes) // 2],
            "size_p90": sizes[int(0.9 * len(sizes))], "cost_mean": statistics.mean(costs)}
