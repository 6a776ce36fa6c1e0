"""Capture the joint forward + backward graph of a loss-returning module with AOTAutograd.

We use `aot_export_joint_with_descriptors`: it traces forward and backward together with fake
tensors (no real memory, no real compute), functionalizes the graph (in-place ops become
out-of-place ops; batch-norm running-stat updates become extra outputs) and labels every input and
output with what it is (parameter, buffer, user input, gradient, buffer update). Unlike
`aot_export_module` it does not re-trace the joint graph, so per-node metadata survives: the
`seq_nr` that ties a backward op to the forward op it differentiates, and the module scope that our
forward hooks attach (copied by AOTAutograd onto the backward ops as well).
"""

from __future__ import annotations

import contextlib
import logging
import operator
import re
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.fx.traceback as fx_traceback
from torch import fx, nn
from torch._C import DispatchKey

from .effects import drop_effect_tokens
from .errors import CaptureError
from .inexact import refuse_value_dependent_backwards
from .python_state import changed_since, python_state
from ..user_code import USER_CODE_FAILURES, raised

SCOPE_KEY = "edge_remat_scope"  # our key inside node.meta["custom"]

TOOL = "torch._functorch.aot_autograd.aot_export_joint_with_descriptors"

# Tracing touches process-wide state (fx metadata, the dropout override): one trace at a time.
_TRACE_LOCK = threading.Lock()


