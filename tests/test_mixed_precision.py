"""Mixed precision (`--dtype bf16|fp16 --trainable-dtype fp32`, capture/precision.py): the
frozen base in half precision, the adapters, their gradients and optimizer state in float32, as
PEFT keeps them; planned with recomputation and paging it trains bit for bit like plain PyTorch
building the model the same way; what makes no sense is refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers.bad_inputs import BAD_INPUT, cli, refused
from helpers.executor_plans import eager_parameters, every_forward_recomputed, with_paging
from helpers.local_runs import planned_and_plain

from edge_remat_agent.capture import capture_model
from edge_remat_agent.capture.models import load_model
from edge_remat_agent.capture.optimizer import torch_optimizer
from edge_remat_agent.executor.run import run_plan

ROOT = Path(__file__).resolve().parents[1]
STEPS = 3
HALF = {"bf16": torch.bfloat16, "fp16": torch.float16}
MIXED = dict(trainable_dtype="fp32")


def _dtypes(module) -> dict[bool, set]:
    """requires_grad -> the dtypes of those parameters."""
    found: dict[bool, set] = {True: set(), False: set()}
    for p in module.parameters():
        found[p.requires_grad].add(p.dtype)
    return found


@pytest.mark.slow
@pytest.mark.parametrize("model,dtype,optimizer", [
    # a Llama built on meta: its frozen bf16 base served from the weight file, adapters made
    ("llama-tiny-lora", "bf16", "adamw"),
    # AdamW is refused on fp16 parameters (its eps is 0 there); float32 adapters take it
    ("gpt-tiny-lora", "fp16", "adamw"),
])
def test_a_mixed_precision_plan_trains_bit_for_bit_like_plain_pytorch(model, dtype, optimizer,
                                                                      tmp_path):
    captured = capture_model(model, optimizer=optimizer, params_home="flash", refined=False,
                             dtype=dtype, **MIXED)
    graph = captured.graph
    assert graph.capture["source"]["dtype"] == dtype
    assert graph.capture["source"]["trainable_dtype"] == "fp32"
    assert _dtypes(captured.module) == {True: {torch.float32}, False: {HALF[dtype]}}
    if dtype == "bf16":  # the adapters' optimizer state is float32: twice plain bf16's
        half = capture_model(model, optimizer=optimizer, params_home="flash", refined=False,
                             dtype=dtype).graph
        assert graph.capture["fixed"]["optimizer_state"] == \
            2 * half.capture["fixed"]["optimizer_state"]
    plan = with_paging(every_forward_recomputed(graph), graph, every=3)
    report = run_plan(graph, plan, STEPS, str(tmp_path / "pages"), captured=captured, seed=0,
                      keep_parameters=True)
    assert report["recomputed"] > 0 and report["page_outs"] > 0
    assert report["grad_check"]["bitwise_equal"] and report["grad_check"]["loss_equal"]
    eager = load_model(model, dtype=dtype, **MIXED)[0]  # as plain_train.py builds it
    expected = eager_parameters(eager, optimizer, captured.example_args, STEPS)
    actual = captured.module.state_dict()
    assert expected.keys() == actual.keys()
    for name in expected:
        assert expected[name].dtype == actual[name].dtype, name
        assert torch.equal(expected[name], actual[name]), name
    # not the plain half-precision model's training: its adapters are other values
    plain_half = eager_parameters(load_model(model, dtype=dtype)[0], "sgd",
                                  captured.example_args, 1)
    lora = next(n for n in expected if n.endswith("lora_a"))
    assert plain_half[lora].dtype == HALF[dtype] and expected[lora].dtype == torch.float32


def test_float32_adapters_keep_updates_that_bf16_adapters_round_away():
    """Why: an AdamW step of 1e-5 is below a bf16 weight's rounding step (~4e-4 at 0.1), so
    most bf16 adapter elements stay as they were (all but 29 of 2048 here), while every
    float32 one moves."""
    moved = {}
    for options in ({}, MIXED):
        module, args = load_model("llama-tiny-lora", dtype="bf16", **options)
        adapters = {n: p for n, p in module.named_parameters() if n.endswith("lora_a")}
        before = {n: p.detach().clone() for n, p in adapters.items()}
        opt = torch_optimizer("adamw", module, 1e-5)
        for _ in range(2):
            opt.zero_grad(set_to_none=True)
            module(*args).backward()
            opt.step()
        changed = sum(int((before[n] != p).sum()) for n, p in adapters.items())
        moved[bool(options)] = changed / sum(p.numel() for p in adapters.values())
    assert moved[True] == 1.0 and moved[False] < 0.1


@pytest.mark.slow
def test_a_peft_lora_on_a_bf16_transformers_model_keeps_float32_adapters_and_trains_bitwise(
        tmp_path):
    """An hf: model with a PEFT LoRA: PEFT's own layers cast the bf16 activations to the
    float32 adapters and back; captured, planned with recomputation and paging, bit for bit."""
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    config = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128,
              "max_position_embeddings": 64}
    adapter = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 4, "lora_alpha": 8,
               "target_modules": ["q_proj", "v_proj"]}
    spec = f"hf:llama?config={json.dumps(config)}&adapter={json.dumps(adapter)}"
    captured = capture_model(spec, batch=2, seq=16, seed=1, optimizer="adamw", dtype="bf16",
                             **MIXED)
    dtypes = _dtypes(captured.module)
    assert dtypes == {True: {torch.float32}, False: {torch.bfloat16}}
    graph = captured.graph
    plan = with_paging(every_forward_recomputed(graph), graph, every=3)
    report = run_plan(graph, plan, 2, str(tmp_path / "pages"), captured=captured, seed=0,
                      keep_parameters=True)
    assert report["recomputed"] > 0 and report["page_outs"] > 0
    assert report["grad_check"]["bitwise_equal"] and report["grad_check"]["loss_equal"]
    eager = load_model(spec, batch=2, seq=16, seed=1, dtype="bf16", **MIXED)[0]
    expected = eager_parameters(eager, "adamw", captured.example_args, 2)
    assert all(torch.equal(expected[n], v) for n, v in captured.module.state_dict().items())


@pytest.mark.slow
def test_a_peft_classifier_in_modules_to_save_trains_in_bf16_as_peft_keeps_it(tmp_path):
    """A seq-cls PEFT LoRA puts the classifier head (`score`) in modules_to_save: PEFT's
    autocast upcasts only its tuner layers, so on a bf16 base the head's trained copy stays
    bf16 (the LoRA weights float32). Captured so, planned with recomputation and paging, it
    trains bit for bit like PEFT's own model built the plain way (bf16 base, get_peft_model),
    and the adapter folder holds what that model's save_pretrained writes, dtypes and values."""
    import copy

    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    from safetensors.torch import load_file
    from edge_remat_agent.executor.saved_weights import save_weights, state_root
    from edge_remat.run.peft_adapter import write_peft_adapter
    config = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128,
              "max_position_embeddings": 64, "num_labels": 3, "pad_token_id": 0}
    adapter = {"peft_type": "LORA", "task_type": "SEQ_CLS", "r": 4, "lora_alpha": 8,
               "target_modules": ["q_proj", "v_proj"]}
    spec = (f"hf:llama?config={json.dumps(config)}&adapter={json.dumps(adapter)}"
            "&task=seq-cls")
    captured = capture_model(spec, batch=2, seq=16, seed=1, optimizer="adamw", dtype="bf16",
                             **MIXED)
    root, _ = state_root(captured.module)
    trained = {n: p.dtype for n, p in root.named_parameters() if p.requires_grad}
    head = "base_model.model.score.modules_to_save.default.weight"
    assert trained.pop(head) == torch.bfloat16 and set(trained.values()) == {torch.float32}

    # PEFT's own: the bf16 model first, then get_peft_model (autocast_adapter_dtype=True)
    native = peft.get_peft_model(
        transformers.LlamaForSequenceClassification(transformers.LlamaConfig(**config))
        .to(torch.bfloat16), peft.get_peft_config(adapter))
    assert {n: p.dtype for n, p in native.named_parameters()} == \
        {n: p.dtype for n, p in root.named_parameters()}
    native.load_state_dict(root.state_dict())  # the same initial values, dtypes unchanged
    eager = copy.deepcopy(captured.module)  # the batch's 4D mask as the capture gives it
    eager.model = native

    graph = captured.graph
    plan = with_paging(every_forward_recomputed(graph), graph, every=3)
    report = run_plan(graph, plan, STEPS, str(tmp_path / "pages"), captured=captured, seed=0,
                      keep_parameters=True)
    assert report["recomputed"] > 0 and report["page_outs"] > 0
    assert report["grad_check"]["bitwise_equal"] and report["grad_check"]["loss_equal"]
    expected = eager_parameters(eager, "adamw", captured.example_args, STEPS)
    actual = captured.module.state_dict()
    assert expected.keys() == actual.keys()
    for name in expected:
        assert expected[name].dtype == actual[name].dtype, name
        assert torch.equal(expected[name], actual[name]), name

    save_weights(captured.module, None, "trained", tmp_path / "weights.pt")
    saved = torch.load(tmp_path / "weights.pt")
    assert saved[head].dtype == torch.bfloat16 and len(saved) == len(trained) + 1
    written = Path(write_peft_adapter(captured.module, tmp_path / "weights.pt", tmp_path))
    native.save_pretrained(str(tmp_path / "native"))
    ours = load_file(str(written / "adapter_model.safetensors"))
    theirs = load_file(str(tmp_path / "native" / "adapter_model.safetensors"))
    assert ours.keys() == theirs.keys() and "base_model.model.score.weight" in ours
    for name in theirs:
        assert ours[name].dtype == theirs[name].dtype and torch.equal(ours[name], theirs[name])


