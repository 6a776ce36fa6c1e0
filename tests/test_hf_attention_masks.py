"""The 4D attention mask an hf: model is handed (the wrapper builds it from the batch's 2D
padding mask, see TrainingLoss) must be the mask transformers itself would build: a model
trained on another one trains silently, with gradients equal to eager's on the wrong model.
Each case: the wrapper's loss equals transformers' own, given the 2D mask, bit for bit."""

from __future__ import annotations

import json

import pytest
import torch

pytestmark = pytest.mark.slow
pytest.importorskip("transformers")

from edge_remat_agent.capture.hf import load_hf  # noqa: E402
from helpers.small_llms import SMALL_LLMS, small_llm_spec  # noqa: E402

DECODER = {"num_hidden_layers": 2, "hidden_size": 32, "intermediate_size": 64,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128,
           "max_position_embeddings": 64, "bos_token_id": 0, "eos_token_id": 0,
           "pad_token_id": 0}
CASES = {
    # eager attention adds the mask to its scores: booleans added let every token see the
    # ones after it (GPT-J has no attention but eager; Llama when the config asks for it)
    "gptj-eager": ("gptj", {"n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 128,
                            "n_positions": 64, "rotary_dim": 8}),
    "llama-eager": ("llama", {**DECODER, "attn_implementation": "eager"}),
    # a sliding window shorter than --seq on every layer, and on every other layer
    "mistral-window": ("mistral", {**DECODER, "sliding_window": 8}),
    "mistral-window-eager": ("mistral", {**DECODER, "sliding_window": 8,
                                         "attn_implementation": "eager"}),
    "gemma2-alternating": ("gemma2", {**DECODER, "head_dim": 8, "sliding_window": 8}),
    # an encoder's local attention, both ways, on two of every three layers
    "modernbert-local": ("modernbert", {
        "num_hidden_layers": 3, "hidden_size": 32, "intermediate_size": 64,
        "num_attention_heads": 2, "vocab_size": 128, "max_position_embeddings": 64,
        "local_attention": 8, "global_attn_every_n_layers": 3, "pad_token_id": 0,
        "bos_token_id": 1, "eos_token_id": 2, "cls_token_id": 1, "sep_token_id": 2}),
    # models that read the 2D mask themselves: BLOOM's ALiBi, DeBERTa's relative attention
    "bloom-alibi": ("bloom", {"n_layer": 2, "hidden_size": 32, "n_head": 2, "vocab_size": 128}),
    # an encoder made a decoder by its config attends causally, whatever its head
    "bert-decoder-classifier": ("bert", {
        "num_hidden_layers": 2, "hidden_size": 32, "intermediate_size": 64,
        "num_attention_heads": 2, "vocab_size": 128, "pad_token_id": 0, "is_decoder": True,
        "architectures": ["BertForSequenceClassification"]}),
    "deberta-v2-relative": ("deberta-v2", {
        "num_hidden_layers": 2, "hidden_size": 32, "intermediate_size": 64,
        "num_attention_heads": 2, "vocab_size": 128, "max_position_embeddings": 64,
        "relative_attention": True, "position_buckets": 16, "pos_att_type": ["p2c", "c2p"]}),
}


def own_and_wrapped_loss(spec: str, seq: int = 16):
    module, args = load_hf(spec, batch=2, seq=seq, seed=1)
    module.eval()  # no dropout: the two forwards compare
    with torch.no_grad():
        own = module.model(**dict(zip(module.input_names, args))).loss
        return own, module(*args)


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_wrapper_masks_attention_as_transformers_does(case):
    model, config = CASES[case]
    own, wrapped = own_and_wrapped_loss(f"hf:{model}?config={json.dumps(config)}")
    assert torch.equal(own, wrapped), (case, float(own), float(wrapped))


@pytest.mark.parametrize("model,config", [
    ("llama", DECODER),
    ("gpt2", {"n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 128, "n_positions": 64,
              "pad_token_id": 0}),
    ("bert", {"num_hidden_layers": 2, "hidden_size": 32, "intermediate_size": 64,
              "num_attention_heads": 2, "vocab_size": 128})])