@dataclass
class JointTrace:
    """The captured joint graph and what its inputs and outputs mean.

    Placeholders are bound by the caller: `params` / `buffers` map placeholder names to the module's
    parameter / buffer names, `user_inputs` to positions in the example arguments, and `tangent` is
    d(loss)/d(loss), fed with ones. `grads`, `buffer_updates` and `loss` name the values the step
    produces for the outside world.
    """

    model: str
    graph_module: fx.GraphModule
    params: dict[str, str]
    buffers: dict[str, str]
    user_inputs: dict[str, int]
    tangent: str
    loss: str
    grads: dict[str, str]  # value name -> parameter name
    buffer_updates: dict[str, str]  # value name -> buffer name
    input_updates: dict[str, int] = field(default_factory=dict)  # value name -> user input index
    capture_s: float = 0.0
    # plain module attributes the traced forward changed (python_state.py): for a warning
    forward_changes: list[str] = field(default_factory=list)
    roots: dict[str, str] | None = field(default=None, repr=False)  # see storage_roots
    _by_name: dict[str, fx.Node] = field(default_factory=dict, init=False, repr=False)
    # What every assembly of a grouping computes again (refinement assembles the graph once per
    # split): pure functions of the graph, forgotten when it changes (see `memo`).
    _memo: dict = field(default_factory=dict, init=False, repr=False)

    @property
    def compute_nodes(self) -> list[fx.Node]:
        return [n for n in self.graph_module.graph.nodes if n.op == "call_function"]

    def node(self, name: str) -> fx.Node:
        if not self._by_name:
            self._by_name = {n.name: n for n in self.graph_module.graph.nodes}
        return self._by_name[name]

    def graph_changed(self) -> None:
        """After a rewrite of the graph: names are looked up afresh, the code is regenerated."""
        self._by_name = {}
        self._memo = {}
        self.graph_module.recompile()

    def constants(self) -> dict[str, torch.Tensor]:
        """Tensor constants the trace lifted out of the model's code (e.g. `torch.tensor(...)`
        inside a forward, as transformers' attention masks make): get_attr nodes whose real
        values the graph module holds. The executor binds them like the placeholders."""
        gm = self.graph_module
        return {n.name: getattr(gm, n.target) for n in gm.graph.nodes if n.op == "get_attr"}

    def memo(self, key: tuple, compute: Callable[[], Any]) -> Any:
        """compute(), kept under `key` until the graph changes: for values that depend on the
        graph alone (and on what the key holds)."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def storages(self) -> dict:
        """storage.storages of the graph (value name -> Storage); the caller must not change it."""
        from .storage import storages
        return self.memo(("storages",), lambda: storages(self.graph_module))

    def storage_roots(self) -> dict[str, str]:
        """Tensor value name -> the value that owns its storage (storage.py; kept as given when
        the graph was rebuilt from a Program, whose nodes carry no fake values)."""
        if self.roots is None:
            self.roots = {name: s.root for name, s in self.storages().items()}
        return self.roots

    def signature(self) -> dict[str, Any]:
        """The calling convention, for the graph file (the executor checks it after re-capture)."""
        return {"params": self.params, "buffers": self.buffers, "user_inputs": self.user_inputs,
                "tangent": self.tangent, "loss": self.loss, "grads": self.grads,
                "buffer_updates": self.buffer_updates, "input_updates": self.input_updates}


def trace_joint(module: Any, example_args: Any, model: str = "model") -> JointTrace:
    """Trace `module(*example_args)` (the scalar training loss) and its backward, once."""
    if not isinstance(module, nn.Module):
        raise CaptureError(model, f"expected a torch.nn.Module, got {type(module).__name__}")
    if isinstance(example_args, torch.Tensor):
        example_args = (example_args,)
    if not isinstance(example_args, (tuple, list)):
        raise CaptureError(model, "example_args must be a tuple of the forward's arguments, got "
                           f"{type(example_args).__name__}")
    _refuse_parameter_hooks(module, model)
    if not any(p.requires_grad for p in module.parameters()):
        # as a model whose parameters are all frozen is refused (_loss_check); an input that
        # requires grad made a loss that did, and a run trained nothing, "compared 0"
        raise CaptureError(model, "the loss does not depend on any trainable parameter (the "
                           "model has none that requires grad)")
    scopes: list[str] = []
    start = time.perf_counter()
    with _TRACE_LOCK, _eager_composites(), _fresh_fake_dispatch_cache(), \
            _quiet_fake_tensor_log(), fx_traceback.preserve_node_meta(), \
            _scope_hooks(module, scopes), contextlib.ExitStack() as stack:
        handle = module.register_forward_hook(_loss_check(model))
        before = python_state(module)
        try:
            joint = _export(stack, module, tuple(example_args), model, scopes)
        finally:
            handle.remove()
        forward_changes = changed_since(before, module)
    drop_effect_tokens(model, joint.graph_module)
    refuse_value_dependent_backwards(model, joint.graph_module.graph, SCOPE_KEY)
    trace = _from_descriptors(model, joint.graph_module)
    _sum_tied_gradients(trace, module)
    _read_tied_parameters_once(trace, module)
    _unread_running_statistics(trace)
    _draw_in_memory_order(trace)
    _keep_dropout_masks(trace)
    _copy_small_saved_outputs(trace)
    _size_opaque_workspaces(trace)
    trace.forward_changes = forward_changes
    trace.capture_s = time.perf_counter() - start
    return trace


def _refuse_parameter_hooks(module: nn.Module, model: str) -> None:
    """A hook on a parameter's gradient (`param.register_hook`, gradient clipping or noise)
    runs in eager's `.grad` accumulation, outside the traced graph: the plan would train with
    other gradients than eager's, so it is refused."""
    for name, param in module.named_parameters():
        kinds = [kind for kind, hooks in (("register_hook", param._backward_hooks),
                                          ("register_post_accumulate_grad_hook",
                                           getattr(param, "_post_accumulate_grad_hooks", None)))
                 if hooks]
        if kinds:
            raise CaptureError(model, f"parameter '{name}' has a gradient hook ({kinds[0]}), "
                               "which the captured step would not run: remove it (clip or "
                               "change gradients in the forward or the loss instead)")


