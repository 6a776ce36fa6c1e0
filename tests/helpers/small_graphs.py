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


def state_chain(seed: int) -> Graph:
    """A training step whose parameters, gradient and update are planned tensors (as a fused
    capture with parameters on flash makes them): a param node loads the weights (costing a
    flash read), the backward's output holds the gradient, the update reads it and the
    weights, and frees the gradient's last use."""
    rng = random.Random(seed)

    def node(id_, kind, inputs, out_bytes, time_s, **attrs):
        return Node(id=id_, name=id_, kind=kind, op=kind, inputs=inputs, out_bytes=out_bytes,
                    time_s=time_s, attrs=attrs)
    weights = rng.randint(3, 8)
    nodes = [node("params", "param", [], weights, float(rng.randint(1, 3))),
             node("f0", "forward", [], rng.randint(2, 6), float(rng.randint(1, 3))),
             node("f1", "forward", ["f0", "params"], rng.randint(2, 6), float(rng.randint(1, 4))),
             node("loss", "loss", ["f1"], 1, 1.0),
             node("b1", "backward", ["loss", "f0", "params"], weights + rng.randint(1, 4),
                  float(rng.randint(2, 5))),
             node("update", "update", ["b1", "params"], 0, float(rng.randint(1, 2)))]
    nodes[-1].workspace_bytes = weights  # the optimizer state read from flash
    return Graph(nodes, name=f"state-chain-{seed}")


def tiny_graphs():
    """A hypothesis strategy for exhaustive-search checks: random DAGs of 3-7 nodes with 1-3
    inputs a node, and training chains of 1-2 layers."""
    from hypothesis import strategies as st
    return st.one_of(
        st.builds(random_dag, st.integers(3, 7), st.integers(0, 10**6), st.integers(1, 3)),
        st.builds(training_chain, st.integers(1, 2), st.integers(0, 10**6)))