def test_a_decoders_classifier_attends_causally_an_encoders_both_ways(model, config):
    """A decoder classifies a sequence by its last token, having read only the ones before it;
    handed a padding-only mask, Llama's and GPT-2's classifiers read the whole sequence."""
    own, wrapped = own_and_wrapped_loss(f"hf:{model}?config={json.dumps(config)}&task=seq-cls")
    assert torch.equal(own, wrapped), (model, float(own), float(wrapped))


# -- every architecture the wrapper supports, each task it has a head for ------------------
# Tiny configs (2 layers, 32 wide, vocab 128); the text ones name a pad_token_id, so every
# task's batch has padding (a sequence classifier pads only with it), and the windowed ones
# a window under --seq 16.
ENCODER = {"num_hidden_layers": 2, "hidden_size": 32, "intermediate_size": 64,
           "num_attention_heads": 2, "vocab_size": 128, "max_position_embeddings": 64,
           "pad_token_id": 0}
PATCHES = {"num_hidden_layers": 2, "hidden_size": 32, "intermediate_size": 64,
           "num_attention_heads": 2, "image_size": 32, "patch_size": 8}
ARCHITECTURES = {
    "albert": {**ENCODER, "embedding_size": 16},
    "bert": ENCODER,
    "bloom": {"n_layer": 2, "hidden_size": 32, "n_head": 2, "vocab_size": 128,
              "pad_token_id": 3},
    "deberta-v2": CASES["deberta-v2-relative"][1] | {"pad_token_id": 0},
    "distilbert": {"n_layers": 2, "dim": 32, "hidden_dim": 64, "n_heads": 2, "vocab_size": 128,
                   "max_position_embeddings": 64, "pad_token_id": 0},
    "electra": {**ENCODER, "embedding_size": 16},
    "falcon": {"num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 4,
               "vocab_size": 128, "pad_token_id": 0},
    "gemma": {**DECODER, "head_dim": 8},
    "gemma2": CASES["gemma2-alternating"][1],
    "gpt2": {"n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 128, "n_positions": 64,
             "pad_token_id": 0},
    "gpt_neo": {"num_layers": 2, "hidden_size": 32, "num_heads": 2, "vocab_size": 128,
                "max_position_embeddings": 64, "attention_types": [[["global", "local"], 1]],
                "window_size": 8, "pad_token_id": 0},
    "llama": DECODER,
    "mistral": CASES["mistral-window"][1],
    "mixtral": {**DECODER, "num_local_experts": 4, "num_experts_per_tok": 2,
                "sliding_window": 8},
    "mobilebert": {**ENCODER, "embedding_size": 16, "intra_bottleneck_size": 16,
                   "true_hidden_size": 16, "intermediate_size": 32,
                   "num_feedforward_networks": 1},
    "modernbert": CASES["modernbert-local"][1],
    "opt": {"num_hidden_layers": 2, "hidden_size": 32, "ffn_dim": 64, "num_attention_heads": 2,
            "word_embed_proj_dim": 32, "vocab_size": 128, "max_position_embeddings": 64,
            "pad_token_id": 1},
    "phi": DECODER,
    "phi3": {**DECODER, "sliding_window": 8},
    "qwen2": DECODER,
    "roberta": {**ENCODER, "pad_token_id": 1},
    "stablelm": DECODER,
    # no mask: the loss is still transformers' own
    "beit": {**PATCHES, "use_relative_position_bias": True},
    "convnext": {"depths": [1, 1], "hidden_sizes": [8, 16], "num_stages": 2, "image_size": 32},
    "deit": PATCHES,
    "mobilevit": {"image_size": 64, "hidden_sizes": [16, 24, 32],
                  "neck_hidden_sizes": [8, 8, 16, 16, 24, 32, 64]},
    "segformer": {"num_encoder_blocks": 2, "depths": [1, 1], "hidden_sizes": [8, 16],
                  "sr_ratios": [2, 1], "num_attention_heads": [1, 2], "patch_sizes": [7, 3],
                  "strides": [4, 2], "mlp_ratios": [2, 2], "decoder_hidden_size": 16,
                  "image_size": 32},
    "swin": {"embed_dim": 8, "depths": [1, 1], "num_heads": [1, 2], "window_size": 4,
             "image_size": 32, "patch_size": 4},
    "vit": PATCHES,
}


