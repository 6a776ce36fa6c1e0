"""Tiny configs of the small decoder LLMs people fine-tune on edge boards, each with a LoRA
adapter on its attention, as hf: specs: the loss check (test_hf_attention_masks) and the
bitwise training check (test_real_models) share them."""

from __future__ import annotations

import json

# Each keeps what sets its family apart: tied embeddings, GQA ratios, q/k/v biases (Qwen2.5),
# q/k norms (Qwen3), llama3 rope scaling (Llama-3.2), a fused qkv projection and a sliding
# window (Phi-3-mini), soft-capping and alternating sliding/full layers (Gemma-2, Gemma-3).
SMALL_LLM = {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
             "vocab_size": 128, "max_position_embeddings": 64, "bos_token_id": 1,
             "eos_token_id": 2, "pad_token_id": 0}
SMALL_LLMS = {  # shape: (model type, config fields, LoRA target modules)
    "qwen2.5-0.5b": ("qwen2", SMALL_LLM | {"num_attention_heads": 8, "num_key_value_heads": 2,
                                           "tie_word_embeddings": True}, ["q_proj", "v_proj"]),
    "qwen3-0.6b": ("qwen3", SMALL_LLM | {"num_attention_heads": 4, "num_key_value_heads": 2,
                                         "head_dim": 16, "tie_word_embeddings": True},
                   ["q_proj", "v_proj"]),
    "smollm2-135m": ("llama", SMALL_LLM | {"hidden_size": 48, "num_attention_heads": 6,
                                           "num_key_value_heads": 2,
                                           "tie_word_embeddings": True}, ["q_proj", "v_proj"]),
    "llama-3.2-1b": ("llama", SMALL_LLM | {
        "num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": True,
        "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 16}}, ["q_proj", "v_proj"]),
    "phi-3-mini": ("phi3", SMALL_LLM | {"num_attention_heads": 4, "num_key_value_heads": 4,
                                        "sliding_window": 8}, ["qkv_proj"]),
    "gemma-2-2b": ("gemma2", SMALL_LLM | {
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "sliding_window": 8, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
        "query_pre_attn_scalar": 16}, ["q_proj", "v_proj"]),
    "gemma-3-1b": ("gemma3_text", SMALL_LLM | {
        "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 16,
        "sliding_window": 8, "query_pre_attn_scalar": 16}, ["q_proj", "v_proj"]),
}


def small_llm_spec(shape: str) -> str:
    model, config, targets = SMALL_LLMS[shape]
    lora = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 4, "lora_alpha": 8,
            "target_modules": targets}
    return f"hf:{model}?config={json.dumps(config)}&adapter={json.dumps(lora)}"
