"""The example batch of an hf: sequence classifier: a decoder (GPT-2, Llama) classifies each
sequence by its last token that is not the config's pad_token_id, so the padding must be that
id. Padded with random ids, the padded sequence was classified by a padding position."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from edge_remat_agent.capture.hf import load_hf  # noqa: E402

LLAMA = ('hf:llama?config={"num_hidden_layers":1,"hidden_size":32,"num_attention_heads":2,'
         '"num_key_value_heads":2,"intermediate_size":64,"vocab_size":50%s}&task=seq-cls')


def test_a_classifier_is_padded_with_the_configs_pad_token_id():
    module, (ids, mask, labels) = load_hf(LLAMA % ',"pad_token_id":3', batch=3, seq=16)
    assert mask[-1].tolist() == [1] * 12 + [0] * 4 and bool(mask[:-1].all())
    assert bool((ids[mask == 0] == 3).all()) and bool((ids[mask == 1] != 3).all())
    # each sequence is classified as it would be alone, without its padding
    module.eval()  # no dropout: the two forwards compare
    with torch.no_grad():
        logits = module.model(input_ids=ids, attention_mask=mask).logits
        for row in range(3):
            real = ids[row, mask[row] == 1][None]
            alone = module.model(input_ids=real).logits
            torch.testing.assert_close(logits[row], alone[0])


def test_a_classifier_whose_config_names_no_pad_token_is_not_padded():
    module, (ids, mask, labels) = load_hf(LLAMA % "", batch=1, seq=16)
    assert module.model.config.pad_token_id is None and bool(mask.all())
    module(ids, mask, labels).backward()  # the decoder classifies the last token: a real one
