"""Random layered graphs, shaped like the published "RL" benchmarks, at any size.

Nodes are laid out in layers of random width; each node reads one to four outputs of earlier
layers, mostly recent ones but now and then one far back (the long edges that make these graphs
hard to rematerialize). Sizes and costs are random integers in the published graphs' ranges.
Deterministic for a seed, so tests and benchmarks see the same graph every time.
"""

from __future__ import annotations

import random

from edge_remat_agent.formats import Graph, Node


def random_layered(n: int, seed: int = 0, max_width: int = 6, max_inputs: int = 4,
                   long_edge_share: float = 0.15) -> Graph:
    rng = random.Random(seed)
    layers: list[list[int]] = []
    count = 0
    while count < n:
        width = min(rng.randint(1, max_width), n - count)
        layers.append(list(range(count, count + width)))
        count += width
    layer_of = {v: k for k, layer in enumerate(layers) for v in layer}
    nodes = []
    for v in range(n):
        layer = layer_of[v]
        inputs: set[int] = set()
        if layer:
            for _ in range(rng.randint(1, max_inputs)):
                if rng.random() < long_edge_share:
                    source_layer = rng.randrange(layer)  # anywhere earlier
                else:
                    source_layer = max(0, layer - 1 - int(rng.expovariate(0.7)))
                inputs.add(rng.choice(layers[source_layer]))
        nodes.append(Node(id=v, name=f"n{v}", kind="forward", op="random",
                          inputs=sorted(inputs), out_bytes=rng.randint(2, 800) * 10,
                          time_s=float(rng.randint(1, 1000))))
    return Graph(nodes, name=f"random-layered-{n}-{seed}", cost_source="unknown", capture={"tool": "synthetic.random_layered", "seed": seed})
