"""ONNX import: a forward graph with inferred shapes, a planned backward, planning only."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from edge_remat.cli import app
from edge_remat.importers.onnx_import import graph_from_onnx
from edge_remat.planner.build import plain_peak_bytes
from edge_remat_agent.formats import FormatError, load_graph

CHANNELS, CLASSES, SIDE = 8, 10, 16


@pytest.fixture(scope="module")
def small_cnn(tmp_path_factory):
    """conv-bn-relu, conv + skip + relu, pool, flatten, fc; the batch dimension is symbolic."""
    rng = np.random.default_rng(0)

    def param(name, *shape):
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)

    c = CHANNELS
    initializers = [param("w1", c, 3, 3, 3), param("scale", c), param("bias", c),
                    param("mean", c), numpy_helper.from_array(np.ones(c, np.float32), "var"),
                    param("w2", c, c, 3, 3), param("fc_w", CLASSES, c), param("fc_b", CLASSES)]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("BatchNormalization", ["c1", "scale", "bias", "mean", "var"], ["b1"],
                         name="bn1"),
        helper.make_node("Relu", ["b1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
        helper.make_node("Add", ["c2", "r1"], ["s2"], name="skip"),
        helper.make_node("Relu", ["s2"], ["r2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["p"], name="pool"),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["logits"], transB=1, name="fc"),
    ]
    graph = helper.make_graph(
        nodes, "small_cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, SIDE, SIDE])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", CLASSES])],
        initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    path = tmp_path_factory.mktemp("onnx") / "small_cnn.onnx"
    onnx.save(model, str(path))
    return path


def test_onnx_graph_has_forward_loss_backward_update_and_is_planning_only(small_cnn):
    graph = graph_from_onnx(small_cnn, batch=4)
    kinds = [n.kind for n in graph.nodes]
    assert graph.planning_only and graph.cost_source == "estimate"
    assert kinds.count("loss") == 1 and kinds[-1] == "update"
    assert kinds.count("backward") == kinds.count("forward") == 3  # a layer per conv / gemm
    assert graph.capture["assumed_dims"] == {"N": 4}
    assert graph.capture["captured_nodes"] == 9


def test_onnx_sizes_come_from_shape_inference(small_cnn):
    graph = graph_from_onnx(small_cnn, batch=4)
    conv1 = graph.nodes[0]
    activation = 4 * CHANNELS * SIDE * SIDE * 4  # float32 relu1 output, read by the next layer
    assert conv1.out_bytes == activation
    assert conv1.workspace_bytes >= activation  # conv and batch-norm outputs die inside
    assert graph.capture["saved_bytes"] >= activation
    params = (CHANNELS * 27 + 2 * CHANNELS + CHANNELS * CHANNELS * 9 + CLASSES * CHANNELS
              + CLASSES) * 4
    fixed = graph.capture["fixed"]
    assert fixed["parameters"] == params and fixed["optimizer_state"] == params
    # batch norm's running mean and variance are buffers, never trained (QA: they had
    # gradients and optimizer state)
    assert fixed["buffers"] == 2 * CHANNELS * 4
    assert fixed["inputs"] == 4 * 3 * SIDE * SIDE * 4
    # Activations scale with the batch, which replaced the symbolic dimension.
    assert graph_from_onnx(small_cnn, batch=8).capture["saved_bytes"] == \
        2 * graph.capture["saved_bytes"]


def test_backward_reads_its_layer_and_the_gradient_from_above(small_cnn):
    graph = graph_from_onnx(small_cnn, batch=2)
    by_name = {n.name: n for n in graph.nodes}
    back = by_name["conv2.backward"]
    assert {by_name["conv2"].id, by_name["conv1"].id, by_name["fc.backward"].id} <= \
        set(back.inputs)
    assert back.out_bytes == by_name["conv1"].out_bytes  # gradient of its activation input


def test_merged_layers_keep_what_their_backwards_read(small_cnn):
    """QA: with --max-nodes 5 the whole forward became one node whose output was the logits
    (80 bytes saved of 327,824), so the planner saw a plain peak of 293 KB where the unmerged
    graph's was 687 KB. A merged node keeps the values passed between the layers it holds."""
    whole = graph_from_onnx(small_cnn, batch=4)
    for max_nodes in (4, 5, 6):
        merged = graph_from_onnx(small_cnn, batch=4, max_nodes=max_nodes)
        assert len(merged.nodes) < len(whole.nodes)
        assert merged.capture["saved_bytes"] == whole.capture["saved_bytes"]
        # what the forward leaves for the backward is held at once, as without merging
        assert plain_peak_bytes(merged) >= merged.fixed_bytes + merged.capture["saved_bytes"]


