"""Small graphs for the exactness tests: random DAGs and training-shaped chains."""

from __future__ import annotations

import random

from edge_remat_agent.formats import Graph, Node


def random_dag(n: int, seed: int, max_inputs: int = 2, max_size: int = 8) -> Graph:
    rng = random.Random(seed)
    nodes = []
    for i in range(n):
        k = 0 if i == 0 else rng.randint(1, min(max_inputs, i))
        inputs = sorted(rng.sample(range(i), k))
        nodes.append(Node(id=i, name=f"n{i}", kind="forward", op="op", inputs=inputs,
                          out_bytes=rng.randint(1, max_size), time_s=float(rng.randint(1, 5)),
                          energy_j=float(rng.randint(1, 9))))
    return Graph(nodes, name=f"random-{n}-{seed}")


def training_chain(layers: int, seed: int) -> Graph:
    """forward x_1..x_L, loss, backward g_L..g_1 where g_k reads x_k (and x_{k-1}) and g_{k+1}."""
    rng = random.Random(seed)
    nodes: list[Node] = []
    for k in range(layers):
        nodes.append(Node(id=f"f{k}", name=f"f{k}", kind="forward", op="layer",
                          inputs=[f"f{k-1}"] if k else [], out_bytes=rng.randint(2, 8),
                          time_s=float(rng.randint(1, 4))))
    nodes.append(Node(id="loss", name="loss", kind="loss", op="loss",
                      inputs=[f"f{layers-1}"], out_bytes=1, time_s=1.0))
    prev = "loss"
    for k in reversed(range(layers)):
        inputs = [prev, f"f{k}"] + ([f"f{k-1}"] if k else [])
        nodes.append(Node(id=f"b{k}", name=f"b{k}", kind="backward", op="layer_grad",
                          inputs=inputs, out_bytes=rng.randint(2, 8),
                          time_s=float(rng.randint(1, 6))))
        prev = f"b{k}"
    return Graph(nodes, name=f"chain-{layers}-{seed}")
