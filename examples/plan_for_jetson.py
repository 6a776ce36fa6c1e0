"""Plan your own model and an ONNX file for a Jetson, on this machine: no board, no training.

Two inputs, one board profile (the modelled Jetson Orin Nano in profiles/, each figure with its
published source):
  1. a PyTorch model of your own (examples/my_model.py: skip connection, dropout, batch norm),
     captured here with `edge-remat graph --model FILE:FUNCTION`;
  2. an ONNX file (a CNN of six conv-bn-relu blocks written with onnx.helper here, as an
     exporter would write it),
     imported with `edge-remat graph --onnx`: its backward is planned from the forward (a
     planning-only graph: it cannot be executed, only planned).
Each is planned at the budget you give, and the plan is replayed by the simulator.

    python examples/plan_for_jetson.py                      # budget 85%, into jetson-plans/
    python examples/plan_for_jetson.py --budget 90% --profile profiles/jetson-nano.json
"""

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parents[1]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", default="85%", help="of each graph's plain peak")
    parser.add_argument("--profile", default=str(REPO / "profiles" / "jetson-orin-nano.json"))
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--time-limit", default="10", help="solver seconds per plan")
    parser.add_argument("--out", default="jetson-plans")
    return parser.parse_args(argv)


def small_cnn_onnx(path: Path, depth: int = 6, channels: int = 16, classes: int = 10,
                   side: int = 32) -> None:
    """`depth` conv-bn-relu blocks, global pool, fc; the batch dimension is symbolic."""
    rng = np.random.default_rng(0)

    def param(name, *shape):
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)

    c, nodes, initializers, x = channels, [], [], "x"
    for i in range(depth):
        initializers += [param(f"w{i}", c, 3 if i == 0 else c, 3, 3), param(f"scale{i}", c),
                         param(f"bias{i}", c), param(f"mean{i}", c),
                         numpy_helper.from_array(np.ones(c, np.float32), f"var{i}")]
        nodes += [
            helper.make_node("Conv", [x, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1],
                             name=f"conv{i}"),
            helper.make_node("BatchNormalization", [f"c{i}", f"scale{i}", f"bias{i}",
                                                    f"mean{i}", f"var{i}"], [f"b{i}"],
                             name=f"bn{i}"),
            helper.make_node("Relu", [f"b{i}"], [f"r{i}"], name=f"relu{i}")]
        x = f"r{i}"
    initializers += [param("fc_w", classes, c), param("fc_b", classes)]
    nodes += [helper.make_node("GlobalAveragePool", [x], ["p"], name="pool"),
              helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
              helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["y"], transB=1, name="fc")]
    graph = helper.make_graph(
        nodes, "small_cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, side, side])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", classes])], initializers)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def edge_remat(*args) -> None:
    print("$ edge-remat " + " ".join(str(a) for a in args), flush=True)
    done = subprocess.run([sys.executable, "-m", "edge_remat", *map(str, args)])
    if done.returncode != 0:
        raise SystemExit(done.returncode)


def main() -> None:
    args = parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    onnx_file = out / "small_cnn.onnx"
    small_cnn_onnx(onnx_file)
    graphs = {
        "my_model": ["--model", f"{REPO / 'examples' / 'my_model.py'}:make_model"],
        "small_cnn_onnx": ["--onnx", onnx_file],
    }
    for name, source in graphs.items():
        graph, plan = out / f"{name}.graph.json", out / f"{name}.plan.json"
        edge_remat("graph", *source, "--batch", args.batch, "-o", graph, "--force")
        edge_remat("plan", "--graph", graph, "--profile", args.profile, "--budget", args.budget,
                   "--time-limit", args.time_limit, "-o", plan, "--force")
        edge_remat("simulate", plan, "--graph", graph, "--profile", args.profile)


if __name__ == "__main__":
    main()