def test_cli_imports_onnx_and_the_planner_accepts_it(small_cnn, tmp_path):
    out = tmp_path / "g.json"
    result = CliRunner().invoke(app, ["graph", "--onnx", str(small_cnn), "--batch", "4",
                                      "-o", str(out), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["planning_only"] is True
    assert summary["plain_peak_bytes"] == plain_peak_bytes(load_graph(out))
    result = CliRunner().invoke(app, ["plan", "--graph", str(out), "--budget", "1.0",
                                      "--solver", "heuristic:dtr", "--json"])
    assert result.exit_code == 0, result.output


def test_a_file_that_is_not_onnx_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a protobuf at all")
    with pytest.raises(FormatError, match="bad.onnx"):
        graph_from_onnx(bad)
    result = CliRunner().invoke(app, ["graph", "--onnx", str(bad)])
    assert result.exit_code == 2 and result.output.startswith("error:")
    # a JSON file given as ONNX: protobuf's two-line parse error, on one line (QA)
    plan_like = tmp_path / "plan.json"
    plan_like.write_text('{"format": "edge-remat/plan"}\n')
    result = CliRunner().invoke(app, ["graph", "--onnx", str(plan_like)])
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    result = CliRunner().invoke(app, ["graph"])
    assert result.exit_code == 2 and "--model/--onnx" in result.output
    empty = tmp_path / "empty.onnx"  # QA: said to lack an operator, as if it were a model
    empty.write_bytes(b"")
    result = CliRunner().invoke(app, ["graph", "--onnx", str(empty)])
    assert result.exit_code == 2 and result.output == f"error: {empty}: field '<file>': " \
        "expected an ONNX model, got 'an empty file'\n", result.output


def test_graph_warns_that_onnx_fixes_the_shapes(small_cnn):
    """--image does nothing to an ONNX file's graph, nor --seq to one whose inputs have no
    open dimension but the batch: said, where before they were dropped in silence."""
    result = CliRunner().invoke(app, ["graph", "--onnx", str(small_cnn), "--batch", "4",
                                      "--image", "64", "--seq", "9", "--json"])
    assert result.exit_code == 0, result.output
    assert "warning: --image has no effect with --onnx: the file's open input dimensions " \
        "take --batch (the leading one) and --seq (the others)" in result.stderr
    assert f"warning: --seq has no effect: {small_cnn} fixes every input dimension but the " \
        "leading one (the batch)" in result.stderr


def _save(tmp_path, name, nodes, inputs, outputs, initializers=(), opsets=(("", 17),)):
    path = tmp_path / f"{name}.onnx"
    graph = helper.make_graph(nodes, name, inputs, outputs, list(initializers))
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v)
                                                      for d, v in opsets]), str(path))
    return path