@contextlib.contextmanager
def _fresh_fake_dispatch_cache():
    """Fake tensors' process-wide dispatch cache emptied before the trace, as in the fresh
    process where the board captures: an op's outputs built from a cache entry do not alias as
    the op's first run made them (mkldnn_rnn_layer_backward gives an LSTM's two biases one
    gradient tensor; from the cache, two), so a second capture in one process differed from
    the first, and from the board's (lstm-lm: 26 nodes against 28, and `run` refused its own
    plan). Emptied, not switched off: within a trace it saves a quarter of the tracing time
    (gpt2-small 3.6 -> 2.8 s)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    FakeTensorMode.cache_clear()
    try:
        yield
    finally:
        FakeTensorMode.cache_clear()  # nor does a later trace find this one's entries


@contextlib.contextmanager
def _quiet_fake_tensor_log():
    """Fake tensors log the traceback of an op that fails on them (a shape error in the
    user's model: ~19 lines on stderr) before raising it; the CaptureError that follows says
    the op, the module and torch's message in one line, so that log is off while tracing."""
    log = logging.getLogger("torch._subclasses.fake_tensor")
    was_disabled, log.disabled = log.disabled, True
    try:
        yield
    finally:
        log.disabled = was_disabled


def _export(stack, module, args, model, scopes):
    from torch._functorch.aot_autograd import aot_export_joint_with_descriptors
    try:
        with warnings.catch_warnings():
            # AOTAutograd traces backward under anomaly mode, which warns "Error detected in
            # ..." with an empty forward traceback before a failing backward raises; the
            # CaptureError below says it in one line.
            warnings.filterwarnings("ignore", message="Error detected in")
            return aot_export_joint_with_descriptors(stack, module, args)
    except CaptureError:
        raise
    except USER_CODE_FAILURES as exc:  # anything torch cannot trace: say which op and where
        raise _explain(exc, model, scopes) from exc


# Ops torch tags dynamic_output_shape that users meet under another name: which layer it is,
# why its shape is not static, and what captures instead (docs/capture.md).
_DYNAMIC_SHAPE_OPS = {
    "_ctc_loss": "nn.CTCLoss (F.ctc_loss) cannot be captured: its output shape depends on the "
                 "data (the alignment table it keeps for backward is as long as the longest "
                 "target, a length read from the tensors, lists too), and a static training "
                 "graph cannot hold that; write the loss in plain tensor ops instead, as "
                 "the repository's examples/ctc_model.py does (the same loss, static shapes)",
}


def _explain(exc: BaseException, model: str, scopes: list[str]) -> CaptureError:
    from torch._subclasses import fake_tensor as ft
    func = getattr(exc, "func", None)
    op = str(func) if func is not None else None
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, ft.DataDependentOutputException):
        problem = ("it reads a tensor's value in Python (.item(), bool(), if/while on a tensor), "
                   "which a static training graph cannot capture")
        if _raised_in_distributions(exc):
            problem += (" (torch.distributions checks its arguments' values: build the "
                        "distribution with validate_args=False)")
    elif isinstance(exc, ft.DynamicOutputShapeException):
        packet = op.split(".")[1] if op and "." in op else ""  # aten._ctc_loss.Tensor
        problem = _DYNAMIC_SHAPE_OPS.get(packet, "its output shape depends on tensor values "
                                         "(e.g. nonzero, boolean masking)")
    if isinstance(exc, (ft.DataDependentOutputException, ft.DynamicOutputShapeException)):
        caller = _functional_that_raised(exc)
        if caller:  # the user wrote no such op: name the library call that runs it
            problem += f" (in torch.nn.functional.{caller}, which the model calls)"
    elif isinstance(exc, ft.UnsupportedOperatorException):
        problem = "it has no fake-tensor (meta) implementation, so it cannot be traced"
    elif "Please convert all Tensors to FakeTensors" in message:
        # torch's advice (allow_non_fake_inputs) is about its tracer, not the user's model
        found = re.search(r"Found in (aten\.[\w.]+)\(", message)
        op = op or (found.group(1) if found else None)
        problem = ("it reads a tensor that is neither a parameter, a buffer nor an example "
                   "argument (a plain attribute such as self.idx = torch.tensor(...), or a "
                   "global), which the captured graph cannot hold: register it with "
                   "self.register_buffer(name, tensor), or make it inside forward")
    elif "modified by an inplace operation" in message:
        # torch's hint points at a backtrace that anomaly mode would print; there is none
        problem = (f"{type(exc).__name__}: {message.split(' Hint:')[0]} Plain PyTorch's "
                   "backward fails the same way: make that in-place op (x.add_(), x += y, "
                   "inplace=True) out-of-place")
    elif isinstance(exc, SystemExit):  # the model's forward called sys.exit
        problem = raised(exc)
    else:
        problem = f"{type(exc).__name__}: {message}"
        if op is None:
            op = _op_from_message(message)
    return CaptureError(model, problem, op, scopes[-1] if scopes else None)


