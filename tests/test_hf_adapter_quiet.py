"""An hf: model with a PEFT adapter builds without the FutureWarning that the pinned peft raises
itself (it reads transformers' deprecated `is_gradient_checkpointing`): `edge-remat run --model
'hf:llama?config=...&adapter=lora.json'` printed it twice, on the host's capture and on the
board's, with nothing for the user to change."""

from __future__ import annotations

import warnings

import pytest

pytest.importorskip("peft")

from edge_remat_agent.capture.hf import load_hf  # noqa: E402

SPEC = ('hf:llama?config={"num_hidden_layers":1,"hidden_size":32,"num_attention_heads":2,'
        '"num_key_value_heads":2,"intermediate_size":64,"vocab_size":300}'
        '&adapter={"peft_type":"LORA","r":4,"target_modules":["q_proj","v_proj"]}')


def test_an_adapter_builds_without_peft_s_own_deprecation_warning():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module, args = load_hf(SPEC, batch=1, seq=8)
    assert not [w for w in caught if "is_gradient_checkpointing" in str(w.message)], \
        [str(w.message) for w in caught]
    trained = [name for name, p in module.named_parameters() if p.requires_grad]
    assert trained and all("lora_" in name for name in trained)  # the adapter is applied
    module(*args).backward()