def _value(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def test_a_sequence_dimension_takes_seq_and_one_left_open_is_refused(tmp_path):
    """QA: every symbolic dimension took --batch, a language model's sequence length too
    (`--batch 2`: 1.52 MiB plain peak where the same model fixed at 2 x 128 has 4.41 MiB),
    and --seq was refused as having no effect."""
    emb = numpy_helper.from_array(np.ones((100, 16), np.float32), "emb")
    nodes = [helper.make_node("Gather", ["emb", "ids"], ["e"], name="embed"),
             helper.make_node("MatMul", ["e", "w"], ["y"], name="head")]
    w = numpy_helper.from_array(np.ones((16, 100), np.float32), "w")
    dynamic = _save(tmp_path, "lm", nodes, [_value("ids", ["batch", "seq"], TensorProto.INT64)],
                    [_value("y", ["batch", "seq", 100])], [emb, w])
    fixed = _save(tmp_path, "lm_fixed", nodes, [_value("ids", [2, 128], TensorProto.INT64)],
                  [_value("y", [2, 128, 100])], [emb, w])
    result = CliRunner().invoke(app, ["graph", "--onnx", str(dynamic), "--batch", "2"])
    assert result.exit_code == 2, result.output
    assert result.output == f"error: {dynamic}: input 'ids' leaves its dimension 'seq' (axis " \
        "1) open: give --seq N for it (--batch sets the leading one)\n"
    graph = graph_from_onnx(dynamic, batch=2, seq=128)
    assert graph.capture["assumed_dims"] == {"batch": 2, "seq": 128}
    assert graph.capture["fixed"]["inputs"] == 2 * 128 * 8
    assert plain_peak_bytes(graph) == plain_peak_bytes(graph_from_onnx(fixed))


def test_what_the_import_cannot_size_or_leaves_to_the_data_is_said(tmp_path):
    """QA: a contrib op that shape inference does not know made its values (and all after
    it) 0 bytes without a word; a NonZero's count took --batch, and a file whose inputs fix
    the batch at 4 was reported as the batch given."""
    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    unknown = _save(tmp_path, "contrib", [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="mm1"),
        helper.make_node("FusedGelu", ["h"], ["g"], domain="com.microsoft", name="gelu"),
        helper.make_node("MatMul", ["g", "w"], ["y"], name="mm2")],
        [_value("x", ["N", 4])], [_value("y", None)], [w],
        opsets=(("", 17), ("com.microsoft", 1)))
    result = CliRunner().invoke(app, ["graph", "--onnx", str(unknown), "--batch", "2"])
    assert result.exit_code == 0, result.output
    assert f"warning: onnx's shape inference could not size 2 values of {unknown} (made by " \
        "MatMul, com.microsoft.FusedGelu): they count 0 bytes, so plans of this graph hold " \
        "less than the model needs" in result.stderr
    data = _save(tmp_path, "nonzero", [
        helper.make_node("NonZero", ["x"], ["where"], name="nz"),
        helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        [_value("x", [4, 4])], [_value("y", [4, 4]), _value("where", None, TensorProto.INT64)],
        [w])
    result = CliRunner().invoke(app, ["graph", "--onnx", str(data), "--batch", "256",
                                      "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["batch"] == 4
    assert f"warning: {data} leaves 1 dimensions to the data" in result.stderr
    assert "--batch 256 has no effect" in result.stderr


def test_an_alias_of_a_weight_or_an_input_imports(tmp_path):
    """QA: torch's exporter writes Identity(weight) where two parameters start equal (two
    LayerNorms), and a residual over x.flatten(1) reshapes an input: both were an internal
    error (KeyError, exit 70). A half-precision model is said to be one (it said float32)."""
    w = numpy_helper.from_array(np.ones((4, 4), np.float16), "w")
    path = _save(tmp_path, "alias", [
        helper.make_node("Identity", ["w"], ["w2"], name="same_init"),
        helper.make_node("Flatten", ["x"], ["xf"], name="flat"),
        helper.make_node("MatMul", ["xf", "w"], ["h"], name="mm1"),
        helper.make_node("MatMul", ["h", "w2"], ["h2"], name="mm2"),
        helper.make_node("Add", ["h2", "xf"], ["y"], name="skip")],
        [_value("x", ["N", 4], TensorProto.FLOAT16)], [_value("y", ["N", 4], TensorProto.FLOAT16)],
        [w])
    graph = graph_from_onnx(path, batch=2)
    assert graph.dtype == "float16" and graph.capture["fixed"]["parameters"] == 4 * 4 * 2
    assert [n.name for n in graph.nodes if n.kind == "forward"] == ["same_init", "mm2"]


@pytest.mark.parametrize("option", [["--params-home", "flash"], ["--train", "fc.*"],
                                    ["--update", "step"], ["--level", "2"]])
def test_graph_refuses_options_of_a_captured_step_with_onnx(small_cnn, option):
    # QA: accepted and ignored, the graph unchanged (as --dtype and --accumulate are refused)
    result = CliRunner().invoke(app, ["graph", "--onnx", str(small_cnn), *option])
    assert result.exit_code == 2, result.output
    assert f"{option[0]} shapes a captured model's training step" in result.output


def test_a_file_that_fixes_its_batch_is_planned_at_that_batch_and_says_so(small_cnn, tmp_path):
    """torch.onnx.export without dynamic axes fixes the batch: every size is that batch's, so
    the graph's batch is the file's and --batch, which changes nothing, says so (it was shown
    as the batch, `cnn.onnx (batch 8)` over sizes made at batch 4)."""
    fixed_batch, features = 4, 16
    weight = numpy_helper.from_array(np.ones((CLASSES, features), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w"], ["logits"], transB=1, name="fc")], "fixed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [fixed_batch, features])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [fixed_batch, CLASSES])],
        [weight])
    path = tmp_path / "fixed.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    result = CliRunner().invoke(app, ["graph", "--onnx", str(path), "--batch", "8", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["batch"] == fixed_batch
    assert summary["fixed"]["inputs"] == fixed_batch * features * 4
    assert f"warning: --batch 8 has no effect: {path} fixes the batch at {fixed_batch}" \
        in result.stderr
    result = CliRunner().invoke(app, ["graph", "--onnx", str(path), "--json"])
    assert json.loads(result.stdout)["batch"] == fixed_batch and "warning" not in result.stderr
    # A symbolic batch still takes --batch, without a warning.
    result = CliRunner().invoke(app, ["graph", "--onnx", str(small_cnn), "--batch", "8",
                                      "--json"])
    assert json.loads(result.stdout)["batch"] == 8 and "warning" not in result.stderr


def _mlp_file(tmp_path, ops):
    """x @ W, relu, @ W: the ops as (op_type, inputs, output, name), in the file's order."""
    weight = numpy_helper.from_array(np.ones((4, 4), dtype=np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node(op, list(ins), [out], name=name) for op, ins, out, name in ops], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], [weight])
    path = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