def _sum_tied_gradients(trace: JointTrace, module: nn.Module) -> None:
    """One gradient per parameter object, as eager's `.grad` holds it.

    AOTAutograd lists a parameter shared by two modules (tied embeddings: GPT-2's `wte` and
    `lm_head`) once per name, and returns one partial gradient per name; eager autograd adds the
    partial gradients up, in the order backward produces them, into the one `.grad`. We add the
    same `add` ops to the graph (right after each partial gradient, so the sum lives no longer
    than eager's), and the sum becomes the gradient of the parameter's first name."""
    params = dict(module.named_parameters(remove_duplicate=False))
    graph = trace.graph_module.graph
    order = {node.name: k for k, node in enumerate(graph.nodes)}
    by_param: dict[int, list[str]] = {}
    for value, name in trace.grads.items():
        by_param.setdefault(id(params[name]), []).append(value)
    output = next(n for n in graph.nodes if n.op == "output")
    first_name = {id(p): name for name, p in reversed(list(params.items()))}
    for key, values in by_param.items():
        if len(values) < 2:
            # one name reads it (BERT's MLM decoder reads the bias it shares with its head):
            # its gradient is the first name's all the same, the name updated and saved
            trace.grads[values[0]] = first_name[key]
            continue
        values.sort(key=order.__getitem__)
        total = trace.node(values[0])
        for value in values[1:]:
            part = trace.node(value)
            with graph.inserting_after(part):
                added = graph.call_function(torch.ops.aten.add.Tensor, (total, part))
            added.meta.update(val=total.meta["val"] + part.meta["val"],
                              partitioner_tag="is_backward", is_gradient_acc=True,
                              custom=part.meta.get("custom"))
            total = added
        for value in values:
            output.replace_input_with(trace.node(value), total)
            del trace.grads[value]
        trace.grads[total.name] = first_name[key]
    trace.graph_changed()


def _read_tied_parameters_once(trace: JointTrace, module: nn.Module) -> None:
    """Every reader of a tied parameter reads its first name's placeholder.

    AOTAutograd gives a parameter shared by two modules one placeholder per name (GPT-2's
    `lm_head.weight` beside `transformer.wte.weight`). A parameter is one tensor to load, page
    and update: with parameters homed on flash its param node loads the first name's
    placeholder only, and `lm_head` read the other, left unbound ("mat2 must be a matrix").
    The other placeholders stay in the signature, read by nothing."""
    params = dict(module.named_parameters(remove_duplicate=False))
    first: dict[int, torch.fx.Node] = {}
    changed = False
    for placeholder, name in trace.params.items():
        node = trace.node(placeholder)
        kept = first.setdefault(id(params[name]), node)
        if kept is not node and node.users:
            node.replace_all_uses_with(kept)
            changed = True
    if changed:
        trace.graph_changed()


def _draw_in_memory_order(trace: JointTrace) -> None:
    """Dropout's noise drawn in the order eager draws it, on a non-contiguous input too.

    Eager CPU dropout fills `empty_like(input)`, which keeps the input's strides, in place, and
    `bernoulli_` fills in memory order; functionalized, it is `bernoulli(empty_like(input))`,
    whose output is contiguous, filled in logical order. On a transposed input (an
    nn.TransformerEncoderLayer with batch_first=True drops out attention's transposed output)
    each element got another draw than eager's: other losses and gradients. Drawing into the
    permutation whose logical order is the input's memory order, then permuting back, gives
    every element eager's draw."""
    graph = trace.graph_module.graph
    changed = False
    for node in list(graph.nodes):
        if node.target is not torch.ops.aten.bernoulli.p:
            continue
        like = node.args[0].meta.get("val")
        if like is None or like.is_contiguous() or like.dim() < 2:
            continue
        perm = sorted(range(like.dim()), key=lambda d: -like.stride(d))
        inverse = sorted(range(like.dim()), key=perm.__getitem__)
        with graph.inserting_before(node):
            ordered = graph.call_function(torch.ops.aten.permute.default, (node.args[0], perm))
        ordered.meta.update(node.meta, val=like.permute(perm))
        node.args = (ordered, *node.args[1:])
        drawn = like.permute(perm).contiguous()
        node.meta["val"] = drawn
        with graph.inserting_after(node):
            back = graph.call_function(torch.ops.aten.permute.default, (node, inverse))
        back.meta.update(node.meta, val=drawn.permute(inverse))
        node.replace_all_uses_with(back, delete_user_cb=lambda user: user is not back)
        changed = True
    if changed:
        trace.graph_changed()


