"""The model's variants for converted checkpoints, each one config field and off by default: fairseq's sinusoids
(`sinusoid_layout="fairseq"`), a source vocabulary and embedding of its own (`source_vocab_size`), a bias on the
output projection (`output_bias`). Each is checked against its reference or its invariant; the paper's model is the
default (tests/test_modeling.py)."""

from __future__ import annotations

import pytest
import torch
from transformers.models.fsmt.modeling_fsmt import SinusoidalPositionalEmbedding

from hf_vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from hf_vanilla_transformer.model.loss_vanilla_transformer import label_smoothed_loss
from hf_vanilla_transformer.model.modeling_vanilla_transformer import sinusoidal_positions, token_positions

from conftest import random_ids, tiny_config, tiny_model


def test_the_variants_are_off_by_default():
    config = VanillaTransformerConfig()
    assert (config.sinusoid_layout, config.source_vocab_size, config.output_bias) == ("interleaved", None, False)
    model = tiny_model()
    assert model.lm_head.bias is None and model.model.encoder.embed_tokens is model.model.shared


@pytest.mark.parametrize("d_model", [8, 32, 1024])
def test_fairseq_positions_are_fairseqs_table_to_the_bit(d_model):
    """fairseq (and FSMT) tabulate `[sin | cos]` with frequencies 10000^(-i / (d/2 - 1)) and count real tokens from
    padding id + 1; the token at index t gets row t + pad + 1 of that table."""
    config = tiny_config(d_model=d_model, sinusoid_layout="fairseq", pad_token_id=1)
    table = SinusoidalPositionalEmbedding.get_embedding(700, d_model, padding_idx=1)
    ours = sinusoidal_positions(token_positions(config, 600, 0, "cpu"), d_model, "fairseq")
    assert torch.equal(ours, table[2:602])
    later = sinusoidal_positions(token_positions(config, 3, 597, "cpu"), d_model, "fairseq")  # a cached step
    assert torch.equal(later, table[599:602])


def test_fairseq_positions_need_an_even_width_and_a_padding_id():
    with pytest.raises(ValueError, match=r"sinusoid_layout='fairseq' is invalid; expected 'fairseq' only with an even"):
        tiny_config(d_model=33, encoder_attention_heads=3, decoder_attention_heads=3, sinusoid_layout="fairseq")
    with pytest.raises(ValueError, match="sinusoid_layout='fairseq' is invalid"):
        tiny_config(sinusoid_layout="fairseq", pad_token_id=None)


def test_a_source_vocabulary_of_its_own_keeps_its_matrix_through_save_and_load(tmp_path):
    model = tiny_model(source_vocab_size=57)
    shared, source = model.model.shared, model.model.encoder.embed_tokens
    assert source is not shared and source.weight.shape == (57, 32)
    assert model.lm_head.weight is shared.weight and model.model.decoder.embed_tokens is shared
    model.save_pretrained(tmp_path / "saved")
    loaded = VanillaTransformerForConditionalGeneration.from_pretrained(tmp_path / "saved")
    assert loaded.lm_head.weight is loaded.model.shared.weight is loaded.model.decoder.embed_tokens.weight
    assert loaded.model.encoder.embed_tokens.weight is not loaded.model.shared.weight
    for (name, expected), actual in zip(model.state_dict().items(), loaded.state_dict().values(), strict=True):
        assert torch.equal(expected, actual), name
    # Source ids are checked against the source's vocabulary, target ids against the target's.
    model.eval()
    sources = random_ids(2, 5, vocab=57)
    sources[0, 0] = 56  # beyond neither
    model(input_ids=sources, decoder_input_ids=random_ids(2, 3))
    with pytest.raises(ValueError, match=r"input_ids holds token id 57, outside the vocabulary \[0, 57\)"):
        model(input_ids=torch.full((1, 3), 57), decoder_input_ids=random_ids(1, 2))
    with pytest.raises(ValueError, match="source_vocab_size=0 is invalid"):
        tiny_config(source_vocab_size=0)


def test_an_output_bias_is_learned_saved_and_counted_in_the_loss(tmp_path):
    """Training projects only the labelled positions; with a bias the loss is still that of the full logits."""
    model = tiny_model(output_bias=True, label_smoothing=0.1)
    assert torch.equal(model.lm_head.bias, torch.zeros(99))  # zero until trained
    with torch.no_grad():
        model.lm_head.bias.normal_(generator=torch.Generator().manual_seed(0))
    sources, labels = random_ids(3, 6, seed=1), random_ids(3, 5, seed=2)
    labels[0, 3:] = -100
    model.train()
    loss = model(input_ids=sources, labels=labels).loss
    loss.backward()
    assert model.lm_head.bias.grad.abs().sum() > 0
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=sources, labels=labels).logits
    torch.testing.assert_close(loss.detach(), label_smoothed_loss(logits, labels, 0.1), rtol=1e-6, atol=1e-6)
    model.save_pretrained(tmp_path / "saved")
    loaded = VanillaTransformerForConditionalGeneration.from_pretrained(tmp_path / "saved")
    assert torch.equal(loaded.lm_head.bias, model.lm_head.bias) and loaded.lm_head.weight is loaded.model.shared.weight