MM1, RELU, MM2 = ("MatMul", ("x", "W"), "h", "mm1"), ("Relu", ("h",), "r", "relu"), \
    ("MatMul", ("r", "W"), "y", "mm2")


@pytest.mark.parametrize("ops, field, got", [
    ([MM2, MM1, RELU], "graph.node[0].input", "'r'"),  # out of order: was KeyError, exit 70
    ([MM1, ("Relu", ("zz",), "r", "relu"), MM2], "graph.node[1].input", "'zz'"),
    ([("MatMul", ("r", "W"), "h", "mm1"), RELU, MM2], "graph.node[0].input", "'r'"),  # a cycle
    ([MM1, ("Relu", ("h",), "h", "relu"), ("MatMul", ("h", "W"), "y", "mm2")],
     "graph.node[1].output", "'h'"),
], ids=["out of order", "an undefined input", "a cycle", "an output made twice"])
def test_a_malformed_onnx_graph_names_the_node_and_value(tmp_path, ops, field, got):
    """Each was planned without a word (or an internal error): the line names the node and
    the value that is wrong."""
    path = _mlp_file(tmp_path, ops)
    with pytest.raises(FormatError) as caught:
        graph_from_onnx(path)
    assert f"field {field!r}:" in str(caught.value) and f"got {got}" in str(caught.value), \
        caught.value
    result = CliRunner().invoke(app, ["graph", "--onnx", str(path), "-o", str(tmp_path / "g")])
    assert result.exit_code == 2 and result.output.startswith("error:"), result.output


def test_a_well_formed_onnx_graph_still_imports(tmp_path):
    assert len(graph_from_onnx(_mlp_file(tmp_path, [MM1, RELU, MM2])).nodes) > 3