def _unread_running_statistics(trace: JointTrace) -> None:
    """Pass None for the running statistics to a batch norm's backward in training mode.

    The joint graph hands `native_batch_norm_backward` the updated running mean and variance,
    but with `train` true its kernels (CPU and CUDA) read only the saved mean and inverse
    deviation; the schema lets both be None. Left in, they were values backward "reads": each
    got a clone for backward (_copy_small_saved_outputs), 40 clones a step on ResNet-18, kept
    from the forward to the backward for nothing. Eval-mode batch norm (train false) reads them
    and keeps them."""
    backward = torch.ops.aten.native_batch_norm_backward.default
    changed = False
    for node in trace.compute_nodes:
        # (grad_out, input, weight, running_mean, running_var, save_mean, save_invstd, train,
        # eps, output_mask)
        if node.target is not backward or len(node.args) < 8 or node.args[7] is not True:
            continue
        if node.args[3] is None and node.args[4] is None:
            continue
        node.args = node.args[:3] + (None, None) + node.args[5:]
        changed = True
    if changed:
        trace.graph_changed()


def _keep_dropout_masks(trace: JointTrace) -> None:
    """Backward keeps dropout's 1-byte mask, not eager's 4-byte float noise.

    Eager CPU dropout (see _eager_composites) draws `noise = bernoulli(q)` (exactly 0.0 or 1.0),
    scales it `noise / q` and keeps the scaled noise for backward's `grad * scaled`. The
    forward now also takes `mask = noise -> bool`, and backward reads `mask`, rebuilding
    the scaled noise just before its use: `mask -> noise's dtype` gives the same 0.0 / 1.0,
    divided by the same q with the same op, so the same bits, and `grad * scaled` is eager's
    to the bit. Same draws (the bernoulli is untouched); backward holds a quarter of the bytes
    from forward to backward and the float only transiently, in the node that reads it.
    The conversions are the fast ones on CPU (ATen vectorises float -> bool and uint8 ->
    float, not `ne` or bool -> float: 10x and 7x slower at BERT-mini's shapes), so the mask
    is read back as the uint8 view of its bytes (a bool is one byte, 0 or 1)."""
    aten = torch.ops.aten
    graph = trace.graph_module.graph
    changed = False
    for scaled in list(graph.nodes):
        if scaled.target is not aten.div.Scalar or _is_backward(scaled):
            continue
        noise, keep = scaled.args
        if getattr(noise, "target", None) is not aten.bernoulli.p or noise.args[1] != keep:
            continue
        readers = [u for u in scaled.users if _is_backward(u)]
        if not readers:
            continue
        with graph.inserting_after(noise):
            mask = graph.call_function(aten._to_copy.default, (noise,), {"dtype": torch.bool})
        _meta_like(mask, noise, noise.meta["val"] != 0)
        for reader in readers:
            with graph.inserting_before(reader):
                as_bytes = graph.call_function(aten.view.dtype, (mask, torch.uint8))
                back = graph.call_function(aten._to_copy.default, (as_bytes,),
                                           {"dtype": noise.meta["val"].dtype})
                rescaled = graph.call_function(aten.div.Scalar, (back, keep))
            _meta_like(as_bytes, reader, mask.meta["val"].view(torch.uint8))
            for node in (back, rescaled):
                _meta_like(node, reader, scaled.meta["val"].clone())
            reader.replace_input_with(scaled, rescaled)
        changed = True
    if changed:
        trace.graph_changed()


# A saved output this many times smaller than its op's largest output gets a copy of its own.
SMALL_SAVED_OUTPUT_RATIO = 8


