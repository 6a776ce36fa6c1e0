"""Models as users bring them: transformers models built from tiny configs (no download), PEFT
adapters, recurrent layers. Each captures with saved bytes within 10% of what eager autograd
really saves, and a plan with recomputation (and paging) trains to the same bits as eager.

Tests that need `transformers` / `peft` skip without them; CI installs them (`.[hf]`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from edge_remat_agent.capture import CaptureError, capture_model
from edge_remat_agent.capture.measure import eager_saved_bytes_as_captured
from edge_remat_agent.capture.models import load_model
from edge_remat_agent.data import batches
from edge_remat_agent.executor import run_plan
from helpers.executor_plans import every_forward_recomputed, trainable_count, with_paging
from helpers.small_llms import SMALL_LLMS, small_llm_spec

pytestmark = pytest.mark.slow

needs_transformers = pytest.mark.skipif(
    not __import__("importlib").util.find_spec("transformers"),
    reason="transformers is not installed (pip install -e '.[hf]')")
needs_peft = pytest.mark.skipif(not __import__("importlib").util.find_spec("peft"),
                                reason="peft is not installed (pip install -e '.[hf]')")

TINY = {  # small but complete architectures: every layer kind of the real model is there
    "gpt2": {"n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": 128, "n_positions": 64,
             "bos_token_id": 0, "eos_token_id": 0},
    "llama": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128,
              "max_position_embeddings": 64, "bos_token_id": 0, "eos_token_id": 0,
              "pad_token_id": 0},
    "bert": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
             "num_attention_heads": 2, "vocab_size": 128, "max_position_embeddings": 64},
    "opt": {"hidden_size": 32, "ffn_dim": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
            "vocab_size": 128, "max_position_embeddings": 64, "word_embed_proj_dim": 32},
    "vit": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 2, "image_size": 32, "patch_size": 8, "num_labels": 10},
    # relative position bias: its index comes from a helper transformers caches
    "beit": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
             "num_attention_heads": 2, "image_size": 32, "patch_size": 8, "num_labels": 10,
             "use_relative_position_bias": True},
    # the masks each builds: ALiBi from the 2D one, a sliding window
    "bloom": {"n_layer": 2, "hidden_size": 32, "n_head": 2, "vocab_size": 128},
    "mistral": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128,
                "max_position_embeddings": 64, "sliding_window": 8},
    # mixture of experts: top-2 routing of 4 experts
    "mixtral": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128,
                "max_position_embeddings": 64, "num_local_experts": 4,
                "num_experts_per_tok": 2},
    "whisper": {"d_model": 32, "encoder_layers": 1, "decoder_layers": 1,
                "encoder_attention_heads": 2, "decoder_attention_heads": 2,
                "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "num_mel_bins": 16,
                "max_source_positions": 16, "max_target_positions": 32, "vocab_size": 128,
                "pad_token_id": 0, "bos_token_id": 0, "eos_token_id": 0,
                "decoder_start_token_id": 0},
    # encoder-decoder LMs (task seq2seq-lm): relative position bias; learned positions
    "t5": {"d_model": 32, "d_ff": 64, "num_layers": 2, "num_decoder_layers": 2, "num_heads": 2,
           "d_kv": 16, "vocab_size": 128, "relative_attention_num_buckets": 8,
           "relative_attention_max_distance": 16, "pad_token_id": 0, "eos_token_id": 1,
           "decoder_start_token_id": 0},
    "bart": {"d_model": 32, "encoder_layers": 2, "decoder_layers": 2,
             "encoder_attention_heads": 2, "decoder_attention_heads": 2, "encoder_ffn_dim": 64,
             "decoder_ffn_dim": 64, "vocab_size": 128, "max_position_embeddings": 64,
             "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2,
             "decoder_start_token_id": 2},
}
ADAPTERS = {
    "lora": {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 4, "lora_alpha": 8,
             "lora_dropout": 0.1, "target_modules": ["q_proj", "v_proj"]},
    "ia3": {"peft_type": "IA3", "task_type": "CAUSAL_LM",
            "target_modules": ["k_proj", "v_proj", "down_proj"],
            "feedforward_modules": ["down_proj"]},
}


@pytest.fixture(scope="module")
def configs(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("hf-configs")
    for name, fields in {**TINY, **ADAPTERS}.items():
        (folder / f"{name}.json").write_text(json.dumps(fields))
    return folder


def check_capture_and_plan(spec: str, tmp_path: Path, batch: int = 2, seq: int = 16,
                           isolated: bool = False, update: str = "fused",
                           params_home: str = "ram", check_saved: bool = True) -> dict:
    """Saved bytes against eager's hooks; a plan that recomputes every forward node and pages
    some to flash, run for two steps, its first step's gradients against eager's.
    `check_saved` False: frozen weights homed on flash that the backward reads (an adapter's
    base model) are values the graph holds from forward to backward, and eager's hooks count
    no parameter (tiny Qwen2.5 + LoRA: 272132 bytes against 239364, 32768 = its 128 x 64
    embedding; 239364 with the weights in RAM)."""
    captured = capture_model(spec, batch=batch, seq=seq, seed=1, update=update,
                             params_home=params_home)
    module, args = load_model(captured.graph.capture["source"]["model"], batch=batch, seq=seq,
                              seed=1)
    module.train()
    if check_saved:
        eager = eager_saved_bytes_as_captured(module, args, captured.trace)
        saved = captured.graph.capture["saved_bytes"]
        assert abs(saved / eager - 1) <= 0.10, (spec, saved, eager)
    graph = captured.graph
    plan = with_paging(every_forward_recomputed(graph), graph, every=3)
    report = run_plan(graph, plan, 2, str(tmp_path / "pages"), seed=4,
                      **({} if isolated else {"captured": captured}))
    check = report["grad_check"]
    assert check["bitwise_equal"], check
    assert report["recomputed"] > 0 and report["page_outs"] > 0
    assert report["summary"]["ledger_within_prediction"], report["summary"]
    return {"captured": captured, "report": report}


@needs_transformers
def test_gpt2_runs_on_the_board_with_lifted_constants_and_tied_embeddings(configs, tmp_path):
    """The board's path: capture in a child process, rebuild the graph from its Program (the
    lifted `_tensor_constant*` values travel with it), train; the tied wte/lm_head weight gets
    one gradient, the sum eager's .grad holds."""
    spec = f"hf:gpt2?config={configs / 'gpt2.json'}"
    result = check_capture_and_plan(spec, tmp_path, isolated=True)
    trace = result["captured"].trace
    assert trace.constants(), "expected lifted tensor constants in a transformers GPT-2"
    assert sorted(trace.grads.values()).count("model.transformer.wte.weight") == 1
    assert "model.lm_head.weight" not in trace.grads.values()
    assert any(n.attrs.get("random") for n in result["captured"].graph.nodes)  # dropout
    assert result["report"]["grad_check"]["compared"] == trainable_count(
        result["captured"].module)  # parameters() lists the tied weight once


