"""Model in, planner graph out: trace, coarsen, assemble, and record how it was made."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..formats import Graph
from ..formats.graph import check_order
from .assemble import assemble
from .coarsen import Group, coarsen
from .estimate import DEFAULT_RATES
from .hf import canonical_spec
from .models import load_model
from .optimizer import optimizer_named
from .trace import TOOL, JointTrace, trace_joint

DEFAULT_MAX_NODES = 200


@dataclass
class Captured:
    graph: Graph
    trace: JointTrace  # the executor runs planner nodes through this
    groups: list[Group]
    module: nn.Module
    example_args: tuple


def capture_model(spec: str, batch: int | None = None, image: int | None = None,
                  seq: int | None = None, seed: int = 0, optimizer: str = "sgd",
                  max_nodes: int = DEFAULT_MAX_NODES, level: int | None = None) -> Captured:
    """Build a zoo model or MODULE:FACTORY and capture it (what `edge-remat graph` runs)."""
    start = time.perf_counter()
    spec = canonical_spec(spec)  # the board rebuilds the model from it, in another directory
    module, args = load_model(spec, batch, image, seq, seed)
    source = {"model": spec, "batch": batch, "image": image, "seq": seq, "seed": seed}
    return capture_module(module, args, spec, optimizer, max_nodes, level, source, start)


def capture_module(module: nn.Module, example_args, model: str = "model",
                   optimizer: str = "sgd", max_nodes: int = DEFAULT_MAX_NODES,
                   level: int | None = None, source: dict[str, Any] | None = None,
                   start: float | None = None) -> Captured:
    start = time.perf_counter() if start is None else start
    opt = optimizer_named(optimizer, model)
    trace = trace_joint(module, example_args, model)
    groups, level_used = coarsen(trace, max_nodes, level)
    graph, figures = assemble(trace, groups, module, tuple(example_args), opt)
    check_order(graph, model)
    graph.capture = {
        "tool": TOOL,
        "torch": torch.__version__,
        "model": model,
        "source": source or {"model": model},
        "optimizer": opt.name,
        "captured_nodes": len(trace.compute_nodes),
        "planner_nodes": len(graph),
        "level": level_used,
        "max_nodes": max_nodes,
        "trace_s": round(trace.capture_s, 4),
        "capture_s": round(time.perf_counter() - start, 4),
        "saved_bytes": figures["saved_bytes"],
        "fixed": figures["fixed"],
        "estimate": DEFAULT_RATES.to_dict(),
        "signature": trace.signature(),
    }
    return Captured(graph, trace, groups, module, tuple(example_args))


def recapture(graph: Graph) -> Captured:
    """Capture again from what `graph.capture` recorded (on the board, before executing a plan)
    and check that it is the same graph the plan was made for."""
    from .errors import CaptureError, GraphMismatch
    info = graph.capture
    source = info.get("source") or {}
    if "model" not in source:
        raise CaptureError(graph.name, "the graph does not say which model it was captured from")
    again = capture_model(source["model"], source.get("batch"), source.get("image"),
                          source.get("seq"), source.get("seed", 0), info.get("optimizer", "sgd"),
                          info.get("max_nodes", DEFAULT_MAX_NODES), info.get("level"))
    if again.graph.fingerprint() != graph.fingerprint():
        raise GraphMismatch(graph.name, "re-capturing gave a different graph (fingerprint "
                           f"{again.graph.fingerprint()} instead of {graph.fingerprint()}): "
                           "another torch version or model code?")
    return again