def _copy_small_saved_outputs(trace: JointTrace) -> None:
    """Give backward its own copy of a forward op's small saved outputs (batch norm's and layer
    norm's mean and inverse deviation).

    A planner node's outputs are held together, so backward reading a 1 KiB statistic of a batch
    norm would keep the norm's 16 MiB output alive as well, until backward: refinement could not
    split a norm from the add and relu after it without that. A clone right after the op (its
    own node once refined; exact: a copy) is what backward reads instead, and the norm's output
    goes when the forward is done with it, as in eager PyTorch."""
    graph = trace.graph_module.graph
    changed = False
    for node in list(graph.nodes):
        if node.op != "call_function" or _is_backward(node):
            continue
        items = [u for u in node.users if u.target is operator.getitem]
        sizes = {item: _nbytes(item.meta.get("val")) for item in items}
        if len(items) < 2 or not max(sizes.values()):
            continue
        for item in items:
            readers = [u for u in item.users if u.op == "call_function" and _is_backward(u)]
            # Size 0: not known yet (oneDNN's LSTM workspace, sized below): left as it is.
            if not readers or not sizes[item] or \
                    sizes[item] * SMALL_SAVED_OUTPUT_RATIO > max(sizes.values()):
                continue
            with graph.inserting_after(item):
                copy = graph.call_function(torch.ops.aten.clone.default, (item,))
            _meta_like(copy, item, item.meta["val"].clone())
            for reader in readers:
                reader.replace_input_with(item, copy)
            changed = True
    if changed:
        trace.graph_changed()


def _meta_like(node: fx.Node, like: fx.Node, val: Any) -> None:
    """An inserted node's metadata: `like`'s (its pass, scope, stack trace), its own value."""
    node.meta.update({k: v for k, v in like.meta.items() if k != "val"}, val=val)


def _is_backward(node: fx.Node) -> bool:
    return node.meta.get("partitioner_tag") == "is_backward"


def _nbytes(value: Any) -> int:
    if not isinstance(value, torch.Tensor):
        return 0
    return value.numel() * value.element_size()


# Ops whose result depends on autograd's grad mode (the kernel asks it, not an argument): oneDNN's
# LSTM layer returns its workspace, which backward reads, only with grad mode on. The executor
# runs these ops with grad mode on (their inputs never require grad there, so nothing records).
GRAD_MODE_OPS = ("mkldnn_rnn_layer",)


def _size_opaque_workspaces(trace: JointTrace) -> None:
    """Give the oneDNN LSTM workspace its real size. Its meta kernel says 0 bytes, but eager
    keeps it for backward (86 KiB for 8 steps of a batch-2, 64-wide layer): the only way to
    know how big oneDNN makes it is to ask oneDNN, once per shape, on zeros of those shapes."""
    sizes: dict[str, Any] = {}
    for node in trace.compute_nodes:
        if node.target is not operator.getitem or node.args[1] != 3:
            continue
        parent = node.args[0]
        if getattr(parent.target, "overloadpacket", None) is not torch.ops.aten.mkldnn_rnn_layer:
            continue
        key = str(fx.node.map_aggregate(parent.args, _shape_of))
        if key not in sizes:
            real = fx.node.map_arg(parent.args, _zeros_like_val)
            with torch.enable_grad():
                workspace = parent.target(*real)[3]
            sizes[key] = (workspace.shape, workspace.dtype)
        shape, dtype = sizes[key]
        node.meta["val"] = torch.empty(shape, dtype=dtype, device="meta")


def _shape_of(value):
    if isinstance(value, fx.Node):
        val = value.meta.get("val")
        return (tuple(val.shape), str(val.dtype)) if isinstance(val, torch.Tensor) else None
    return value


def _zeros_like_val(node: fx.Node):
    val = node.meta["val"]
    return torch.zeros(tuple(val.shape), dtype=val.dtype)


def _raised_in_distributions(exc: BaseException) -> bool:
    """Whether torch.distributions' argument validation (a value check) led to the error."""
    tb = exc.__traceback__
    while tb is not None:
        if "/torch/distributions/" in tb.tb_frame.f_code.co_filename.replace("\\", "/"):
            return True
        tb = tb.tb_next
    return False


def _functional_that_raised(exc: BaseException) -> str | None:
    """The torch.nn.functional function the model called on the way to the error (the first
    such frame): gaussian_nll_loss checks its variance with torch.any, ctc_loss's kernel sizes
    its result from the target lengths' values."""
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_filename.replace("\\", "/").endswith("/torch/nn/functional.py"):
            return code.co_name
        tb = tb.tb_next
    return None