def test_fp32_and_plain_half_graphs_record_no_trainable_dtype_and_the_keys_differ():
    from edge_remat.run.options import RunOptions
    assert "trainable_dtype" not in capture_model("mlp", dtype="bf16").graph.capture["source"]
    same = capture_model("mlp", dtype="bf16", trainable_dtype="bf16").graph
    assert "trainable_dtype" not in same.capture["source"]
    info = {name: RunOptions(device="local", model="llama-tiny-lora", **opts).model_info
            for name, opts in {"bf16": dict(dtype="bf16"),
                               "same": dict(dtype="bf16", trainable_dtype="bf16"),
                               "mixed": dict(dtype="bf16", trainable_dtype="fp32"),
                               "fp32": dict(trainable_dtype="fp32")}.items()}
    assert info["bf16"] == info["same"] != info["mixed"]  # the profile cache's key
    assert "trainable_dtype" not in info["fp32"] and info["mixed"]["trainable_dtype"] == "fp32"
    table = cli("graph", "--model", "llama-tiny-lora", "--dtype", "bf16",
                "--trainable-dtype", "fp32").stdout
    assert "llama-tiny-lora (batch 2, bfloat16, trained in fp32)" in table


def test_the_footprint_probe_builds_the_model_as_the_run_does():
    """The profile's runtime footprint built zoo models in float32 whatever the graph's
    dtypes: its model's parameter bytes are now the mixed model's."""
    from edge_remat_agent.profiler import measure_runtime_footprint
    from edge_remat_agent.profiler.measure import model_builder
    source = capture_model("llama-tiny-lora", dtype="bf16", **MIXED).graph.capture["source"]
    module, _ = load_model("llama-tiny-lora", dtype="bf16", **MIXED)
    mixed_bytes = sum(p.numel() * p.element_size() for p in module.parameters())
    probe = measure_runtime_footprint(model_builder("llama-tiny-lora", source))
    assert probe.model_parameter_bytes == mixed_bytes
    fp32_bytes = sum(p.numel() * 4 for p in module.parameters())
    assert mixed_bytes < fp32_bytes


