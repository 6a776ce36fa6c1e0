"""Read an ONNX model's forward graph (shapes from onnx's shape inference) and add a backward.

ONNX holds no backward, so the graph is for planning only (`planning_only: true`): the executor
cannot run it. Forward ops are grouped into layers (a heavy op such as Conv or MatMul starts a
group; the ops after it join it). The backward is the mirror image, under the usual assumptions:
a layer's backward reads its inputs and its outputs (what conv/matmul and activations save),
produces gradients the size of its activation inputs, recomputes what it needs inside the layer
(its workspace) and costs twice the layer's forward. A loss node reads the model's outputs.
An input's symbolic leading dimension (the batch) is set to `--batch` (default 1), its other
symbolic dimensions (a sequence length, usually) to `--seq`, which such a file needs; a file
whose inputs name no symbolic dimension fixes its batch, and the graph says that one. The
dimensions a value inside the graph leaves to the data (NonZero's count) take `--batch` too,
and onnx_warnings says so, as it says which values shape inference could not size at all.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from edge_remat_agent.capture.assemble import saved_bytes
from edge_remat_agent.capture.estimate import DEFAULT_RATES, round_time
from edge_remat_agent.capture.optimizer import OPTIMIZERS
from edge_remat_agent.formats import FormatError, Graph, Node
from edge_remat_agent.formats.errors import unreadable_file
from edge_remat_agent.formats.graph import check_order

from ..errors import UserError

HEAVY_OPS = {"Conv", "ConvTranspose", "ConvInteger", "Gemm", "MatMul", "MatMulInteger",
             "Einsum", "Attention", "MultiHeadAttention", "LSTM", "GRU", "RNN"}
ALIAS_OPS = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"}  # no new storage
FLOAT_TYPES = {1, 10, 11, 16}  # FLOAT, FLOAT16, DOUBLE, BFLOAT16: trainable initializers
DTYPE_NAMES = {1: "float32", 10: "float16", 11: "float64", 16: "bfloat16"}
# BatchNormalization's running mean and variance (inputs 3 and 4): buffers, never trained
BUFFER_INPUTS = {"BatchNormalization": (3, 4)}


@dataclass
class _Layer:
    ops: list = field(default_factory=list)  # onnx NodeProto, in order


def graph_from_onnx(path: str | Path, batch: int | None = None, optimizer: str = "sgd",
                    max_nodes: int = 200, seq: int | None = None) -> Graph:
    start = time.perf_counter()
    source = str(path)
    model = _load(source)
    g = model.graph
    _check_values(g, source)
    initializers = {t.name: t for t in g.initializer}
    dims, seq_dims = _input_dims(g, initializers, batch or 1, seq, source)
    sizes, shapes, assumed = _values(g, dims, batch or 1)
    ops = [n for n in g.node if n.op_type != "Constant"]
    constants = {out for n in g.node if n.op_type == "Constant" for out in n.output}
    if not ops:
        raise FormatError(source, "graph.node", "at least one operator")
    if optimizer not in OPTIMIZERS:
        raise FormatError("command line", "--optimizer", " | ".join(sorted(OPTIMIZERS)), optimizer)
    root = _storage_roots(ops)
    fine = _layers(ops)
    layers = _merge_to_fit(fine, max_nodes)
    layer_of = {out: i for i, layer in enumerate(layers) for op in layer.ops for out in op.output}
    # What a layer's backward reads (its inputs and outputs) is kept by its forward, even where
    # --max-nodes merged it with its neighbours: a merged node's outputs include the values
    # passed between the layers it holds. Merging kept only what left the merged node, so the
    # activations its backward needs vanished from the graph (small_cnn, --max-nodes 5: saved
    # 80 bytes of 327,824, plain peak 293 KB of 687 KB).
    boundaries = _read_by_another_layer(fine)
    graph_outputs = {o.name for o in g.output}
    missing: set[str] = set()

    def nbytes(name: str) -> int:
        if name not in sizes:
            missing.add(name)
        return sizes.get(name, 0)

    nodes: list[Node] = []
    forward_outs: list[set[str]] = []
    for i, layer in enumerate(layers):
        produced = {out for op in layer.ops for out in op.output if out}
        outs = produced & (boundaries | graph_outputs)
        own = {root.get(n, n) for n in outs if layer_of.get(root.get(n, n)) == i}
        out_bytes = sum(nbytes(r) for r in own)
        # (an alias of an initializer or of a graph input belongs to no layer: QA, the
        # exporter's Identity of a weight shared by two LayerNorms was a KeyError)
        inputs = sorted({layer_of[r] for op in layer.ops for n in op.input
                         if (r := root.get(n, n)) in layer_of and layer_of[r] != i})
        flops, moved = _layer_work(layer, sizes, shapes)
        peak = _transient_peak(layer, root, own, nbytes)
        nodes.append(Node(id=i, name=f"{layer.ops[0].name or layer.ops[0].op_type}",
                          kind="forward", op=layer.ops[0].op_type, inputs=inputs,
                          out_bytes=out_bytes, workspace_bytes=max(0, peak - out_bytes),
                          time_s=round_time(_time(flops, moved, len(layer.ops))),
                          signature=f"onnx:{layer.ops[0].op_type}:{flops}:{moved}",
                          attrs={"onnx_nodes": [op.name or op.op_type for op in layer.ops],
                                 "flops": flops, "bytes_moved": moved}))
        forward_outs.append(own)
    _add_loss_and_backward(nodes, layers, layer_of, root, forward_outs, graph_outputs,
                           initializers, constants, nbytes)
    buffers = _buffers(ops, root)
    trained = [t for t in initializers.values()
               if t.data_type in FLOAT_TYPES and t.name not in buffers]
    trainable = sum(nbytes(t.name) for t in trained)
    opt = OPTIMIZERS[optimizer]
    elements = sum(math.prod(t.dims) for t in trained)
    largest = max((nbytes(t.name) for t in trained), default=0)
    nodes.append(_update_node(len(nodes), opt, elements, largest))
    fixed = {"parameters": trainable, "gradients": trainable,
             "optimizer_state": opt.state_copies * trainable,
             # running statistics, and integer tensors (shapes, indices) kept in the file
             "buffers": sum(nbytes(t.name) for t in initializers.values()) - trainable,
             "inputs": sum(nbytes(i.name) for i in g.input if i.name not in initializers)}
    fixed["total"] = sum(fixed.values())
    graph = Graph(nodes=nodes, name=Path(source).stem, fixed_bytes=fixed["total"],
                  batch=_file_batch(g, initializers, shapes, dims) or batch or 1,
                  dtype=_dtype(trained, nbytes), cost_source="estimate", planning_only=True)
    check_order(graph, source)
    graph.capture = {
        "tool": f"onnx {_onnx_version()} (shape inference)", "model": source,
        "source": {"onnx": source, "batch": batch, "seq": seq}, "optimizer": optimizer,
        "opset": [f"{o.domain or 'ai.onnx'}:{o.version}" for o in model.opset_import],
        "captured_nodes": len(ops), "planner_nodes": len(nodes), "max_nodes": max_nodes,
        "assumed_dims": {**dims, **assumed}, "seq_dims": seq_dims, "data_dims": sorted(assumed),
        "unknown_shapes": sorted(missing),
        "unsized_ops": _makers(ops, missing),
        "saved_bytes": saved_bytes(nodes), "fixed": fixed,
        "estimate": DEFAULT_RATES.to_dict(),
        "capture_s": round(time.perf_counter() - start, 4),
    }
    return graph


def _check_values(g, source: str) -> None:
    """Every value an op reads is a graph input, an initializer, a Constant's or an earlier op's
    output, and each is made once (ONNX lists nodes in topological order): a file out of
    order was an internal error (KeyError), and one whose op read an undefined value or whose
    ops formed a cycle was planned without a word."""
    made = {value.name: "a graph input" for value in g.input}
    for t in g.initializer:
        made[t.name] = "an initializer"
    for k, op in enumerate(g.node):  # a Constant has no inputs: wherever it is, it can come first
        if op.op_type == "Constant":
            made.update((out, f"graph.node[{k}] ({op.name or op.op_type})") for out in op.output)
    for k, op in enumerate(g.node):
        where = f"graph.node[{k}] ({op.name or op.op_type})"
        for name in op.input:
            if name and name not in made:  # "" is an optional input left out
                raise FormatError(source, f"graph.node[{k}].input", "a graph input, an "
                                  "initializer or an earlier node's output (ONNX lists nodes "
                                  f"in topological order) for {where}", name)
        if op.op_type == "Constant":
            continue
        for name in op.output:
            if name and name in made:
                raise FormatError(source, f"graph.node[{k}].output", "names no other value has "
                                  f"(it is {made[name]}'s too)", name)
            if name:
                made[name] = where


def onnx_warnings(graph: Graph) -> list[str]:
    """What the import guessed or could not size, and --seq given to a file without a
    dimension for it: a line each (QA: a contrib op's values were planned as 0 bytes, and a
    sequence length taken as the batch, without a word)."""
    capture, lines = graph.capture or {}, []
    source = capture.get("model", "the file")
    if capture.get("unknown_shapes"):
        lines.append(
            f"onnx's shape inference could not size {len(capture['unknown_shapes'])} values "
            f"of {source} (made by {', '.join(capture.get('unsized_ops') or ['?'])}): they "
            "count 0 bytes, so plans of this graph hold less than the model needs")
    data = capture.get("data_dims") or []
    if data:
        taken = capture["assumed_dims"][data[0]]
        lines.append(f"{source} leaves {len(data)} dimensions to the data "
                     f"({', '.join(data[:4])}{', ...' if len(data) > 4 else ''}): each is "
                     f"taken as {taken} (--batch), a guess")
    if (capture.get("source") or {}).get("seq") is not None and not capture.get("seq_dims"):
        lines.append(f"--seq has no effect: {source} fixes every input dimension but the "
                     "leading one (the batch)")
    return lines


def _input_dims(g, initializers, batch: int, seq: int | None, source: str
                ) -> tuple[dict[str, int], list[str]]:
    """The value of each symbolic dimension of the graph's inputs: --batch for a leading one,
    --seq for the others (a file that has such a one needs it); and those that took --seq."""
    dims: dict[str, int] = {}
    seq_dims: list[str] = []
    for value in g.input:
        if value.name in initializers or not value.type.tensor_type.HasField("shape"):
            continue
        for axis, d in enumerate(value.type.tensor_type.shape.dim):
            if d.HasField("dim_value") and d.dim_value > 0:
                continue
            name = _dim_name(value.name, axis, d)
            if axis == 0 or name in dims:
                dims.setdefault(name, batch)
            elif seq is None:
                raise UserError(f"{source}: input {value.name!r} leaves its dimension {name!r} "
                                f"(axis {axis}) open: give --seq N for it (--batch sets the "
                                "leading one)")
            else:
                dims[name] = seq
                seq_dims.append(name)
    return dims, seq_dims


def _buffers(ops, root: dict[str, str]) -> set[str]:
    """The initializers that ops read as running statistics (BatchNormalization's)."""
    return {root.get(op.input[k], op.input[k]) for op in ops
            for k in BUFFER_INPUTS.get(op.op_type, ()) if k < len(op.input) and op.input[k]}


def _dtype(trained, nbytes) -> str:
    """The floating type holding most of the trained bytes (float32 where none is)."""
    held: dict[str, int] = {}
    for t in trained:
        name = DTYPE_NAMES.get(t.data_type, "float32")
        held[name] = held.get(name, 0) + nbytes(t.name)
    return max(held, key=held.get) if held else "float32"


def _makers(ops, values: set[str]) -> list[str]:
    """The op types (with their domain) that made `values`."""
    return sorted({f"{op.domain + '.' if op.domain else ''}{op.op_type}" for op in ops
                   if any(out in values for out in op.output)})


def _file_batch(g, initializers, shapes, dims) -> int | None:
    """The batch the file itself fixes: the first input's leading dimension, where no input
    dimension is symbolic (those took --batch and --seq; dimensions left to the data inside
    the graph do not count). A file exported without a dynamic batch axis sized every tensor
    at its own batch, so --batch does not change it (it was reported as the batch)."""
    if dims:
        return None
    for value in g.input:
        dims = shapes.get(value.name)
        if value.name not in initializers and dims:
            return dims[0]
    return None


def _load(source: str):
    import onnx
    if Path(source).is_file() and Path(source).stat().st_size == 0:
        # protobuf reads it as a model without operators, and it was said to lack one (QA)
        raise FormatError(source, "<file>", "an ONNX model", "an empty file")
    try:
        model = onnx.load(source)
    except OSError as exc:  # missing, a folder: as every file read (not onnx's exception)
        raise unreadable_file(source, exc, "ONNX file") from None
    except Exception as exc:
        # on one line: protobuf's parse error spans two (QA)
        said = " ".join(str(exc).split())
        raise FormatError(source, "<file>", f"an ONNX model ({type(exc).__name__}: {said})") \
            from exc
    try:
        return onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception as exc:
        raise FormatError(source, "graph", f"a model onnx's shape inference accepts ({exc})") \
            from exc


def _onnx_version() -> str:
    import onnx
    return onnx.__version__


def _values(g, dims: dict[str, int], batch: int
            ) -> tuple[dict[str, int], dict[str, list[int]], dict[str, int]]:
    """Bytes and shape of every value with a known type, the inputs' symbolic dimensions
    as `dims` gives them; and the other dimensions left open (to the data), each taken as
    `batch`."""
    from onnx import helper
    sizes: dict[str, int] = {}
    shapes: dict[str, list[int]] = {}
    assumed: dict[str, int] = {}
    for t in g.initializer:
        shapes[t.name] = list(t.dims)
        sizes[t.name] = math.prod(t.dims) * _itemsize(helper, t.data_type)
    for info in [*g.input, *g.value_info, *g.output]:
        tt = info.type.tensor_type
        if not tt.HasField("shape") or not tt.elem_type or info.name in sizes:
            continue
        shape = []
        for axis, d in enumerate(tt.shape.dim):
            if d.HasField("dim_value") and d.dim_value > 0:
                shape.append(d.dim_value)
                continue
            name = _dim_name(info.name, axis, d)
            if name not in dims:
                assumed[name] = batch
            shape.append(dims.get(name, batch))
        shapes[info.name] = shape
        sizes[info.name] = math.prod(shape) * _itemsize(helper, tt.elem_type)
    return sizes, shapes, assumed


def _dim_name(value: str, axis: int, dim) -> str:
    """An open dimension's name: its own (dim_param), else the value's and the axis."""
    return dim.dim_param or f"{value}[{axis}]"


def _itemsize(helper, elem_type: int) -> int:
    try:
        return helper.tensor_dtype_to_np_dtype(elem_type).itemsize
    except Exception:
        return 4


def _storage_roots(ops) -> dict[str, str]:
    """Value -> the value whose storage it shares (reshapes and friends allocate nothing)."""
    root: dict[str, str] = {}
    for op in ops:
        if op.op_type in ALIAS_OPS and op.input and op.output:
            root[op.output[0]] = root.get(op.input[0], op.input[0])
    return root


def _layers(ops) -> list[_Layer]:
    layers = [_Layer()]
    for op in ops:
        if op.op_type in HEAVY_OPS and any(o.op_type in HEAVY_OPS for o in layers[-1].ops):
            layers.append(_Layer())
        layers[-1].ops.append(op)
    return layers


def _read_by_another_layer(layers: list[_Layer]) -> set[str]:
    """The values some op reads in a layer other than the one whose op made them."""
    made_in = {out: i for i, layer in enumerate(layers) for op in layer.ops for out in op.output}
    return {name for j, layer in enumerate(layers) for op in layer.ops for name in op.input
            if name in made_in and made_in[name] != j}


def _merge_to_fit(layers: list[_Layer], max_nodes: int) -> list[_Layer]:
    budget = max(1, (max_nodes - 2) // 2)  # forward + backward per layer, a loss and an update
    if len(layers) <= budget:
        return layers
    size = math.ceil(len(layers) / budget)
    return [_Layer([op for layer in layers[k:k + size] for op in layer.ops])
            for k in range(0, len(layers), size)]


def _layer_work(layer: _Layer, sizes: dict[str, int], shapes: dict[str, list[int]]
                ) -> tuple[int, int]:
    """FLOPs (multiply-adds count two) and bytes read + written by a layer's ops."""
    flops = moved = 0
    for op in layer.ops:
        ins = [sizes.get(n, 0) for n in op.input if n]
        outs = [n for n in op.output if n]
        moved += 0 if op.op_type in ALIAS_OPS else sum(ins) + sum(sizes.get(n, 0) for n in outs)
        out_elems = sum(math.prod(shapes.get(n, [0])) for n in outs)
        a = shapes.get(op.input[0]) if op.input else None
        b = shapes.get(op.input[1]) if len(op.input) > 1 else None
        if op.op_type in ("Conv", "ConvInteger") and b:
            flops += 2 * out_elems * math.prod(b[1:])  # (input channels / groups) x kernel
        elif op.op_type == "ConvTranspose" and a and b:
            flops += 2 * math.prod(a) * math.prod(b[1:])  # each input x (outputs / groups) x kernel
        elif op.op_type in ("Gemm", "MatMul", "MatMulInteger") and a:
            trans_a = any(at.name == "transA" and at.i for at in op.attribute)
            flops += 2 * out_elems * (a[0] if trans_a and len(a) == 2 else a[-1])
        else:
            flops += out_elems
    return flops, moved


def _time(flops: int, moved: int, n_ops: int) -> float:
    r = DEFAULT_RATES
    return max(flops / r.flops_per_s, moved / r.bytes_per_s) + n_ops * r.op_overhead_s


def _transient_peak(layer: _Layer, root: dict[str, str], keep: set[str], nbytes) -> int:
    """Peak bytes of storages the layer allocates, op by op (kept outputs stay to the end)."""
    last_use: dict[str, int] = {}
    allocated_at: dict[str, int] = {}
    for k, op in enumerate(layer.ops):
        for out in op.output:
            if out and root.get(out, out) == out:
                allocated_at[out] = k
                last_use.setdefault(out, k)
        for name in op.input:
            r = root.get(name, name)
            if r in allocated_at:
                last_use[r] = k
    live = peak = 0
    for k in range(len(layer.ops)):
        live += sum(nbytes(r) for r, at in allocated_at.items() if at == k)
        peak = max(peak, live)
        live -= sum(nbytes(r) for r, end in last_use.items() if end == k and r not in keep)
    return peak


def _add_loss_and_backward(nodes, layers, layer_of, root, forward_outs, graph_outputs,
                           initializers, constants, nbytes) -> None:
    n = len(layers)
    out_layers = sorted({layer_of[root.get(o, o)] for o in graph_outputs
                         if root.get(o, o) in layer_of})
    loss_bytes = sum(nbytes(o) for o in graph_outputs)
    loss_id = n
    nodes.append(Node(id=loss_id, name="loss", kind="loss", op="loss (assumed)",
                      inputs=out_layers, out_bytes=loss_bytes, workspace_bytes=0,
                      time_s=round_time(_time(loss_bytes // 4 * 4, 2 * loss_bytes, 2)),
                      attrs={"assumed": "a loss over the model outputs whose backward reads "
                                        "a tensor of their size (e.g. softmax cross-entropy)"}))
    backward_of: dict[int, int] = {}
    consumers: dict[int, set[int]] = {i: set() for i in range(n)}
    for j, layer in enumerate(layers):
        for op in layer.ops:
            for name in op.input:
                i = layer_of.get(root.get(name, name))
                if i is not None and i != j:
                    consumers[i].add(j)
    for i in reversed(range(n)):
        layer, fwd = layers[i], nodes[i]
        act_inputs = {root.get(name, name) for op in layer.ops for name in op.input
                      if name and name not in initializers and name not in constants
                      and layer_of.get(root.get(name, name)) not in (None, i)}
        grads_in = [backward_of[j] for j in sorted(consumers[i])]
        inputs = set(grads_in) | set(fwd.inputs) | {i}
        if i in out_layers:
            inputs.add(loss_id)
        bid = len(nodes)
        backward_of[i] = bid
        nodes.append(Node(id=bid, name=f"{fwd.name}.backward", kind="backward",
                          op=f"{fwd.op}_backward", inputs=sorted(inputs),
                          out_bytes=sum(nbytes(r) for r in act_inputs),
                          workspace_bytes=fwd.workspace_bytes,
                          time_s=round_time(2 * fwd.time_s),
                          signature=f"{fwd.signature}:backward",
                          attrs={"forward": i, "flops": 2 * fwd.attrs["flops"]}))


def _update_node(index: int, opt, elements: int, largest: int) -> Node:
    r = DEFAULT_RATES
    flops, moved = opt.flops_per_element * elements, opt.tensors_moved * 4 * elements
    return Node(id=index, name="optimizer.step", kind="update", op=f"{opt.name}_step",
                inputs=[], out_bytes=0, workspace_bytes=opt.temp_copies * largest,
                time_s=round_time(max(flops / r.flops_per_s, moved / r.bytes_per_s)
                                  + r.op_overhead_s),
                attrs={"optimizer": opt.name, "flops": flops, "bytes_moved": moved})
