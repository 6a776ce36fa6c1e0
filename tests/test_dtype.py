"""Training in half precision (`--dtype bf16|fp16`, capture/precision.py): the whole model in
that dtype, planned with 2-byte tensors, trains bit for bit like `model.to(dtype)` in plain
PyTorch with recomputation and paging; what cannot train is refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers.bad_inputs import BAD_INPUT, cli, refused
from helpers.executor_plans import eager_parameters, problem_near_floor
from helpers.local_runs import planned_and_plain

from edge_remat_agent.capture import CaptureError, capture_model
from edge_remat_agent.capture.models import load_model
from edge_remat_agent.data import batches
from edge_remat_agent.executor.run import run_plan
from edge_remat_agent.formats import Tier
from edge_remat.planner.solve import solve

ROOT = Path(__file__).resolve().parents[1]
FLASH = {"flash": Tier(read_bytes_per_s=5e8, write_bytes_per_s=2e8, latency_s=1e-4)}
STEPS = 3
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}

CASES = [
    # conv + batch norm, Adam, parameters and state on flash, activations recomputed
    ("digits-cnn", "bf16", "adam", "flash", 0.5, "none", dict(batch=8)),
    # SGD with momentum, activations paged to flash (fp16 convolution backward is slow on CPU:
    # a small batch)
    ("digits-cnn", "fp16", "sgd", "ram", 0.5, "flash", dict(batch=4)),
    # a Llama built on meta: its frozen base written to the weight file in bf16, LoRA trained
    ("llama-tiny-lora", "bf16", "adamw", "flash", 0.5, "flash", {}),
    ("gpt-tiny-lora", "fp16", "sgd", "flash", 0.5, "flash", {}),
]


def _plan(graph, fraction, paging):
    problem = problem_near_floor(graph, fraction, paging, FLASH)
    return solve(problem, "heuristic:split" if paging == "none" else "heuristic:paging").plan


@pytest.mark.slow
@pytest.mark.parametrize("model,dtype,optimizer,home,fraction,paging,shape", CASES,
                         ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_a_half_precision_plan_trains_bit_for_bit_like_plain_pytorch(
        model, dtype, optimizer, home, fraction, paging, shape, tmp_path):
    captured = capture_model(model, optimizer=optimizer, params_home=home, refined=False,
                             dtype=dtype, **shape)
    graph = captured.graph
    assert graph.capture["source"]["dtype"] == dtype
    assert {p.dtype for p in captured.module.parameters()} == {DTYPES[dtype]}
    # 2 bytes an element: half of the float32 capture's parameters
    full = capture_model(model, optimizer=optimizer, params_home=home, refined=False, **shape)
    assert 2 * graph.capture["fixed"]["parameters"] == full.graph.capture["fixed"]["parameters"]
    plan = _plan(graph, fraction, paging)
    report = run_plan(graph, plan, STEPS, str(tmp_path / "pages"), captured=captured, seed=0,
                      keep_parameters=True)
    assert report["recomputed"] + report["page_outs"] > 0
    assert report["grad_check"]["bitwise_equal"] and report["grad_check"]["loss_equal"]
    assert all(s["ledger_peak_bytes"] == report["predicted_peak_bytes"] for s in report["steps"])
    eager = load_model(model, dtype=dtype, **shape)[0]  # as plain_train.py builds it
    expected = eager_parameters(eager, optimizer, captured.example_args, STEPS)
    actual = captured.module.state_dict()
    assert expected.keys() == actual.keys()
    for name in expected:
        assert expected[name].dtype == actual[name].dtype
        assert torch.equal(expected[name], actual[name]), name
    losses = [s["loss"] for s in report["steps"]]
    assert all(torch.isfinite(torch.tensor(losses)))


def test_float_batches_from_data_are_cast_to_the_models_dtype():
    module, args = load_model("digits-cnn", batch=4, dtype="bf16")
    assert args[0].dtype is torch.bfloat16 and args[1].dtype is torch.int64
    _, args32 = load_model("digits-cnn", batch=4)
    images, labels = next(batches("digits", args, 0, module))
    images32, labels32 = next(batches("digits", args32, 0))
    assert images.dtype is torch.bfloat16 and torch.equal(images, images32.to(torch.bfloat16))
    assert torch.equal(labels, labels32)


def test_llama_weights_made_per_tensor_are_float32_values_converted():
    """The weight file (made tensor by tensor in the model's dtype) and plain PyTorch (the
    float32 model converted) must hold the same values: a uniform draw made in bfloat16
    rounds 4 of these 4096 elements otherwise."""
    from edge_remat_agent.zoo.llama import init_tensor
    name = "layers.0.self_attn.q_proj.lora_a"
    made = init_tensor(name, (64, 64), 3, torch.bfloat16)
    assert torch.equal(made, init_tensor(name, (64, 64), 3).to(torch.bfloat16))


def test_adam_on_float16_parameters_is_refused_naming_bf16():
    with pytest.raises(CaptureError, match="eps .* is 0 in float16.*--dtype bf16"):
        capture_model("mlp", optimizer="adamw", dtype="fp16")
    with pytest.raises(CaptureError, match="unknown dtype 'fp8'"):
        capture_model("mlp", dtype="fp8")


def test_bad_dtypes_at_the_command_line_are_one_line(tmp_path):
    refused(cli("graph", "--model", "mlp", "--dtype", "float8"), BAD_INPUT,
            "--dtype", "'float8'", "fp32, bf16, fp16")
    refused(cli("graph", "--model", "mlp", "--dtype", "fp16", "--optimizer", "adam"),
            BAD_INPUT, "float16", "--dtype bf16")
    refused(cli("run", "--device", "local", "--model", "mlp", "--dtype", "half",
                "--budget", "1GiB", "--out", tmp_path / "run"), BAD_INPUT, "--dtype", "'half'")
    assert not (tmp_path / "run").exists()


def test_graph_dtype_bf16_halves_the_parameters_and_fp32_graphs_stay_as_they_were(tmp_path):
    params = {}
    for dtype in ("fp32", "bf16"):
        out = tmp_path / f"{dtype}.json"
        proc = cli("graph", "--model", "mlp", "--dtype", dtype, "--json", "-o", out)
        assert proc.returncode == 0, proc.stderr
        capture = json.loads(out.read_text())["capture"]
        assert capture["source"].get("dtype") == (None if dtype == "fp32" else dtype)
        params[dtype] = capture["fixed"]["parameters"]
        assert json.loads(proc.stdout)["dtype"] == ("float32" if dtype == "fp32" else "bfloat16")
    assert 2 * params["bf16"] == params["fp32"]
    table = cli("graph", "--model", "mlp", "--dtype", "bf16").stdout
    assert "mlp (batch " in table and ", bfloat16)" in table


def test_a_fleet_manifests_dtype_reaches_the_capture_and_a_wrong_one_is_named(tmp_path):
    from edge_remat.fleet.manifest import ManifestError, load_manifest
    profile = ROOT / "profiles" / "rpi5.json"
    text = ('budgets = ["60%"]\n[[models]]\nmodel = "mlp"\ndtype = "{}"\n'
            f'[[boards]]\nprofile = "{profile}"\n')
    path = tmp_path / "fleet.toml"
    path.write_text(text.format("bf16"))
    model = load_manifest(path).models[0]
    assert model.capture == {"dtype": "bf16"}
    graph = capture_model(model.spec, **model.capture).graph
    assert graph.capture["source"]["dtype"] == "bf16"
    path.write_text(text.format("half"))
    with pytest.raises(ManifestError, match=r"models\[0\]\.dtype.*fp32, bf16, fp16.*'half'"):
        load_manifest(path)


def test_plain_training_the_comparison_trains_the_model_in_its_dtype():
    """The "train-plain" job (run --plain, and the run's comparison) takes dtype as the
    planned run's graph does: its losses are the bf16 model's on the same digits."""
    from edge_remat_agent.capture.optimizer import torch_optimizer
    from edge_remat_agent.plain_train import train_plain
    report = train_plain("digits-cnn", 2, batch=4, data="digits", dtype="bf16")
    module, args = load_model("digits-cnn", batch=4, dtype="bf16")
    opt, feed, losses = torch_optimizer("sgd", module, None), batches("digits", args, 0), []
    for _ in range(2):
        opt.zero_grad(set_to_none=True)
        loss = module(*next(feed))
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert report["loss"] == losses
    assert report["loss"] != train_plain("digits-cnn", 2, batch=4, data="digits")["loss"]


@pytest.mark.slow
def test_a_bf16_plan_in_the_arena_places_every_2_byte_tensor_and_trains_bitwise(tmp_path):
    """The arena's offsets are in bytes, a bf16 tensor's storage in 2-byte elements: every
    planned tensor lands at its planned offset, recomputed and paged, as plain PyTorch."""
    import dataclasses
    from helpers.executor_plans import dtr_plan, with_paging
    from edge_remat.planner.arena import plan_arena
    captured = capture_model("digits-cnn", batch=4, dtype="bf16", refined=False)
    plan = with_paging(dtr_plan(captured.graph), captured.graph)
    plan = dataclasses.replace(plan, arena=plan_arena(captured.graph, plan, None, "best-fit",
                                                      5.0))
    report = run_plan(captured.graph, plan, STEPS, str(tmp_path / "pages"), captured=captured,
                      seed=0, allocator="arena", keep_parameters=True)
    assert report["recomputed"] > 0 and report["page_ins"] > 0
    assert report["executor_allocator"] == "arena"
    assert report["steps"][-1]["arena"]["outside"] == 0
    assert report["grad_check"]["bitwise_equal"] and report["grad_check"]["loss_equal"]
    expected = eager_parameters(load_model("digits-cnn", batch=4, dtype="bf16")[0], "sgd",
                                captured.example_args, STEPS)
    actual = captured.module.state_dict()
    assert all(torch.equal(expected[n], actual[n]) for n in expected)


@pytest.mark.slow
@pytest.mark.loopback
def test_run_dtype_bf16_trains_on_the_board_bitwise_and_plain_takes_the_dtype(tmp_path):
    """Through `edge-remat run` on the local board: the board captures the graph again in
    bf16 (its own child process), feeds it digits cast to bf16, and the gradient check holds;
    `--plain` trains the bf16 model too."""
    planned, plain = planned_and_plain(tmp_path, "--model", "digits-cnn", "--batch", "8",
                                       "--dtype", "bf16", "--steps", "2")
    assert planned["status"] == "finished" and planned["grad_check"]["bitwise_equal"] is True
    assert planned["data"] == "digits"
    assert planned["tensor_peak_bytes"] == planned["predicted_tensor_peak_bytes"]
    assert planned["page_outs"] > 0
    graph = json.loads((tmp_path / "planned" / "graph.json").read_text())
    assert graph["capture"]["source"]["dtype"] == "bf16" and graph["dtype"] == "bfloat16"
    # the same model, weights and digits: plain bf16 training's losses are the plan's
    assert plain["loss"] == planned["loss"]


def test_an_init_file_of_another_dtype_is_refused_naming_the_dtype_to_give(tmp_path):
    """--init with weights a bf16 run saved, into the fp32 model: the one line says which
    --dtype the file was trained with (it said only 'another model's, or other options')."""
    from edge_remat_agent.executor.errors import BadInput
    from edge_remat_agent.executor.saved_weights import load_weights
    module, _ = load_model("digits-cnn", batch=2)
    path = tmp_path / "weights.pt"
    torch.save({k: v.to(torch.bfloat16) if v.is_floating_point() else v
                for k, v in module.state_dict().items()}, path)
    with pytest.raises(BadInput, match="trained with --dtype bf16; give the same --dtype"):
        load_weights(module, str(path))