def test_a_profile_without_a_graph_builds_its_model_in_the_dtypes_given(tmp_path):
    """`profile --model M --dtype bf16 --trainable-dtype fp32` (the agent's command, as the
    daemon's job runs it): the footprint's model holds the mixed model's parameter bytes and
    the profile names its dtypes, where it was built in float32 whatever the run would use."""
    import subprocess
    import sys
    from helpers.bad_inputs import env

    def footprint(name, *dtypes):
        out = tmp_path / f"{name}.json"
        subprocess.run([sys.executable, "-m", "edge_remat_agent", "profile", "-o", out,
                        "--model", "llama-tiny-lora", "--idle-s", "0.2", "--busy-s", "0.2",
                        *dtypes], check=True, capture_output=True, env=env())
        return json.loads(out.read_text())["measurements"]["runtime_footprint"]

    mixed = footprint("mixed", "--dtype", "bf16", "--trainable-dtype", "fp32")
    fp32 = footprint("fp32")
    module, _ = load_model("llama-tiny-lora", dtype="bf16", **MIXED)
    mixed_bytes = sum(t.numel() * t.element_size()
                      for t in [*module.parameters(), *module.buffers()])
    assert mixed["model_parameter_bytes"] == mixed_bytes < fp32["model_parameter_bytes"]
    assert mixed["model"] == {"model": "llama-tiny-lora", "dtype": "bf16",
                              "trainable_dtype": "fp32"}
    assert fp32["model"] == {"model": "llama-tiny-lora"}


