#!/usr/bin/env python3
"""What a graph's first training step leaves to its process for good, call by ATen call: the
warm-up a measured profile charges (profiler.ops.first_step_memory), taken apart.

    python benchmarks/first_calls.py GRAPH.json [--top 12] [--steps 2] [--eager]

GRAPH.json is a graph file (`edge-remat graph`, or graph.json in a run's --out folder). As the
profile job measures it, in this fresh process: the graph captured again here (with its
parameters in RAM where it homes them on flash: the profile job times that twin), then plain
steps run node by node and measured by the profiler's own first_step_memory. Per step: the
anonymous resident bytes (RssAnon, the heap trimmed) it left beyond the optimizer state it
made; for the first, every ATen call's rise beyond the storages it returned, summed over calls
of the same op, shapes, dtypes and layouts, largest first, and each node's share (what the
profile records as its `persistent_bytes`). `--eager`: the same model trained by plain PyTorch
(executor.step.plain_step) instead, what it pays for the same calls. A cost of
the libraries (MKL's buffers, oneDNN's cached primitives) rather than of the tensors: see
docs/memory.md, "Why bf16 leaves more than fp32".
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from arguments import non_negative_int, positive_int  # this script's neighbour

MiB = 2**20


def storages(tree) -> dict[int, int]:
    """data_ptr -> bytes of the distinct storages behind the tensors in `tree`."""
    return {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
            for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)}


class CallRises(TorchDispatchMode):
    """Each ATen call's rise in RssAnon beyond the new storages it returned, by (op, the
    shapes, dtypes and layouts of its tensor arguments: a matmul on a transposed weight is
    another oneDNN primitive than one on the weight as stored)."""

    def __init__(self):
        super().__init__()
        self.rises: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from edge_remat_agent.profiler.memory import anonymous_resident_bytes
        before = anonymous_resident_bytes()
        out = func(*args, **(kwargs or {}))
        given = storages((args, kwargs))
        made = sum(n for ptr, n in storages(out).items() if ptr not in given)
        shapes = tuple(f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}"
                       + ("" if t.is_contiguous() else " strided")  # another kernel
                       for t in tree_flatten(args)[0] if isinstance(t, torch.Tensor))
        self.rises[(str(func), shapes)] += anonymous_resident_bytes() - before - made
        return out


def node_by_node(graph_path: str):
    """step() -> (MiB left, {node name: its share}): one step run node by node and measured by
    the profile job's own code (profiler.ops.first_step_memory), on the twin it times."""
    from edge_remat_agent.executor.run import capture_here
    from edge_remat_agent.executor.updates import homed_parameters, make_optimizer
    from edge_remat_agent.formats import load_graph
    from edge_remat_agent.profiler import ops

    graph = load_graph(graph_path)
    captured = capture_here(graph, in_ram=bool(homed_parameters(graph)))
    runner, module, _, _ = ops._runner_for(captured, None, True, False)
    optimizer = make_optimizer(captured.graph, module, None, None, None)
    names = {node.id: node.name for node in captured.graph.nodes}

    def step():
        shares = ops.first_step_memory(runner, module, optimizer, captured.example_args)
        return sum(shares.values()), {names[key]: share for key, share in shares.items()}
    return step


def eager(graph_path: str):
    """step() -> (MiB left, None): one plain PyTorch step of the graph's model, what it left
    measured as first_step_memory measures it (its optimizer's new state taken out)."""
    from edge_remat_agent.allocator import map_large_blocks
    from edge_remat_agent.capture.models import load_source_model
    from edge_remat_agent.capture.optimizer import torch_optimizer
    from edge_remat_agent.executor.step import plain_step
    from edge_remat_agent.formats import load_graph
    from edge_remat_agent.profiler.first_step import state_bytes
    from edge_remat_agent.profiler.memory import anonymous_resident_bytes
    from edge_remat_agent.weights.deferred import make_missing

    capture = load_graph(graph_path).capture
    map_large_blocks()  # the executor's allocator setting, as node_by_node's runner has it
    module, batch = load_source_model(capture["source"])
    make_missing(module)
    optimizer = torch_optimizer(capture.get("optimizer", "sgd"), module)

    def step():
        start, state = anonymous_resident_bytes(), state_bytes(optimizer)
        plain_step(module, optimizer, batch)
        return anonymous_resident_bytes() - start - (state_bytes(optimizer) - state), None
    return step


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("graph", help="a graph file (edge-remat graph; a run's graph.json)")
    parser.add_argument("--top", type=non_negative_int, default=12,
                        help="calls and nodes listed (default 12)")
    parser.add_argument("--steps", type=positive_int, default=2, help="steps measured (default 2)")
    parser.add_argument("--eager", action="store_true",
                        help="plain PyTorch's step instead of the graph's nodes")
    args = parser.parse_args()
    from edge_remat_agent.executor.errors import ExecutorError
    from edge_remat_agent.formats import FormatError
    from edge_remat_agent.profiler.memory import anonymous_resident_bytes
    if anonymous_resident_bytes() is None:
        print("error: no RssAnon in /proc/self/status (Linux only)", file=sys.stderr)
        return 2
    try:
        step = (eager if args.eager else node_by_node)(args.graph)
    except (OSError, FormatError, ValueError, ExecutorError) as error:  # ValueError: capture
        print(f"error: {error}", file=sys.stderr)
        return 2
    calls = CallRises()
    with calls:
        left, shares = step()
    print(f"step 1: left {left / MiB:.2f} MiB beyond the optimizer state it made")
    by_op = Counter()
    for (op, _), rise in calls.rises.items():
        by_op[op] += rise
    print("  by op: " + ", ".join(f"{op} {rise / MiB:.2f}" for op, rise in by_op.most_common(5)))
    for (op, shapes), rise in calls.rises.most_common(args.top):
        print(f"  {rise / MiB:7.2f} MiB  {op}  {', '.join(shapes)}")
    if shares:
        print("  by node (the profile's persistent_bytes):")
        for name, share in Counter(shares).most_common(args.top):
            print(f"  {share / MiB:7.2f} MiB  {name}")
    for index in range(1, args.steps):
        print(f"step {index + 1}: left {step()[0] / MiB:.2f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