@needs_transformers
def test_gpt2_tied_embeddings_train_with_parameters_homed_on_flash(configs, tmp_path):
    """`lm_head.weight` is `wte.weight` under a second name: its readers load the one param
    node's value (lm_head once read a placeholder no param node loaded: "mat2 must be a
    matrix" at its first compute, the `run` path whenever the budget homes parameters on
    flash)."""
    spec = f"hf:gpt2?config={configs / 'gpt2.json'}"
    result = check_capture_and_plan(spec, tmp_path, isolated=True, params_home="flash")
    graph = result["captured"].graph
    loaded = [name for n in graph.nodes if n.kind == "param" for name in n.attrs["params"]]
    assert "model.transformer.wte.weight" in loaded and "model.lm_head.weight" not in loaded


@needs_transformers
def test_plain_run_reads_an_hf_config_named_by_a_relative_path(configs, tmp_path):
    """`run --plain` sends the spec to the board without capturing it first: its relative
    config path is made absolute as the capture's is (the board's job once looked for
    `gpt2.json` in its own folder: 'cannot read the config file')."""
    from helpers.bad_inputs import cli
    from helpers.board_fixtures import local_board
    (tmp_path / "gpt2.json").write_text((configs / "gpt2.json").read_text())
    with local_board(tmp_path / "bench", "relative-config"):  # its agent stopped at the end
        proc = cli("run", "--device", "relative-config", "--model", "hf:gpt2?config=gpt2.json",
                   "--plain", "--steps", 1, "--batch", 2, "--seq", 16, "--out",
                   tmp_path / "out", "--no-plots", "--json", cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["mode"] == "plain" and report["steps_done"] == 1


@needs_transformers
@pytest.mark.parametrize("model", ["llama", "bert", "opt", "vit", "whisper", "bloom",
                                   "mistral", "mixtral", "beit", "t5", "bart"])
def test_transformers_models_train_bitwise_like_eager(model, configs, tmp_path):
    check_capture_and_plan(f"hf:{model}?config={configs / (model + '.json')}", tmp_path)


@needs_transformers
@pytest.mark.parametrize("model,field", [("gpt2", "n_positions"),
                                         ("bert", "max_position_embeddings"),
                                         ("opt", "max_position_embeddings")])
def test_a_sequence_longer_than_learned_positions_is_refused(model, field, configs):
    """Fake tensors do not check an embedding's indices: --seq 80 against 64 learned positions
    captured and planned, and the board's first step failed ('index out of range in self')."""
    spec = f"hf:{model}?config={configs / (model + '.json')}"
    with pytest.raises(CaptureError, match=f"--seq 80 .* learned positions \\(64, the config's "
                                           f"{field}\\)"):
        load_model(spec, batch=2, seq=80, seed=1)
    load_model(spec, batch=2, seq=64, seed=1)
    # rotary positions have no table: any length
    load_model(f"hf:llama?config={configs / 'llama.json'}", batch=2, seq=80, seed=1)


@needs_transformers
@pytest.mark.parametrize("model", ["gpt2", "llama"])
def test_bundled_text_trains_an_hf_causal_lm_bitwise_and_its_loss_falls(model, tmp_path):
    """`--data text` was refused for every hf: model ('gives 2 arguments; the model takes 3'):
    it gives transformers' own batch, input_ids, a mask of ones and labels = input_ids
    (unshifted: the model shifts them), ids below the model's vocabulary."""
    (tmp_path / "config.json").write_text(json.dumps({**TINY[model], "vocab_size": 300}))
    captured = capture_model(f"hf:{model}?config={tmp_path / 'config.json'}", batch=2, seq=32,
                             seed=1)
    ids, mask, labels = next(batches("text", captured.example_args, 1, captured.module))
    assert torch.equal(labels, ids) and bool(mask.all()) and int(ids.max()) < 300
    _trains_on_the_text_bitwise_and_learns(captured, tmp_path)


@needs_transformers
@pytest.mark.parametrize("model,words", [
    ("bert", "feeds causal and seq2seq language models; this model trains a masked-lm head"),
    ("gpt2", "the model's vocabulary has 128: give it a vocab_size of at least 259")])
def test_bundled_text_refuses_what_it_cannot_feed_in_one_line(model, words, configs):
    from edge_remat.run.options import RunProblem, check_data_fits
    module, args = load_model(f"hf:{model}?config={configs / (model + '.json')}", batch=2,
                              seq=16, seed=1)
    with pytest.raises(RunProblem, match=f"^--data text cannot feed this model: .*{words}"):
        check_data_fits("text", args, module)


@needs_transformers
def test_opt_gets_the_positions_it_counts_from_the_padding_mask(configs):
    """OPT counts its learned positions from the 2D mask; handed the 4D mask alone it failed
    to broadcast (capture: 'Attempting to broadcast a dimension of length 16'). Its loss is
    transformers' own, given the 2D mask, on the padded example batch."""
    module, (ids, mask, labels) = load_model(f"hf:opt?config={configs / 'opt.json'}",
                                             batch=2, seq=16, seed=1)
    module.eval()  # no dropout: the two calls draw nothing
    own = module.model(input_ids=ids, attention_mask=mask, labels=labels).loss
    assert torch.equal(module(ids, mask, labels), own)


@needs_transformers
@needs_peft
@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
def test_peft_adapters_train_only_their_parameters_bitwise(adapter, configs, tmp_path):
    spec = f"hf:llama?config={configs / 'llama.json'}&adapter={configs / (adapter + '.json')}"
    result = check_capture_and_plan(spec, tmp_path)
    module = result["captured"].module
    frozen = [p for p in module.parameters() if not p.requires_grad]
    assert frozen and len(frozen) > trainable_count(module)  # the base model stays frozen
    assert result["report"]["grad_check"]["compared"] == trainable_count(module)
    fixed = result["captured"].graph.capture["fixed"]
    assert fixed["gradients"] < fixed["parameters"] / 4  # gradients only for the adapter


@needs_transformers
@needs_peft
@pytest.mark.parametrize("model,targets", [("t5", ["q", "v"]), ("bart", ["q_proj", "v_proj"])])
def test_lora_on_an_encoder_decoder_trains_only_its_parameters_bitwise(model, targets, configs,
                                                                       tmp_path):
    adapter = {"peft_type": "LORA", "task_type": "SEQ_2_SEQ_LM", "r": 4, "lora_alpha": 8,
               "lora_dropout": 0.1, "target_modules": targets}
    spec = f"hf:{model}?config={configs / (model + '.json')}&adapter={json.dumps(adapter)}"
    result = check_capture_and_plan(spec, tmp_path)
    module = result["captured"].module
    assert type(module.model).__name__ == "PeftModelForSeq2SeqLM"
    # q and v of every attention: the encoder's, the decoder's self- and cross-attention
    assert trainable_count(module) == 2 * 2 * (2 + 2 * 2)
    assert result["report"]["grad_check"]["compared"] == trainable_count(module)


@needs_transformers
@pytest.mark.parametrize("model", ["t5", "bart"])
def test_bundled_text_trains_a_seq2seq_lm_to_continue_it_bitwise(model, tmp_path):
    """`--data text` for an encoder-decoder: a window of the story as the source, the window
    after it as the labels (the model shifts them into its decoder's inputs)."""
    from edge_remat_agent.data.text import story_tokens
    (tmp_path / "config.json").write_text(json.dumps({**TINY[model], "vocab_size": 300}))
    captured = capture_model(f"hf:{model}?config={tmp_path / 'config.json'}", batch=2, seq=16,
                             seed=1)
    ids, mask, labels = next(batches("text", captured.example_args, 1, captured.module))
    story = torch.tensor(story_tokens())
    for row in torch.cat([ids, labels], dim=1):  # the continuation, token for token
        start = int((story.unfold(0, 32, 1) == row).all(dim=1).nonzero()[0])
        assert torch.equal(story[start:start + 32], row)
    assert bool(mask.all()) and ids.shape == labels.shape == (2, 16)
    _trains_on_the_text_bitwise_and_learns(captured, tmp_path)


@needs_transformers
@needs_peft
@pytest.mark.parametrize("shape", sorted(SMALL_LLMS))
def test_small_llm_shapes_with_lora_train_bitwise_with_weights_on_flash(shape, tmp_path):
    """Qwen2.5, Qwen3, SmolLM2, Llama-3.2, Phi-3-mini, Gemma-2, Gemma-3 shapes (tiny), LoRA on
    their attention, the frozen weights read from flash by param nodes."""
    result = check_capture_and_plan(small_llm_spec(shape), tmp_path, params_home="flash",
                                    check_saved=False)
    module, graph = result["captured"].module, result["captured"].graph
    assert result["report"]["grad_check"]["compared"] == trainable_count(module)
    assert any(n.kind == "param" for n in graph.nodes)


@pytest.mark.parametrize("model,seq", [("conv-gru", 16), ("lstm-lm", 8)])
def test_recurrent_layers_capture_what_eager_saves_and_train_exactly(model, seq, tmp_path):
    # Fused updates (the default) and one optimizer step after the backward: the LSTM
    # backward's results that nothing reads (the state gradients of zero initial states, the
    # second bias's gradient) are held while it runs, and the plan counts them.
    for update in ("fused", "step"):
        (tmp_path / update).mkdir()  # the page folder's parent (a missing one is refused)
        check_capture_and_plan(model, tmp_path / update, seq=seq, update=update)


@needs_transformers
def test_hf_spec_mistakes_are_one_clear_error(configs, tmp_path):
    with pytest.raises(CaptureError, match="does not know the model type 'no-such-model'"):
        load_model("hf:no-such-model")
    with pytest.raises(CaptureError, match="cannot read the config file"):
        load_model(f"hf:gpt2?config={tmp_path / 'missing.json'}")
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(CaptureError, match="the config is not valid JSON"):
        load_model(f"hf:gpt2?config={tmp_path / 'broken.json'}")
    with pytest.raises(CaptureError, match="unknown option colour"):
        load_model("hf:gpt2?colour=red")
    with pytest.raises(CaptureError, match="not a checkpoint directory"):
        load_model(f"hf:{tmp_path}")
    # transformers' and safetensors' own refusals (were internal errors, exit 70)
    with pytest.raises(CaptureError, match="config is refused: .*n_layer"):
        load_model('hf:gpt2?config={"n_layer": "x"}')
    checkpoint = tmp_path / "garbled"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(json.dumps({"model_type": "gpt2", **TINY["gpt2"]}))
    (checkpoint / "model.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(CaptureError, match="cannot build the model: SafetensorError"):
        load_model(f"hf:{checkpoint}")


@needs_transformers
def test_a_local_checkpoint_directory_loads_its_weights(configs, tmp_path):
    """A checkpoint the user already has (here: saved from a tiny GPT-2) is read from disk."""
    import transformers
    config = transformers.GPT2Config(**TINY["gpt2"])
    torch.manual_seed(7)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path / "ckpt")
    saved = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "ckpt")
    module, _ = load_model(f"hf:{tmp_path / 'ckpt'}", batch=1, seq=8, seed=0)
    assert torch.equal(module.model.transformer.h[0].attn.c_attn.weight,
                       saved.transformer.h[0].attn.c_attn.weight)