def test_profile_dtypes_that_cannot_apply_are_one_line(tmp_path):
    """Nothing built: a dtype would change nothing; a graph's nodes are timed in its own."""
    graph = tmp_path / "graph.json"
    assert cli("graph", "--model", "mlp", "-o", graph).returncode == 0
    refused(cli("profile", "--device", "local", "--dtype", "bf16"), BAD_INPUT,
            "no model is", "--model")
    refused(cli("profile", "--device", "local", "--model", "mlp", "--dtype", "bf16",
                "--trainable-dtype", "fp16"), BAD_INPUT, "--trainable-dtype fp16")
    refused(cli("profile", "--device", "local", "--model", "mlp", "--dtype", "float16"),
            BAD_INPUT, "unknown --dtype 'float16'", "fp32, bf16, fp16")
    refused(cli("profile", "--device", "local", "--graph", graph, "--dtype", "bf16"),
            BAD_INPUT, "captured with --dtype fp32", "leave --dtype and --trainable-dtype out")
    refused(cli("profile", "--device", "local", "--model", "mlp", "--param", "model=mlp"),
            BAD_INPUT, "--model and --param model=")


def test_combinations_that_make_no_sense_are_one_line(tmp_path):
    refused(cli("graph", "--model", "llama-tiny-lora", "--trainable-dtype", "bf16"),
            BAD_INPUT, "--trainable-dtype bf16 with --dtype fp32", "fp32 or in --dtype")
    refused(cli("graph", "--model", "llama-tiny-lora", "--dtype", "bf16",
                "--trainable-dtype", "fp16"), BAD_INPUT, "--trainable-dtype fp16")
    refused(cli("graph", "--model", "llama-tiny-lora", "--trainable-dtype", "float32"),
            BAD_INPUT, "--trainable-dtype", "'float32'", "fp32, bf16, fp16")
    # full fine-tuning: nothing is frozen to hold in bf16
    refused(cli("graph", "--model", "mlp", "--dtype", "bf16", "--trainable-dtype", "fp32"),
            BAD_INPUT, "every parameter trains", "--dtype fp32",
            "or train a LoRA adapter alone")  # QA: not "--train PATTERN", refused below
    # a trained layer that does not cast its input would meet bf16 with float32 weights
    refused(cli("graph", "--model", "mlp", "--dtype", "bf16", "--trainable-dtype", "fp32",
                "--train", "net.0.*"), BAD_INPUT, "'net.0.weight'", "outside a LoRA adapter")
    refused(cli("run", "--device", "local", "--model", "llama-tiny-lora", "--dtype", "fp16",
                "--trainable-dtype", "bf16", "--budget", "1GiB", "--out", tmp_path / "run"),
            BAD_INPUT, "--trainable-dtype bf16 with --dtype fp16")
    assert not (tmp_path / "run").exists()