def _op_from_message(message: str) -> str | None:
    # e.g. ".numpy() is not supported for tensor subclasses."
    first = message.split()[0] if message.split() else ""
    return first if first.endswith("()") else None


def _loss_check(model: str):
    def check(_module, _args, out):
        if not isinstance(out, torch.Tensor):
            raise CaptureError(model, "the forward must return the scalar training loss (a "
                               f"tensor), it returned {type(out).__name__}")
        if out.numel() != 1 or out.dim() > 1:
            raise CaptureError(model, "the forward must return the scalar training loss, it "
                               f"returned a tensor of shape {tuple(out.shape)}")
        if not out.is_floating_point():
            raise CaptureError(model, f"the loss must be a floating-point scalar, got {out.dtype}")
        if not out.requires_grad:
            raise CaptureError(model, "the loss does not depend on any trainable parameter")
    return check


# Composite ops that PyTorch's Python dispatcher replaces with decompositions while tracing, but
# that eager PyTorch runs as their C++ composites: dropout (see _eager_composites) and the
# recurrent layers (the C++ LSTM/GRU precomputes, saves and accumulates differently from the
# Python decomposition: other memory, other bits, other random draws for inter-layer dropout).
# Upsampling (F.interpolate, nn.Upsample) has Python decompositions into index and arithmetic
# ops that round differently from eager's C++ kernels (a U-Net's bilinear upsampling: gradients
# 1.4e-8 off eager's, bicubic 7.5e-9).
_UPSAMPLING = tuple(f"{op}.{overload}" for op in (
    "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "_upsample_nearest_exact1d",
    "_upsample_nearest_exact2d", "_upsample_nearest_exact3d") for overload in ("default", "vec")) + (
    "upsample_linear1d.vec", "upsample_bilinear2d.default", "upsample_bilinear2d.vec",
    "upsample_trilinear3d.vec", "upsample_bicubic2d.default", "upsample_bicubic2d.vec",
    "_upsample_bilinear2d_aa.vec", "_upsample_bicubic2d_aa.vec")
_EAGER_COMPOSITES = ("dropout.default", "lstm.input", "lstm.data", "gru.input", "gru.data",
                     "rnn_tanh.input", "rnn_tanh.data", "rnn_relu.input", "rnn_relu.data",
                     *_UPSAMPLING)


@contextlib.contextmanager
def _eager_composites():
    """Trace dropout, recurrent layers and upsampling as eager PyTorch runs them on this machine.

    While tracing, PyTorch's Python dispatcher replaces `aten.dropout` with `native_dropout`
    (which keeps a 1-byte mask). Eager CPU runs the C++ composite instead: a float noise tensor
    from `bernoulli_`, scaled, multiplied in, and kept for backward (4 bytes per element); on
    CUDA the C++ composite itself picks `native_dropout`. Likewise `aten.lstm` / `aten.gru`:
    eager runs the C++ composite op by op. Setting the Python overrides aside for the trace
    gives the graph eager's ops, memory and random-number draws.
    """
    saved = []
    for name in _EAGER_COMPOSITES:
        packet, _, overload = name.partition(".")
        op = getattr(getattr(torch.ops.aten, packet), overload)
        kernels = {key: op.py_kernels.pop(key) for key in list(op.py_kernels)
                   if key in (DispatchKey.Autograd, DispatchKey.CompositeImplicitAutograd)}
        getattr(op, "_dispatch_cache", {}).clear()
        saved.append((op, kernels))
    try:
        yield
    finally:
        for op, kernels in saved:
            op.py_kernels.update(kernels)
            getattr(op, "_dispatch_cache", {}).clear()


