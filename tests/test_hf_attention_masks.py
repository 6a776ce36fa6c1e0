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
