"""Model in, planner graph out: trace, coarsen, assemble, and record how it was made."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..formats import Graph
from ..executor.saved_weights import state_dict_record
from ..formats.graph import check_order
from ..user_code import prints_to_stderr
from .assemble import assemble
from .coarsen import Group, coarsen
from .estimate import DEFAULT_RATES
from .hf_spec import canonical_spec
from .models import load_model
from .errors import CaptureError
from ..grad_clip import check_max_norm
from .gradient_groups import gradients_apart, weight_gradients_apart
from .precision import dtype_source, refuse_fp16_adam
from .optimizer import optimizer_named
from ..formats.graph_details import PARAM_HOMES, UPDATE_MODES
from .refine import name_ops, refine, split_to_ops
from .trace import TOOL, JointTrace, trace_joint
from ..accumulation import ACCUMULATE_KEY, check_micro_batches
from ..weights.deferred import deferred_weights, is_deferred, traceable

from . import DEFAULT_MAX_NODES


OPERATOR_LEVEL_NODES = 10**9  # no node limit: coarsening starts at the finest level


@dataclass
class Captured:
    graph: Graph
    trace: JointTrace  # the executor runs planner nodes through this
    groups: list[Group]
    module: nn.Module
    example_args: tuple


def capture_model(spec: str, batch: int | None = None, image: int | None = None,
                  seq: int | None = None, seed: int = 0, optimizer: str = "sgd",
                  max_nodes: int = DEFAULT_MAX_NODES, level: int | None = None,
                  update: str = "fused", params_home: str = "ram",
                  train: list[str] | None = None, refined: bool = True,
                  operator_level: bool = False, clip_grad_norm: float | None = None,
                  accumulate: int = 1, dtype: str | None = None,
                  trainable_dtype: str | None = None,
                  grouped_for: str | None = None) -> Captured:
    """Build a zoo model or MODULE:FACTORY and capture it (what `edge-remat graph` runs).
    `train`: name patterns of the parameters to train (the rest are frozen); None: as the
    model comes. `refined=False` keeps module-level groups only; `operator_level=True` makes
    one node per ATen op that allocates (max_nodes and level do not apply).
    `clip_grad_norm`: clip the gradients' global norm at this before the updates.
    `accumulate`: the micro-batches of one optimizer step (accumulation.py). `dtype`: fp32
    (None) | bf16 | fp16, the whole model in it (precision.py); `trainable_dtype`: the
    trainable parameters' instead (None: `dtype`; precision.py's mixed precision).
    `grouped_for`: the parameters' home whose graph the nodes are grouped for (None:
    `params_home`), so that graphs of both homes share their compute nodes (capture_module)."""
    start = time.perf_counter()
    spec = canonical_spec(spec)  # the board rebuilds the model from it, in another directory
    with prints_to_stderr():  # the factory's and forward's
        with deferred_weights():  # tracing needs shapes only: no model's weights in RAM
            module, args = load_model(spec, batch, image, seq, seed, dtype, train,
                                      trainable_dtype)
        _refuse_meta_weights(module, spec)
        source = {"model": spec, "batch": batch, "image": image, "seq": seq, "seed": seed,
                  **dtype_source(dtype, trainable_dtype)}
        if train is not None:
            source["train"] = list(train)
        return capture_module(module, args, spec, optimizer, max_nodes, level, source, start,
                              update, params_home, refined, operator_level,
                              clip_grad_norm=clip_grad_norm, accumulate=accumulate,
                              grouped_for=grouped_for)


# Eager CPU GRUs add into and apply sigmoid to their gates in place, on strided views of the
# gate projections: the sigmoid then runs row by row, a row's tail past whole vector loops in
# scalar code. The captured graph applies it to a contiguous sum, vectorised throughout, so the
# tails round differently (gradients ~1e-8 off eager's at hidden sizes 16, 20, 24, 48 here, with
# AVX512; exact at 32, 64, 96): a multiple of 32 has no tail on any CPU torch vectorises for.
_GRU_ROW = 32


def _refuse_inexact_grus(module: nn.Module, model: str) -> None:
    for name, layer in module.named_modules():
        if isinstance(layer, (nn.GRU, nn.GRUCell)) and layer.hidden_size % _GRU_ROW:
            raise CaptureError(model, f"{type(layer).__name__} '{name}' has hidden size "
                               f"{layer.hidden_size}: eager PyTorch computes its gates in place "
                               "on strided views, which the captured graph cannot round alike "
                               f"(gradients would differ from eager's): use a hidden size that "
                               f"is a multiple of {_GRU_ROW}, or nn.LSTM")


def _refuse_meta_weights(module: nn.Module, spec: str) -> None:
    """A model whose parameters are on `meta` traces (capture needs only shapes), but the board
    has no values to train unless the model makes them itself (`weight_seed`, zoo/llama.py):
    refused here, not at the board's first step."""
    if is_deferred(module) and getattr(module, "weight_seed", None) is None:
        name = next(n for n, p in module.named_parameters() if p.device.type == "meta")
        raise CaptureError(spec, f"parameter '{name}' is on the meta device, with no values to "
                           "train: build the model with real weights (e.g. "
                           "model.to_empty(device='cpu'), then initialise or load them)")