def tasks_with_a_head(model: str) -> list[str]:
    """The wrapper's tasks this model type has a transformers head for (BERT: causal-lm,
    masked-lm, seq-cls; ViT: image-cls)."""
    import transformers
    from edge_remat_agent.capture.hf import TASKS
    config = type(transformers.AutoConfig.for_model(model))
    return [task for task, (auto_name, _) in TASKS.items()
            if config in getattr(transformers, auto_name)._model_mapping]


@pytest.mark.parametrize("model,task", [(model, task) for model in sorted(ARCHITECTURES)
                                        for task in tasks_with_a_head(model)])
def test_every_architecture_trains_transformers_own_loss(model, task):
    """A wrong mask (or position, or head) trains another model with gradients equal to eager's
    on it: only the loss against transformers' own, given the 2D mask, tells."""
    spec = f"hf:{model}?config={json.dumps(ARCHITECTURES[model])}&task={task}"
    module, args = load_hf(spec, batch=2, seq=16, seed=1)
    mask = dict(zip(module.input_names, args)).get("attention_mask")
    assert task == "image-cls" or not bool(mask.all()), "the batch should have padding"
    own, wrapped = own_and_wrapped_loss(spec)
    assert torch.equal(own, wrapped), (model, task, float(own), float(wrapped))


def test_an_encoder_asked_for_causal_lm_with_is_decoder_false_is_refused():
    """BERT's causal-LM head with is_decoder false attends both ways: each token sees the one
    it predicts. Unset, is_decoder is made true (the cases above); set false, refused."""
    from edge_remat_agent.capture.errors import CaptureError
    config = {**ENCODER, "is_decoder": False}
    with pytest.raises(CaptureError, match="set is_decoder true"):
        load_hf(f"hf:bert?config={json.dumps(config)}&task=causal-lm")


# -- encoder-decoder LMs (task seq2seq-lm) ---------------------------------------------------
# The source is padded (with the pad id, the mask 0) and the target differently (-100): the one
# mask is read by the encoder and by the decoder's cross-attention, whose queries are the
# target's; the decoder masks itself causally. No layerdrop (M2M-100's default draws it).
SEQ2SEQ_BART = {"d_model": 32, "encoder_layers": 2, "decoder_layers": 2,
                "encoder_attention_heads": 2, "decoder_attention_heads": 2,
                "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "vocab_size": 128,
                "max_position_embeddings": 64, "pad_token_id": 1, "bos_token_id": 0,
                "eos_token_id": 2, "decoder_start_token_id": 2}
SEQ2SEQ_T5 = {"d_model": 32, "d_ff": 64, "num_layers": 2, "num_decoder_layers": 2,
              "num_heads": 2, "d_kv": 16, "vocab_size": 128,
              "relative_attention_num_buckets": 8, "relative_attention_max_distance": 16,
              "pad_token_id": 0, "eos_token_id": 1, "decoder_start_token_id": 0}
SEQ2SEQ = {
    # relative position bias, no absolute positions; mT5 unties its embeddings, UMT5 has a
    # bias per layer
    "t5": SEQ2SEQ_T5, "mt5": SEQ2SEQ_T5, "umt5": SEQ2SEQ_T5,
    # learned positions (BART, mBART, PLBART: mBART and PLBART start the decoder from each
    # target's last token), sinusoidal ones (Marian, Pegasus, M2M-100)
    "bart": SEQ2SEQ_BART,
    "mbart": SEQ2SEQ_BART | {"decoder_start_token_id": None},
    "plbart": SEQ2SEQ_BART | {"decoder_start_token_id": None},
    "marian": SEQ2SEQ_BART | {"pad_token_id": 127, "decoder_start_token_id": 127,
                              "decoder_vocab_size": 128},
    "pegasus": SEQ2SEQ_BART | {"pad_token_id": 0, "decoder_start_token_id": 0},
    "blenderbot": SEQ2SEQ_BART | {"pad_token_id": 0, "decoder_start_token_id": 1},
    "blenderbot-small": SEQ2SEQ_BART | {"pad_token_id": 0, "decoder_start_token_id": 1},
    "m2m_100": SEQ2SEQ_BART | {"encoder_layerdrop": 0, "decoder_layerdrop": 0},
    "bigbird_pegasus": SEQ2SEQ_BART | {"pad_token_id": 0, "attention_type": "original_full"},
}