@contextlib.contextmanager
def _scope_hooks(module: nn.Module, scopes: list[str]):
    """Label every traced op with the dotted name of the innermost module running it."""
    saved: list[Any] = []

    def enter(path):
        def hook(_module, _args):
            saved.append(fx_traceback.current_meta.get("custom"))
            custom = dict(saved[-1] or {})
            custom[SCOPE_KEY] = path
            fx_traceback.current_meta["custom"] = custom
            scopes.append(path)
        return hook

    def leave(_module, _args, _out):
        previous = saved.pop()
        scopes.pop()
        if previous is None:
            fx_traceback.current_meta.pop("custom", None)
        else:
            fx_traceback.current_meta["custom"] = previous

    handles = []
    for path, sub in module.named_modules():
        if path:
            handles.append(sub.register_forward_pre_hook(enter(path)))
            handles.append(sub.register_forward_hook(leave))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _copy_for_second_parameter(gm: fx.GraphModule, output: fx.Node, position: int) -> fx.Node:
    """A copy of the output at `position` as the second parameter's gradient, as eager's
    AccumulateGrad copies a gradient another parameter still holds."""
    values = list(output.args[0])
    value = values[position]
    with gm.graph.inserting_after(value):
        copy = gm.graph.call_function(torch.ops.aten.clone.default, (value,))
    copy.meta.update(val=value.meta["val"].clone(), partitioner_tag="is_backward",
                     is_gradient_acc=True, custom=value.meta.get("custom"))
    values[position] = copy
    output.args = (type(output.args[0])(values),)
    return copy


def _refuse_sparse_gradient(model: str, grad: fx.Node, param: str) -> None:
    """A sparse gradient (nn.Embedding or EmbeddingBag with sparse=True) has no storage the
    executor can account, page or hand the optimizer: the job failed at its first node with
    'Cannot access storage of SparseTensorImpl'."""
    val = grad.meta.get("val")
    if isinstance(val, torch.Tensor) and val.layout != torch.strided:
        raise CaptureError(model, f"parameter '{param}' gets a sparse gradient ({val.layout}, "
                           "nn.Embedding or EmbeddingBag with sparse=True), which the executor "
                           "does not run: build it with sparse=False")


def _from_descriptors(model: str, gm: fx.GraphModule) -> JointTrace:
    from torch._functorch._aot_autograd import descriptors as d
    params, buffers, user_inputs, tangent = {}, {}, {}, None
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        desc = node.meta.get("desc")
        if isinstance(desc, d.ParamAOTInput):
            params[node.name] = desc.target
        elif isinstance(desc, d.BufferAOTInput):
            buffers[node.name] = desc.target
        elif isinstance(desc, d.PlainAOTInput):
            user_inputs[node.name] = desc.idx
        elif isinstance(desc, d.TangentAOTInput):
            tangent = node.name
        else:
            raise CaptureError(model, f"unexpected graph input {node.name} ({desc!r})")
    output = next(n for n in gm.graph.nodes if n.op == "output")
    loss, grads, buffer_updates, input_updates = None, {}, {}, {}
    for position, (value, desc) in enumerate(zip(output.args[0], output.meta.get("desc") or [])):
        if value is None or desc is None:
            continue
        if isinstance(desc, d.PlainAOTOutput):
            loss = value.name
        elif isinstance(desc, d.GradAOTOutput) and isinstance(desc.grad_of, d.ParamAOTInput):
            _refuse_sparse_gradient(model, value, desc.grad_of.target)
            if value.name in grads:  # one value is two parameters' gradient (an LSTM's biases)
                value = _copy_for_second_parameter(gm, output, position)
            grads[value.name] = desc.grad_of.target
        elif isinstance(desc, d.InputMutationAOTOutput):
            target = desc.mutated_input
            if isinstance(target, d.BufferAOTInput):
                buffer_updates[value.name] = target.target
            elif isinstance(target, d.PlainAOTInput):
                input_updates[value.name] = target.idx
            elif isinstance(target, d.ParamAOTInput):
                raise CaptureError(model, f"the forward changes parameter '{target.target}' in "
                                   "place (nn.Embedding with max_norm renormalises its weight "
                                   "so, as do an EMA teacher's update and weight clipping), "
                                   "which a training graph cannot express: change parameters "
                                   "outside forward (e.g. renormalise after the optimizer "
                                   "step), or hold what the forward updates itself (an EMA "
                                   "copy) as buffers (register_buffer), which it may update in "
                                   "place")
            else:
                raise CaptureError(model, f"the forward mutates {target!r} in place, which a "
                                   "training graph cannot express")
    if loss is None or tangent is None:
        raise CaptureError(model, "the traced graph has no loss output")
    return JointTrace(model, gm, params, buffers, user_inputs, tangent, loss, grads,
                      buffer_updates, input_updates)