def _refuse_compiled_modules(module: nn.Module, model: str) -> None:
    """A TorchScript or torch.compile module runs compiled code that capture cannot trace
    (TorchScript takes no hooks: an internal error, exit 70; torch.compile's code failed
    inside functionalization), and whose kernels would not round as eager's: refused by name."""
    from torch._dynamo.eval_frame import OptimizedModule
    for path, sub in module.named_modules():
        where = f"module '{path}'" if path else "the model"
        if isinstance(sub, torch.jit.ScriptModule):
            raise CaptureError(model, f"{where} is a TorchScript module (torch.jit.script or "
                               "torch.jit.trace), which capture cannot trace: build it as a "
                               "plain nn.Module (leave out torch.jit)")
        if isinstance(sub, OptimizedModule):
            raise CaptureError(model, f"{where} is wrapped by torch.compile, whose compiled "
                               "code capture cannot trace: use the module itself (leave out "
                               "torch.compile, or take its ._orig_mod)")
        called = _script_functions_called(type(sub).forward)
        if called:
            raise CaptureError(model, f"{where} calls '{called[0]}', a TorchScript function "
                               "(torch.jit.script), whose backward TorchScript derives with "
                               "its own formulas, so the planned step's gradients could not "
                               "be eager's bit for bit: make it a plain Python function "
                               "(leave out @torch.jit.script)")


def _script_functions_called(function) -> list[str]:
    """The global names `function`'s code (and the code nested in it) reads that are
    TorchScript functions. Traced, their forward is eager's, but eager's backward is
    TorchScript's autodiff: a tanh-GELU's weight gradient differed from the plan's in the last
    bits (gradient check failed, exit 1)."""
    code, scope = getattr(function, "__code__", None), getattr(function, "__globals__", {})
    found, codes = [], [code] if code is not None else []
    while codes:
        current = codes.pop()
        codes += [c for c in current.co_consts if hasattr(c, "co_names")]
        found += [n for n in current.co_names
                  if isinstance(scope.get(n), torch.jit.ScriptFunction) and n not in found]
    return found