@pytest.mark.parametrize("model", sorted(SEQ2SEQ))
def test_every_seq2seq_lm_trains_transformers_own_loss(model):
    """transformers' loss, given the 2D mask and the labels (it shifts them into the decoder's
    inputs itself), against the wrapper's, bit for bit, on a padded source and target."""
    spec = f"hf:{model}?config={json.dumps(SEQ2SEQ[model])}&task=seq2seq-lm"
    module, (ids, mask, labels) = load_hf(spec, batch=2, seq=16, seed=1)
    assert not bool(mask.all()) and bool((labels == -100).any())
    assert not torch.equal(mask == 0, labels == -100), "source and target padded alike"
    own, wrapped = own_and_wrapped_loss(spec)
    assert torch.equal(own, wrapped), (model, float(own), float(wrapped))


# -- small decoder LLMs people fine-tune on edge boards (helpers/small_llms.py), with LoRA --
@pytest.mark.parametrize("shape", sorted(SMALL_LLMS))
def test_small_llm_shapes_with_lora_train_transformers_own_loss(shape):
    pytest.importorskip("peft")
    module, (ids, mask, labels) = load_hf(small_llm_spec(shape), batch=2, seq=16, seed=1)
    assert not bool(mask.all()) and type(module.model).__name__ == "PeftModelForCausalLM"
    own, wrapped = own_and_wrapped_loss(small_llm_spec(shape))
    assert torch.equal(own, wrapped), (shape, float(own), float(wrapped))


def test_barts_masked_lm_head_is_its_seq2seq_lm_and_is_masked_as_one():
    """BART's masked-LM head is BartForConditionalGeneration: it got an encoder's 4D mask and
    no decoder mask, and its decoder then asked a mask of ones whether it had padding
    (`graph --model 'hf:bart?...&task=masked-lm'`: "op aten._local_scalar_dense in module
    'model.model.decoder'"). It trains transformers' own loss and captures."""
    from edge_remat_agent.capture import capture_model
    spec = f"hf:bart?config={json.dumps(SEQ2SEQ_BART)}&task=masked-lm"
    own, wrapped = own_and_wrapped_loss(spec)
    assert torch.equal(own, wrapped), (float(own), float(wrapped))
    assert capture_model(spec, batch=2, seq=16, seed=1).graph.nodes


T5GEMMA_HALF = {"num_hidden_layers": 2, "hidden_size": 32, "intermediate_size": 64,
                "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
                "vocab_size": 128}
T5GEMMA = {"vocab_size": 128, "pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 1,
           "decoder_start_token_id": 2}


def test_t5gemma_trains_its_own_loss_where_its_window_covers_the_sequence():
    half = T5GEMMA_HALF | {"sliding_window": 16}
    spec = f"hf:t5gemma?config={json.dumps(T5GEMMA | {'encoder': half, 'decoder': half})}"
    own, wrapped = own_and_wrapped_loss(spec, seq=16)
    assert torch.equal(own, wrapped), (float(own), float(wrapped))


def test_an_encoder_decoder_window_shorter_than_the_sequence_is_refused():
    """T5Gemma's sliding layers at window 8, --seq 16: the wrapper's masks have no window, and
    its loss was not transformers' own (4.895273 against 4.890446), silently."""
    from edge_remat_agent.capture.errors import CaptureError
    half = T5GEMMA_HALF | {"sliding_window": 8}
    spec = f"hf:t5gemma?config={json.dumps(T5GEMMA | {'encoder': half, 'decoder': half})}"
    with pytest.raises(CaptureError, match="sliding window of 8 tokens, shorter than --seq 16"
                                           ".*give --seq 8 or less"):
        load_hf(spec, batch=2, seq=16)
    load_hf(spec, batch=2, seq=8)
