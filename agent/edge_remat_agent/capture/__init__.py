"""Capture a model's real training graph and coarsen it into planner nodes.

Modules, one job each:
    models.py     where a model comes from: zoo name or MODULE:FACTORY
    trace.py      the joint forward + backward ATen graph (AOTAutograd), with what each input and
                  output means (parameter, buffer, batch, gradient, buffer update, loss)
    storage.py    which values share a storage (views cost nothing)
    coarsen.py    ATen nodes -> groups: a layer's forward, its backward, the loss
    assemble.py   groups -> planner `Graph` nodes (sizes per storage, workspace, dependencies)
    estimate.py   FLOP/bytes cost estimate (`cost_source: "estimate"` until a profile replaces it)
    optimizer.py  fixed memory (parameters, gradients, optimizer state) and the update node
    pipeline.py   capture_model / capture_module / recapture
    replay.py     StepRunner: runs planner nodes through their ATen nodes (the one engine the
                  executor, the op profiler and the tests run graphs with)
    program.py    a captured joint graph as plain data (ops, calling convention, storage roots)
    isolated.py   capture_isolated: recapture in a child process, run here from its Program
    measure.py    what eager PyTorch saves for backward (saved_tensors_hooks), to check against

This package imports torch lazily: `from edge_remat_agent.capture import CaptureError` is cheap.

Contract for the executor
-------------------------
Rebuilding the captured graph on the board. A graph made by `edge-remat graph` records in
`graph.capture`: `source` (`model`: zoo name or MODULE:FACTORY; `batch`, `image`, `seq`,
`seed`), `optimizer`, `max_nodes`, `level`, `torch` (version) and `signature` (below). Call
`recapture(graph)`: it rebuilds the model with the same seed, traces it again and checks that the
new graph has the same fingerprint (capture is deterministic: node names come from the trace,
costs are pure functions of shapes). It returns a `Captured` whose `trace.graph_module` is the
joint FX graph and `trace.node(name)` finds any captured node by name. A different torch version
or model code gives a different fingerprint, and recapture refuses. A MODULE:FACTORY source must
be importable on the board under the same name (a file path is relative to the working directory;
the daemon's jobs run in the agent's workdir). `capture_isolated(graph)` does the same in a child
process and returns a `Captured` whose trace is rebuilt from a `Program`: tracing imports
AOTAutograd (~90 MB resident on top of torch), which then never enters the training process.

Binding the graph's inputs (`graph.capture["signature"]`, also on `Captured.trace`):
    params        placeholder -> parameter name (module.named_parameters(remove_duplicate=False))
    buffers       placeholder -> buffer name
    user_inputs   placeholder -> index into the example arguments' leaves (the batch, flattened)
    tangent       placeholder fed with ones of the loss's shape (d loss / d loss)
    loss          the value holding the loss
    grads         value -> parameter name: write it to param.grad (assign, not accumulate)
    buffer_updates value -> buffer name: copy into the buffer once per step
`replay.bind_inputs` does this.

Each planner node (`graph.nodes`) carries in `attrs`:
    members   the captured FX node names it stands for, in execution order; run each as
              `node.target(*args, **kwargs)` with its arguments looked up by name (under
              torch.no_grad()). Empty for the update node.
    replays   views this node re-derives before its members (views of parameters, or of another
              node's output): free, listed so that the node depends only on the owner of the
              storage behind a view, never on the node that happened to take the view.
    reads     value -> id of the planner node that produced it: what must be resident when this
              node runs. The ids are exactly `node.inputs`.
    outputs   the values this node produces that other nodes read: what `free` / `page_out` /
              `page_in` act on; `out_bytes` is their storage bytes. Every other value a node
              computes can be dropped as soon as the node is done.
    grads / buffer_updates / loss   as in the signature, for the values this node produces.
    random    true when members draw random numbers (dropout). Save the CPU generator state
              (torch.get_rng_state()) before the node's first run; on every recompute set it
              back, run, and restore the generator afterwards. Masks are then identical, and
              the first runs, which happen in graph order, draw exactly what eager PyTorch draws.
    scope     the module path the node comes from; flops / bytes_moved: the estimate's inputs.
    optimizer (update node only) one of DEFAULT_LR's names: run the optimizer step over all trainable
              parameters (foreach=False, so its temporaries stay one parameter large, as
              `workspace_bytes` assumes).
Batch-norm running statistics are functionalized: the node that computes them returns new values
(`buffer_updates`) instead of mutating buffers, so recomputing it is pure; apply the values from
the first run only (StepRunner does). Dropout is captured as eager runs it on this machine (on
CPU: `bernoulli` noise, scaled, multiplied in), so memory and random draws match eager.

Graph-level: `fixed_bytes` = parameters + gradients + optimizer state + buffers + the batch
(`capture["fixed"]` breaks it down); `capture["saved_bytes"]` = bytes of forward outputs that
backward reads (what the plain schedule holds after the loss); `capture["captured_nodes"]` ATen
nodes became `capture["planner_nodes"]` planner nodes.
"""

from .errors import CaptureError

# Planner nodes a capture makes by default: the solvers handle a few hundred well.
DEFAULT_MAX_NODES = 200
# Each optimizer's learning rate unless --lr gives one (optimizer.TORCH_OPTIMIZERS; light, so
# that the CLI's help reads it without importing torch).
# The optimizers a graph's update node may stand for (capture/optimizer.py has their costs and
# torch classes), with their default learning rates: the command lines check names here.
DEFAULT_LR = {"sgd": 0.01, "sgd-nesterov": 0.01, "adam": 1e-3, "adam-amsgrad": 1e-3,
              "adamw": 1e-3}
OPTIMIZER_HELP = "sgd (momentum) | sgd-nesterov | adam | adam-amsgrad | adamw"
# The floating dtypes a model may train in (precision.py), checked by the command lines.
DTYPE_NAMES = ("fp32", "bf16", "fp16")
DTYPE_HELP = ("fp32 | bf16 | fp16: the whole model (parameters, buffers, gradients, optimizer "
              "state) and the batch's floating tensors in this dtype")
TRAINABLE_DTYPE_HELP = ("fp32: mixed precision, the parameters that train (LoRA adapters), "
                        "their gradients and optimizer state in float32, the frozen base in "
                        "--dtype (default: --dtype for all)")



def mixed_dtype_problem(dtype: str | None, trainable: str | None) -> str | None:
    """Why `--trainable-dtype trainable` cannot go with `--dtype dtype`, or None. Only float32
    apart from a half-precision model means something: adapters narrower than the base, or
    as narrow but unlike it, lose updates. (Light, for the command lines' checks.)"""
    dtype = dtype or "fp32"
    if trainable is None or trainable in (dtype, "fp32"):
        return None
    return (f"--trainable-dtype {trainable} with --dtype {dtype}: the trainable parameters "
            "are kept in fp32 or in --dtype; give --trainable-dtype fp32 or leave it out")


__all__ = ["CaptureError", "DEFAULT_LR", "DTYPE_NAMES", "DTYPE_HELP", "TRAINABLE_DTYPE_HELP", "mixed_dtype_problem", "OPTIMIZER_HELP", "DEFAULT_MAX_NODES", "Captured", "capture_model", "capture_module", "recapture"]


def __getattr__(name):  # torch-heavy parts load on first use
    if name in ("Captured", "capture_model", "capture_module", "recapture"):
        from . import pipeline
        return getattr(pipeline, name)
    raise AttributeError(name)