def capture_module(module: nn.Module, example_args, model: str = "model",
                   optimizer: str = "sgd", max_nodes: int = DEFAULT_MAX_NODES,
                   level: int | None = None, source: dict[str, Any] | None = None,
                   start: float | None = None, update: str = "fused",
                   params_home: str = "ram", refined: bool = True,
                   operator_level: bool = False, clip_grad_norm: float | None = None,
                   accumulate: int = 1, grouped_for: str | None = None) -> Captured:
    """`grouped_for`: group the ops into nodes as for a graph with parameters homed there
    (None: `params_home`), then assemble the graph with them homed at `params_home`. How
    refinement groups depends on the home (param nodes change where memory is decided:
    resnet18 b8 is 173 nodes with parameters in RAM, 90 with them on flash); a profile is
    keyed by node signatures, so the graph with parameters in RAM that a profile job times
    for a flash-homed run is grouped for flash, and its compute nodes are the run's."""
    start = time.perf_counter() if start is None else start
    try:
        if clip_grad_norm is not None:
            clip_grad_norm = check_max_norm(clip_grad_norm)
        check_micro_batches(accumulate)
    except ValueError as error:
        raise CaptureError(model, str(error)) from None
    opt = optimizer_named(optimizer, model)
    if update not in UPDATE_MODES:
        raise CaptureError(model, f"update must be one of {', '.join(UPDATE_MODES)}, "
                           f"got {update!r}")
    grouping_home = params_home if grouped_for is None else grouped_for
    for home in {params_home, grouping_home}:
        if home not in PARAM_HOMES:
            raise CaptureError(model, f"the parameters' home must be one of "
                               f"{', '.join(PARAM_HOMES)}, got {home!r}")
    if params_home != "ram" and update != "fused":
        raise CaptureError(model, "parameters can live on a page tier only with fused updates")
    _refuse_inexact_grus(module, model)
    _refuse_compiled_modules(module, model)
    refuse_fp16_adam(module, opt.name, model)
    trace = trace_joint(traceable(module), example_args, model)  # no weights made for it
    split_gradients = clip_grad_norm is not None and update == "fused"
    if split_gradients:  # a weight's gradient apart from its input's, where one op makes both
        weight_gradients_apart(trace)

    def build(groups: list[Group], home: str = params_home) -> tuple[Graph, dict]:
        return assemble(trace, groups, module, tuple(example_args), opt, update=update,
                        params_home=home, clip_grad_norm=clip_grad_norm,
                        accumulate=accumulate)

    def build_for_grouping(groups: list[Group]) -> tuple[Graph, dict]:
        return build(groups, grouping_home)

    if operator_level:  # the finest module level, then every group down to single ops
        groups, level_used = coarsen(trace, OPERATOR_LEVEL_NODES, None,
                                     paged_params=grouping_home != "ram")
        groups = split_to_ops(trace, groups)
    elif refined:  # module-level groups in half the node budget; refinement spends the rest
        # where memory is decided (capture/refine.py)
        groups, level_used = coarsen(
            trace, activation_nodes(max(5, max_nodes // 2), update, grouping_home), level,
            paged_params=grouping_home != "ram",  # heavy parameters may use the whole budget
            split_nodes=activation_nodes(max_nodes, update, grouping_home))
        groups = refine(trace, groups, max_nodes, lambda gs: build_for_grouping(gs)[0])
    else:
        groups, level_used = coarsen(trace, activation_nodes(max_nodes, update, grouping_home),
                                     level, paged_params=grouping_home != "ram")
    if split_gradients:
        # the norm waits for the gradients, not for whole backward nodes (with one step after
        # the backward, the gradients are fixed memory: nothing to free sooner)
        room = None if operator_level else max_nodes - len(build_for_grouping(groups)[0])
        groups = gradients_apart(trace, groups, room)
    graph, figures = build(groups)
    name_ops(trace, graph)
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
        "refined": refined,
        **({"operator_level": True} if operator_level else {}),
        **({ACCUMULATE_KEY: accumulate} if accumulate > 1 else {}),
        "trace_s": round(trace.capture_s, 4),
        "capture_s": round(time.perf_counter() - start, 4),
        "saved_bytes": figures["saved_bytes"],
        "fixed": figures["fixed"],
        "planned_state": figures["planned"],
        "update": update,
        "params_home": params_home,
        **({"grouped_for": grouping_home} if grouping_home != params_home else {}),
        **({"clip_grad_norm": clip_grad_norm} if clip_grad_norm is not None else {}),
        "estimate": DEFAULT_RATES.to_dict(),
        "signature": trace.signature(),
        "state_dict": state_dict_record(module),  # what --init may hold: deploy checks it
    }
    return Captured(graph, trace, groups, module, tuple(example_args))


def activation_nodes(max_nodes: int, update: str, params_home: str) -> int:
    """The node budget coarsening may spend on forward, loss and backward nodes: besides its
    backward, each forward node may bring an update node (fused) and a param node (parameters
    homed on a tier), so that the whole graph stays within `max_nodes`."""
    per_forward = 2 + (update == "fused") + (params_home != "ram")
    return max(3, 2 * ((max_nodes - 1) // per_forward) + 1)


def recapture(graph: Graph) -> Captured:
    """Capture again from what `graph.capture` recorded (on the board, before executing a plan)
    and check that it is the same graph the plan was made for."""
    from .errors import GraphMismatch
    again = _capture_as_recorded(graph)
    if again.graph.fingerprint() != graph.fingerprint():
        raise GraphMismatch(graph.name, "re-capturing gave a different graph (fingerprint "
                           f"{again.graph.fingerprint()} instead of {graph.fingerprint()}; "
                           f"{first_difference(graph, again.graph)}): another torch version "
                           "or model code, or a graph file edited by hand?")
    return again


def first_difference(given: Graph, captured: Graph) -> str:
    """Where the graph file and this machine's capture first differ, in what the fingerprint
    covers: the node count, fixed memory, or a node's field (QA: a file with every size
    halved by hand was blamed on torch or the model code, naming nothing)."""
    if len(given.nodes) != len(captured.nodes):
        return f"the file has {len(given.nodes)} nodes, the capture here {len(captured.nodes)}"
    if given.fixed_bytes != captured.fixed_bytes:
        return (f"fixed_bytes is {given.fixed_bytes} in the file, {captured.fixed_bytes} "
                "captured here")
    for mine, theirs in zip(given.nodes, captured.nodes):
        for name in ("id", "inputs", "out_bytes", "workspace_bytes", "time_s", "energy_j"):
            if getattr(mine, name) != getattr(theirs, name):
                return (f"node {mine.id!r}'s {name} is {getattr(mine, name)!r} in the file, "
                        f"{getattr(theirs, name)!r} captured here")
    return "the same nodes, in another form"


def recapture_in_ram(graph: Graph) -> Captured:
    """The graph's model captured again with its parameters in RAM, its ops grouped into nodes
    as the graph's are (`grouped_for` its home): what a profile job times for a graph whose
    parameters live on a page tier (timing runs plain steps, with every parameter in RAM).
    Checked to have the graph's compute nodes (profiles are keyed by their signatures);
    its update nodes are its RAM twins (costs.profile_key_for)."""
    from .errors import GraphMismatch
    info = graph.capture
    home = info.get("params_home", "ram")
    again = _capture_as_recorded(graph, params_home="ram",
                                 grouped_for=info.get("grouped_for") or home)
    if compute_signatures(again.graph) != compute_signatures(graph):
        raise GraphMismatch(graph.name, "re-capturing it with parameters in RAM gave other "
                           "compute nodes: another torch version or model code?")
    return again


def compute_signatures(graph: Graph) -> list[str]:
    """The profile keys of the nodes that compute (not a parameter load or an update), in
    order."""
    return [n.signature or n.op for n in graph.nodes if n.kind not in ("param", "update")]


def _capture_as_recorded(graph: Graph, **overrides) -> Captured:
    """capture_model with what `graph.capture` recorded, `overrides` replacing its record."""
    from .errors import CaptureError
    info = graph.capture
    source = info.get("source") or {}
    if "model" not in source:
        raise CaptureError(graph.name, "the graph does not say which model it was captured from")
    recorded = {"params_home": info.get("params_home", "ram"),
                "grouped_for": info.get("grouped_for")}
    return capture_model(source["model"], source.get("batch"), source.get("image"),
                         source.get("seq"), source.get("seed", 0), info.get("optimizer", "sgd"),
                         info.get("max_nodes", DEFAULT_MAX_NODES), info.get("level"),
                         info.get("update", "step"), train=source.get("train"),
                         refined=info.get("refined", False),
                         operator_level=info.get("operator_level", False),
                         clip_grad_norm=info.get("clip_grad_norm"),
                         accumulate=info.get(ACCUMULATE_KEY, 1), dtype=source.get("dtype"),
                         trainable_dtype=source.get("trainable_dtype"),
                         **{**recorded, **overrides})