class AttentionBlock(torch.nn.Module):
    """nn.MultiheadAttention (with dropout), F.scaled_dot_product_attention on views of one
    projection, and in-place ops, as users write them."""

    def __init__(self, width=32, heads=4):
        super().__init__()
        self.mha = torch.nn.MultiheadAttention(width, heads, dropout=0.1, batch_first=True)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.ff = torch.nn.Linear(width, width)
        self.norm = torch.nn.LayerNorm(width)
        self.heads = heads

    def forward(self, x):
        x = x + self.mha(x, x, x, need_weights=False)[0]
        b, length, width = x.shape
        q, k, v = self.qkv(x).view(b, length, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + y.transpose(1, 2).reshape(b, length, width)
        h = self.ff(self.norm(x))
        h.add_(0.1).relu_()
        return x + h * 0.5


class AttentionModel(torch.nn.Module):
    def __init__(self, vocab=64, width=32):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.blocks = torch.nn.Sequential(AttentionBlock(width), AttentionBlock(width))
        self.out = torch.nn.Linear(width, vocab)

    def forward(self, ids, targets):
        logits = self.out(self.blocks(self.embed(ids)))
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


def make_attention_model(batch: int = 4, seq: int = 16):
    return AttentionModel(), (torch.randint(0, 64, (batch, seq)),
                              torch.randint(0, 64, (batch, seq)))


def test_multihead_attention_sdpa_views_and_in_place_ops(tmp_path):
    check_capture_and_plan(f"{__file__}:make_attention_model", tmp_path, batch=4, seq=16)


def _trains_on_the_text_bitwise_and_learns(captured, tmp_path):
    """6 steps on `--data text` recomputing every forward node: gradients bit for bit eager's,
    the loss lower at the end."""
    report = run_plan(captured.graph, every_forward_recomputed(captured.graph), 6,
                      str(tmp_path / "pages"), data="text", seed=1, captured=captured)
    assert report["grad_check"]["bitwise_equal"], report["grad_check"]
    losses = [step["loss"] for step in report["steps"]]
    assert losses[-1] < losses[0], losses