def test_a_fleet_manifests_trainable_dtype_reaches_the_capture_and_a_wrong_pair_is_named(
        tmp_path):
    from edge_remat.fleet.manifest import ManifestError, load_manifest
    profile = ROOT / "profiles" / "rpi5.json"
    text = ('budgets = ["60%"]\n[[models]]\nmodel = "llama-tiny-lora"\ndtype = "{}"\n'
            f'trainable_dtype = "fp32"\n[[boards]]\nprofile = "{profile}"\n')
    path = tmp_path / "fleet.toml"
    path.write_text(text.format("bf16"))
    model = load_manifest(path).models[0]
    assert model.capture == {"dtype": "bf16", "trainable_dtype": "fp32"}
    graph = capture_model(model.spec, **model.capture).graph
    assert graph.capture["source"]["trainable_dtype"] == "fp32"
    path.write_text(text.format("fp32").replace('"fp32"\n[[b', '"bf16"\n[[b'))
    with pytest.raises(ManifestError, match=r"models\[0\]\.trainable_dtype.*trainable_dtype "
                                             r"bf16 with dtype fp32"):
        load_manifest(path)


@pytest.mark.slow
@pytest.mark.loopback
def test_run_keeps_float32_adapters_on_the_board_and_in_weights_pt(tmp_path):
    """Through `edge-remat run` on the local board: the board captures the mixed graph again
    (its own child process), the gradient check holds, `--plain` trains the same mixed model
    (the same losses), and weights.pt holds the adapters in float32."""
    planned, plain = planned_and_plain(tmp_path, "--model", "llama-tiny-lora", "--dtype", "bf16",
                                       "--trainable-dtype", "fp32", "--optimizer", "adamw",
                                       "--steps", "2")
    assert planned["status"] == "finished" and planned["grad_check"]["bitwise_equal"] is True
    assert plain["loss"] == planned["loss"]
    graph = json.loads((tmp_path / "planned" / "graph.json").read_text())
    assert graph["capture"]["source"]["trainable_dtype"] == "fp32"
    saved = torch.load(tmp_path / "planned" / "weights.pt")
    assert saved and all(k.endswith(("lora_a", "lora_b")) for k in saved)
    assert {v.dtype for v in saved.values()} == {torch.float32}


def test_init_from_float32_adapters_into_bf16_ones_names_trainable_dtype(tmp_path):
    """--init with a mixed run's weights.pt (float32 adapters) into the plain bf16 model."""
    from edge_remat_agent.executor.errors import BadInput
    from edge_remat_agent.executor.saved_weights import load_weights
    mixed, _ = load_model("llama-tiny-lora", dtype="bf16", **MIXED)
    path = tmp_path / "weights.pt"
    torch.save({n: p.detach() for n, p in mixed.named_parameters() if p.requires_grad}, path)
    with pytest.raises(BadInput, match="trainable parameters are fp32.*--trainable-dtype"):
        load_weights(load_model("llama-tiny-lora", dtype="bf16")[0], str(path))
    assert load_weights(load_model("llama-tiny-lora", dtype="bf16", **MIXED)[0], str(path))
