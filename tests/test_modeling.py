"""The model proves equal to the paper and to references: post-LN statistics, §3.5 positions, causality, padding,
`torch.nn.Transformer` with copied weights, cache = no cache, eager = sdpa, tied weights, and bad input."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

from hf_vanilla_transformer import (
    VanillaTransformerForConditionalGeneration,
    VanillaTransformerModel,
    label_smoothed_loss,
    sinusoidal_positions,
)
from hf_vanilla_transformer.model import (
    loss_vanilla_transformer,
    modeling_vanilla_transformer,
    padding_vanilla_transformer,
)

from conftest import BOS, PAD, random_ids, tiny_config, tiny_model


# --- post-LN (§3.1, §5.4) ---------------------------------------------------------------------------------------------


def test_post_ln_every_layer_output_is_normalised_and_no_final_layer_norm(model):
    ids, targets = random_ids(2, 9), random_ids(2, 6, seed=1)
    out = model(input_ids=ids, decoder_input_ids=targets, output_hidden_states=True)
    # hidden_states[0] is the embedding output; every later one is a layer output, i.e. a LayerNorm output.
    for states in out.encoder_hidden_states[1:] + out.decoder_hidden_states[1:]:
        assert torch.allclose(states.mean(-1), torch.zeros(()), atol=1e-5)
        assert torch.allclose(states.var(-1, unbiased=False), torch.ones(()), atol=1e-3)
    assert model.model.encoder.layer_norm is None and model.model.decoder.layer_norm is None
    # The last hidden state is the last layer's output, nothing applied after it.
    assert torch.equal(out.encoder_last_hidden_state, out.encoder_hidden_states[-1])
    layer_norms = [name for name, m in model.named_modules() if isinstance(m, nn.LayerNorm)]
    assert len(layer_norms) == 2 * 2 + 3 * 2  # two per encoder layer, three per decoder layer, nothing else


def test_pre_ln_has_one_final_layer_norm_per_stack():
    model = tiny_model(pre_layer_norm=True)
    ids, targets = random_ids(2, 9), random_ids(2, 6, seed=1)
    out = model(input_ids=ids, decoder_input_ids=targets, output_hidden_states=True)
    assert isinstance(model.model.encoder.layer_norm, nn.LayerNorm)
    assert isinstance(model.model.decoder.layer_norm, nn.LayerNorm)
    layer_norms = [m for m in model.modules() if isinstance(m, nn.LayerNorm)]
    assert len(layer_norms) == 2 * 2 + 3 * 2 + 2
    # Inner layer outputs are residual sums (not normalised); the stack output is.
    assert not torch.allclose(out.encoder_hidden_states[1].var(-1, unbiased=False), torch.ones(()), atol=1e-2)
    assert torch.allclose(out.encoder_last_hidden_state.var(-1, unbiased=False), torch.ones(()), atol=1e-3)


# --- positions (§3.5) -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dim", [6, 7, 32])
def test_sinusoids_equal_the_paper_formula_elementwise(dim):
    positions = torch.tensor([0, 1, 2, 17, 255, 2999])
    table = sinusoidal_positions(positions, dim, "interleaved")
    concat = sinusoidal_positions(positions, dim, "concat")
    half = (dim + 1) // 2
    for row, pos in enumerate(positions.tolist()):
        for i in range(dim):
            angle = pos / 10000 ** (2 * (i // 2) / dim)
            expected = math.sin(angle) if i % 2 == 0 else math.cos(angle)
            assert table[row, i].item() == pytest.approx(expected, abs=2e-4)
        # concat: all sines first, then all cosines, same frequencies.
        for j in range(half):
            angle = pos / 10000 ** (2 * j / dim)
            assert concat[row, j].item() == pytest.approx(math.sin(angle), abs=2e-4)
            if half + j < dim:
                assert concat[row, half + j].item() == pytest.approx(math.cos(angle), abs=2e-4)


def test_embedding_is_scaled_tokens_plus_positions_and_nothing_is_stored(model):
    ids = random_ids(1, 5)
    encoder = model.get_encoder()
    expected = encoder.embed_tokens(ids) * math.sqrt(32) + sinusoidal_positions(torch.arange(5), 32)
    assert torch.allclose(encoder.embed(ids, None), expected, atol=1e-6)
    assert not any("position" in name for name in model.state_dict())
    assert not any("position" in name for name, _ in model.named_buffers())


def test_concat_layout_is_used_when_chosen():
    model = tiny_model(sinusoid_layout="concat")
    ids = random_ids(1, 5)
    encoder = model.get_encoder()
    expected = encoder.embed_tokens(ids) * math.sqrt(32) + sinusoidal_positions(torch.arange(5), 32, "concat")
    assert torch.allclose(encoder.embed(ids, None), expected, atol=1e-6)


def test_a_3000_token_source_runs(model):
    with torch.no_grad():
        out = model(input_ids=random_ids(1, 3000), decoder_input_ids=torch.tensor([[BOS, 5, 6]]))
    assert torch.isfinite(out.logits).all()


def test_learned_positions_are_stored_and_capped():
    model = tiny_model(position_embedding_type="learned", max_position_embeddings=16)
    assert "model.encoder.embed_positions.weight" in model.state_dict()
    model(input_ids=random_ids(1, 16), decoder_input_ids=random_ids(1, 16))
    with pytest.raises(ValueError, match="max_position_embeddings=16"):
        model(input_ids=random_ids(1, 17), decoder_input_ids=random_ids(1, 3))


# --- causality and padding --------------------------------------------------------------------------------------------


def test_later_target_tokens_never_change_earlier_logits(model):
    ids, targets = random_ids(2, 8), random_ids(2, 7, seed=1)
    changed = targets.clone()
    changed[:, 4:] = random_ids(2, 3, seed=2)
    a = model(input_ids=ids, decoder_input_ids=targets).logits
    b = model(input_ids=ids, decoder_input_ids=changed).logits
    assert torch.allclose(a[:, :4], b[:, :4], atol=1e-6)
    assert not torch.allclose(a[:, 4:], b[:, 4:], atol=1e-3)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_padding_changes_nothing_in_encoder_decoder_or_cross_attention(attn):
    model = tiny_model()
    model.set_attn_implementation(attn)
    short, long = random_ids(1, 4, seed=3), random_ids(1, 9, seed=4)
    short_tgt, long_tgt = random_ids(1, 3, seed=5), random_ids(1, 6, seed=6)
    # Batch them with right padding on both sides.
    ids = torch.full((2, 9), PAD)
    ids[0, :4], ids[1] = short[0], long[0]
    mask = (ids != PAD).long()
    tgt = torch.full((2, 6), PAD)
    tgt[0, :3], tgt[1] = short_tgt[0], long_tgt[0]
    tgt_mask = (tgt != PAD).long()
    batched = model(input_ids=ids, attention_mask=mask, decoder_input_ids=tgt, decoder_attention_mask=tgt_mask)
    alone = model(input_ids=short, decoder_input_ids=short_tgt)
    assert torch.allclose(batched.encoder_last_hidden_state[0, :4], alone.encoder_last_hidden_state[0], atol=1e-5)
    assert torch.allclose(batched.logits[0, :3], alone.logits[0], atol=1e-5)
    alone_long = model(input_ids=long, decoder_input_ids=long_tgt)
    assert torch.allclose(batched.logits[1], alone_long.logits[0], atol=1e-5)


# --- parity with torch.nn.Transformer ---------------------------------------------------------------------------------


def _copy_attention(ours, theirs: nn.MultiheadAttention) -> None:
    theirs.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]))
    theirs.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
    theirs.out_proj.weight.copy_(ours.out_proj.weight)
    theirs.out_proj.bias.copy_(ours.out_proj.bias)


def _torch_transformer_like(model: VanillaTransformerForConditionalGeneration, norm_first: bool) -> nn.Transformer:
    config = model.config
    reference = nn.Transformer(
        d_model=config.d_model,
        nhead=config.encoder_attention_heads,
        num_encoder_layers=config.encoder_layers,
        num_decoder_layers=config.decoder_layers,
        dim_feedforward=config.encoder_ffn_dim,
        dropout=0.0,
        activation="relu",
        layer_norm_eps=config.layer_norm_eps,
        batch_first=True,
        norm_first=norm_first,
    ).eval()
    with torch.no_grad():
        for ours, theirs in zip(model.model.encoder.layers, reference.encoder.layers, strict=True):
            _copy_attention(ours.self_attn, theirs.self_attn)
            theirs.linear1.load_state_dict(ours.ffn.fc1.state_dict())
            theirs.linear2.load_state_dict(ours.ffn.fc2.state_dict())
            theirs.norm1.load_state_dict(ours.self_attn_layer_norm.state_dict())
            theirs.norm2.load_state_dict(ours.final_layer_norm.state_dict())
        for ours, theirs in zip(model.model.decoder.layers, reference.decoder.layers, strict=True):
            _copy_attention(ours.self_attn, theirs.self_attn)
            _copy_attention(ours.encoder_attn, theirs.multihead_attn)
            theirs.linear1.load_state_dict(ours.ffn.fc1.state_dict())
            theirs.linear2.load_state_dict(ours.ffn.fc2.state_dict())
            theirs.norm1.load_state_dict(ours.self_attn_layer_norm.state_dict())
            theirs.norm2.load_state_dict(ours.encoder_attn_layer_norm.state_dict())
            theirs.norm3.load_state_dict(ours.final_layer_norm.state_dict())
    if norm_first:
        reference.encoder.norm.load_state_dict(model.model.encoder.layer_norm.state_dict())
        reference.decoder.norm.load_state_dict(model.model.decoder.layer_norm.state_dict())
    else:
        # torch.nn.Transformer adds a LayerNorm after each stack; post-LN (the paper) has none.
        reference.encoder.norm = None
        reference.decoder.norm = None
    return reference


def _randomise(model: nn.Module) -> None:
    """Non-trivial LayerNorm parameters and biases, so that a mis-copied one cannot go unnoticed."""
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "layer_norm" in name or name.endswith("bias"):
                param.add_(0.1 * torch.randn(param.shape, generator=generator))


@pytest.mark.parametrize("pre_layer_norm", [False, True])
def test_logits_equal_torch_nn_transformer_with_copied_weights(pre_layer_norm):
    model = tiny_model(pre_layer_norm=pre_layer_norm)
    _randomise(model)
    reference = _torch_transformer_like(model, norm_first=pre_layer_norm)
    ids = random_ids(3, 11)
    ids[0, 7:] = PAD
    mask = (ids != PAD).long()
    targets = random_ids(3, 8, seed=1)

    def embed(tokens):  # §3.4/§3.5, shared by both stacks
        scaled = model.model.shared(tokens) * math.sqrt(model.config.d_model)
        return scaled + sinusoidal_positions(torch.arange(tokens.shape[1]), model.config.d_model)

    with torch.no_grad():
        ours = model(input_ids=ids, attention_mask=mask, decoder_input_ids=targets).logits
        hidden = reference(
            embed(ids),
            embed(targets),
            tgt_mask=nn.Transformer.generate_square_subsequent_mask(targets.shape[1]),
            src_key_padding_mask=mask == 0,  # torch: True = ignore; HF: 1 = keep
            memory_key_padding_mask=mask == 0,
            tgt_is_causal=True,
        )
        theirs = hidden @ model.model.shared.weight.T
    assert torch.allclose(ours, theirs, atol=1e-5), (ours - theirs).abs().max()


# --- the encoder-decoder cache ----------------------------------------------------------------------------------------


def test_step_by_step_decoding_with_cache_equals_the_full_pass(model):
    ids = random_ids(2, 7)
    targets = torch.cat([torch.full((2, 1), BOS), random_ids(2, 6, seed=1)], dim=1)
    full = model(input_ids=ids, decoder_input_ids=targets).logits
    encoder_outputs = model.get_encoder()(input_ids=ids)
    past = None
    steps = []
    for t in range(targets.shape[1]):
        out = model(
            encoder_outputs=encoder_outputs,
            decoder_input_ids=targets[:, t : t + 1],
            cache=past,
            use_cache=True,
        )
        past = out.cache
        steps.append(out.logits)
    assert past.get_seq_length() == targets.shape[1]
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-5)


def test_the_cache_keyword_of_transformers_before_5_24_still_works(model):
    """transformers 5.24 renamed `past_key_values` to `cache`; callers written for the old name get a warning and
    the same result, as from transformers' own models."""
    ids = random_ids(2, 7)
    encoder_outputs = model.get_encoder()(input_ids=ids)
    start, step = torch.full((2, 1), BOS), random_ids(2, 1, seed=3)
    first = model(encoder_outputs=encoder_outputs, decoder_input_ids=start, use_cache=True).cache
    new = model(encoder_outputs=encoder_outputs, decoder_input_ids=step, cache=first)
    first = model(encoder_outputs=encoder_outputs, decoder_input_ids=start, use_cache=True).cache
    with pytest.warns(FutureWarning, match="past_key_values"):
        old = model(encoder_outputs=encoder_outputs, decoder_input_ids=step, past_key_values=first)
    assert old.cache.get_seq_length() == 2
    torch.testing.assert_close(old.logits, new.logits, rtol=0, atol=0)


@pytest.mark.parametrize("num_beams", [1, 4])
def test_generation_is_the_same_with_and_without_cache(model, num_beams):
    ids = random_ids(3, 6)
    ids[1, 4:] = PAD
    mask = (ids != PAD).long()
    kwargs = dict(attention_mask=mask, max_new_tokens=10, num_beams=num_beams, do_sample=False)
    with_cache = model.generate(ids, use_cache=True, **kwargs)
    without = model.generate(ids, use_cache=False, **kwargs)
    assert torch.equal(with_cache, without)


@pytest.mark.parametrize("num_beams", [1, 4])
def test_cross_attention_keys_and_values_are_projected_once_per_generate(model, num_beams):
    calls = []
    for layer in model.get_decoder().layers:
        layer.encoder_attn.k_proj.register_forward_hook(lambda *a: calls.append("k"))
        layer.encoder_attn.v_proj.register_forward_hook(lambda *a: calls.append("v"))
    out = model.generate(random_ids(2, 6), max_new_tokens=8, min_new_tokens=8, num_beams=num_beams)
    assert out.shape[1] == 9  # eight decoding steps ran
    assert calls.count("k") == calls.count("v") == model.config.decoder_layers


def test_beam_search_reorders_only_the_self_attention_cache_with_the_same_result(model, monkeypatch):
    ids = random_ids(3, 7)
    ids[2, 3:] = PAD
    kwargs = dict(
        attention_mask=(ids != PAD).long(),
        num_beams=4,
        num_return_sequences=2,
        max_new_tokens=12,
        output_scores=True,
        return_dict_in_generate=True,
    )
    lean = model.generate(ids, **kwargs)
    orders = []

    def reorder_everything(cache, beam_idx, filled=None):  # transformers' own: self- and cross-attention caches
        orders.append(beam_idx.clone())
        cache.reorder_cache(beam_idx)
        return cache

    monkeypatch.setattr(model, "_reorder_cache", reorder_everything)
    reference = model.generate(ids, **kwargs)
    assert any(not torch.equal(order, torch.arange(len(order))) for order in orders)  # beams really moved
    assert torch.equal(lean.sequences, reference.sequences)
    assert torch.equal(lean.sequences_scores, reference.sequences_scores)


def test_sampling_with_the_cache_draws_what_sampling_without_it_draws(model):
    sources = random_ids(2, 6)
    torch.manual_seed(0)
    cached = model.generate(sources, do_sample=True, num_beams=1, max_new_tokens=5, top_k=10)
    torch.manual_seed(0)
    uncached = model.generate(sources, do_sample=True, num_beams=1, max_new_tokens=5, top_k=10, use_cache=False)
    assert torch.equal(cached, uncached)
    torch.manual_seed(1)
    assert not torch.equal(model.generate(sources, do_sample=True, num_beams=1, max_new_tokens=5, top_k=10), cached)


# --- attention backends and low precision -----------------------------------------------------------------------------


def test_eager_equals_sdpa_and_returns_weights():
    model = tiny_model()
    ids = random_ids(2, 8)
    ids[0, 5:] = PAD
    mask = (ids != PAD).long()
    targets = random_ids(2, 6, seed=1)
    sdpa = model(input_ids=ids, attention_mask=mask, decoder_input_ids=targets).logits
    model.set_attn_implementation("eager")
    out = model(input_ids=ids, attention_mask=mask, decoder_input_ids=targets, output_attentions=True)
    assert torch.allclose(out.logits, sdpa, atol=1e-5)
    layers, heads = model.config.encoder_layers, model.config.encoder_attention_heads
    assert len(out.encoder_attentions) == layers and out.encoder_attentions[0].shape == (2, heads, 8, 8)
    assert len(out.decoder_attentions) == layers and out.decoder_attentions[0].shape == (2, heads, 6, 6)
    assert len(out.cross_attentions) == layers and out.cross_attentions[0].shape == (2, heads, 6, 8)
    # Padding gets no attention; future target positions get none either.
    assert out.encoder_attentions[0][0, :, :, 5:].abs().max() == 0
    assert torch.triu(out.decoder_attentions[0], diagonal=1).abs().max() == 0
    assert torch.allclose(out.cross_attentions[0].sum(-1), torch.ones(()), atol=1e-5)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_with_an_all_padding_row_has_no_nan(attn, dtype):
    model = tiny_model().to(dtype)
    model.set_attn_implementation(attn)
    ids = random_ids(2, 6)
    ids[1] = PAD  # a source that is nothing but padding
    mask = (ids != PAD).long()
    targets = random_ids(2, 4, seed=1)
    targets[1, 1:] = PAD
    out = model(
        input_ids=ids, attention_mask=mask, decoder_input_ids=targets, decoder_attention_mask=(targets != PAD).long()
    )
    assert not torch.isnan(out.logits).any()
    # The real sentence gets what it gets in float32, within the low precision's rounding.
    reference = tiny_model()(
        input_ids=ids, attention_mask=mask, decoder_input_ids=targets, decoder_attention_mask=(targets != PAD).long()
    ).logits
    torch.testing.assert_close(out.logits[0].float(), reference[0], rtol=0.05, atol=0.05)
    generated = model.generate(ids, attention_mask=mask, max_new_tokens=4, num_beams=2)
    assert not (generated == PAD).all(dim=1).any() and generated.shape[0] == 2


# --- tied embeddings (§3.4), save / load -----------------------------------------------------------------------------


def _tied(model: VanillaTransformerForConditionalGeneration) -> bool:
    shared = model.model.shared.weight
    return (
        model.model.encoder.embed_tokens.weight is shared
        and model.model.decoder.embed_tokens.weight is shared
        and model.lm_head.weight is shared
    )


def test_three_way_tie_after_init(model):
    assert _tied(model)
    names = [name for name, p in model.named_parameters() if p is model.model.shared.weight]
    assert names == ["model.shared.weight"]  # one parameter


def test_untied_output_projection_keeps_source_and_target_shared():
    model = tiny_model(tie_word_embeddings=False)
    assert model.model.encoder.embed_tokens.weight is model.model.decoder.embed_tokens.weight
    assert model.lm_head.weight is not model.model.shared.weight


def test_save_load_is_exact_and_stores_the_matrix_once(model, tmp_path):
    from safetensors import safe_open

    model.save_pretrained(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert "model.shared.weight" in keys
    assert not keys & {"lm_head.weight", "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"}
    assert not any("position" in key for key in keys)

    loaded = VanillaTransformerForConditionalGeneration.from_pretrained(tmp_path).eval()
    assert _tied(loaded)
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    ids, targets = random_ids(2, 7), random_ids(2, 5, seed=1)
    assert torch.equal(
        model(input_ids=ids, decoder_input_ids=targets).logits, loaded(input_ids=ids, decoder_input_ids=targets).logits
    )
    assert loaded.generation_config.num_beams == 4


def test_untied_save_load_keeps_both_matrices(tmp_path):
    model = tiny_model(tie_word_embeddings=False)
    model.save_pretrained(tmp_path)
    loaded = VanillaTransformerForConditionalGeneration.from_pretrained(tmp_path)
    assert torch.equal(loaded.lm_head.weight, model.lm_head.weight)
    assert torch.equal(loaded.model.shared.weight, model.model.shared.weight)
    assert loaded.model.encoder.embed_tokens.weight is loaded.model.decoder.embed_tokens.weight


def test_resize_token_embeddings_keeps_the_tie(model):
    before = model.model.shared.weight[:99].clone()
    model.resize_token_embeddings(120)
    assert _tied(model)
    assert model.config.vocab_size == 120 and model.lm_head.weight.shape == (120, 32)
    assert torch.equal(model.model.shared.weight[:99], before)
    logits = model(input_ids=torch.tensor([[119, 5]]), decoder_input_ids=torch.tensor([[BOS]])).logits
    assert logits.shape[-1] == 120


def test_auto_classes_know_the_model(tmp_path):
    from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

    model = tiny_model()
    model.save_pretrained(tmp_path)
    assert type(AutoConfig.from_pretrained(tmp_path)).__name__ == "VanillaTransformerConfig"
    assert isinstance(AutoModelForSeq2SeqLM.from_pretrained(tmp_path), VanillaTransformerForConditionalGeneration)
    base = AutoModel.from_pretrained(tmp_path)
    assert isinstance(base, VanillaTransformerModel)
    assert torch.equal(base.shared.weight, model.model.shared.weight)


# --- the loss (§5.4) --------------------------------------------------------------------------------------------------


def test_label_smoothed_loss_equals_a_hand_computation():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 5)
    labels = torch.tensor([[1, 4, -100], [0, 2, 3]])
    eps, vocab = 0.1, 5
    total, count = 0.0, 0
    for b in range(2):
        for t in range(3):
            if labels[b, t] == -100:
                continue
            log_p = torch.log_softmax(logits[b, t], -1)
            target = torch.full((vocab,), eps / vocab)
            target[labels[b, t]] += 1 - eps
            total += -(target * log_p).sum().item()
            count += 1
    assert label_smoothed_loss(logits, labels, eps).item() == pytest.approx(total / count, rel=1e-6)
    assert label_smoothed_loss(logits, labels, eps, num_items_in_batch=10).item() == pytest.approx(total / 10, rel=1e-6)


def test_model_loss_leaves_padding_out_of_sum_and_count(model):
    ids = random_ids(2, 6)
    labels = random_ids(2, 5, seed=1)
    labels[0, 3:] = PAD
    as_ignored = labels.masked_fill(labels == PAD, -100)
    a = model(input_ids=ids, labels=labels)
    b = model(input_ids=ids, labels=as_ignored)
    assert torch.equal(a.loss, b.loss)
    expected = label_smoothed_loss(b.logits, as_ignored, 0.1)
    assert torch.allclose(a.loss, expected)


def test_gradient_checkpointing_gives_the_same_gradients():
    ids, labels = random_ids(2, 6), random_ids(2, 5, seed=1)
    grads = []
    for checkpointing in (False, True):
        model = tiny_model().train()
        if checkpointing:
            model.activation_checkpointing_enable()
        model(input_ids=ids, labels=labels).loss.backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads, strict=True):
        assert torch.allclose(a, b, atol=1e-6)


# --- bad input --------------------------------------------------------------------------------------------------------


def test_token_ids_outside_the_vocabulary_are_named(model):
    with pytest.raises(ValueError, match=r"input_ids holds token id 99, outside the vocabulary \[0, 99\)"):
        model(input_ids=torch.tensor([[5, 99]]), decoder_input_ids=torch.tensor([[BOS]]))
    with pytest.raises(ValueError, match="decoder_input_ids holds token id -3"):
        model(input_ids=torch.tensor([[5, 6]]), decoder_input_ids=torch.tensor([[BOS, -3]]))
    with pytest.raises(ValueError, match="labels holds token id 500"):
        model(input_ids=torch.tensor([[5, 6]]), labels=torch.tensor([[4, 500]]))
    with pytest.raises(ValueError, match="input_ids holds token id 1000"):
        model.generate(torch.tensor([[5, 1000]]), max_new_tokens=2)


def test_masks_of_the_wrong_shape_are_named(model):
    ids = random_ids(2, 6)
    with pytest.raises(ValueError, match=r"attention_mask has shape \(2, 5\); expected \(2, 6\)"):
        model(input_ids=ids, attention_mask=torch.ones(2, 5), decoder_input_ids=random_ids(2, 3))
    with pytest.raises(ValueError, match=r"decoder_attention_mask has shape \(2, 4\); expected \(2, 3\)"):
        model(input_ids=ids, decoder_input_ids=random_ids(2, 3), decoder_attention_mask=torch.ones(2, 4))


def test_empty_batches_are_refused(model):
    with pytest.raises(ValueError, match=r"input_ids is empty \(shape \(0, 5\)\)"):
        model(input_ids=torch.zeros(0, 5, dtype=torch.long), decoder_input_ids=torch.zeros(0, 1, dtype=torch.long))
    with pytest.raises(ValueError, match=r"input_ids is empty \(shape \(2, 0\)\)"):
        model(input_ids=torch.zeros(2, 0, dtype=torch.long), decoder_input_ids=torch.ones(2, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="must have shape"):
        model(input_ids=torch.tensor([5, 6]), decoder_input_ids=torch.tensor([[BOS]]))


def test_head_sizes_other_than_d_model_over_h():
    model = tiny_model(d_k=4, d_v=12)
    attn = model.model.encoder.layers[0].self_attn
    assert attn.q_proj.weight.shape == (16, 32) and attn.v_proj.weight.shape == (48, 32)
    assert attn.out_proj.weight.shape == (32, 48)
    ids, targets = random_ids(2, 5), random_ids(2, 4, seed=1)
    eager = tiny_model(d_k=4, d_v=12)
    eager.set_attn_implementation("eager")
    assert torch.allclose(
        model(input_ids=ids, decoder_input_ids=targets).logits,
        eager(input_ids=ids, decoder_input_ids=targets).logits,
        atol=1e-5,
    )


def test_initialisation_follows_the_reference_implementations():
    config = tiny_config(
        d_model=256, encoder_ffn_dim=1024, decoder_ffn_dim=1024, vocab_size=5000, initialization="xavier"
    )
    torch.manual_seed(0)
    model = VanillaTransformerForConditionalGeneration(config)
    assert model.model.shared.weight.std().item() == pytest.approx(256**-0.5, rel=0.02)
    q = model.model.encoder.layers[0].self_attn.q_proj.weight
    assert q.abs().max().item() <= math.sqrt(6 / 512) / math.sqrt(2) + 1e-6  # Xavier-uniform, gain 1/sqrt(2)
    assert q.std().item() == pytest.approx(math.sqrt(2 / 512) / math.sqrt(2), rel=0.05)
    fc1 = model.model.encoder.layers[0].ffn.fc1.weight
    assert fc1.std().item() == pytest.approx(math.sqrt(2 / (256 + 1024)), rel=0.05)
    assert model.model.encoder.layers[0].ffn.fc1.bias.abs().max() == 0


def test_the_normal_initialisation_draws_every_projection_and_the_embedding_from_n_0_002():
    config = tiny_config(
        d_model=256, encoder_ffn_dim=1024, decoder_ffn_dim=1024, vocab_size=5000, initialization="normal"
    )
    torch.manual_seed(0)
    model = VanillaTransformerForConditionalGeneration(config)
    layer = model.model.decoder.layers[0]
    for weight in (
        model.model.shared.weight,
        layer.self_attn.q_proj.weight,
        layer.encoder_attn.v_proj.weight,
        layer.ffn.fc1.weight,
        layer.ffn.fc2.weight,
    ):
        values = weight.detach().flatten().double()
        assert values.mean().item() == pytest.approx(0.0, abs=1e-3)
        assert values.std().item() == pytest.approx(0.02, rel=0.02)
        # A normal draw, not a uniform one: its fourth moment is 3 sigma^4 (a uniform's is 1.8 sigma^4).
        assert (values**4).mean().item() / values.var().item() ** 2 == pytest.approx(3.0, rel=0.05)
    assert layer.ffn.fc1.bias.abs().max() == 0 and layer.final_layer_norm.weight.min() == 1
    assert model.lm_head.weight is model.model.shared.weight  # still the one matrix
    # init_std sets the deviation of every draw.
    torch.manual_seed(0)
    wider = VanillaTransformerForConditionalGeneration(
        tiny_config(
            d_model=256,
            encoder_ffn_dim=1024,
            decoder_ffn_dim=1024,
            vocab_size=5000,
            initialization="normal",
            init_std=0.05,
        )
    )
    assert wider.model.encoder.layers[0].ffn.fc2.weight.std().item() == pytest.approx(0.05, rel=0.02)
    with pytest.raises(ValueError, match="initialization='he' is invalid; expected one of"):
        tiny_config(initialization="he")


def test_a_folder_saved_before_the_initialization_setting_loads_the_same_weights(tmp_path):
    model = tiny_model()
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["initialization"]  # as every folder written before the setting existed
    (tmp_path / "config.json").write_text(json.dumps(config))
    loaded = VanillaTransformerForConditionalGeneration.from_pretrained(tmp_path)
    for (name, value), expected in zip(loaded.state_dict().items(), model.state_dict().values(), strict=True):
        assert torch.equal(value, expected), name


def test_training_mode_projects_only_labelled_positions_with_the_same_loss_and_gradients(monkeypatch):
    ids, labels = random_ids(3, 6), random_ids(3, 7, seed=1)
    labels[0, 4:] = -100
    labels[2, 2:] = PAD
    projected = []
    chunked = loss_vanilla_transformer.linear_label_smoothed_loss

    def spy(hidden, *args, **kwargs):
        projected.append(hidden.shape[0])
        return chunked(hidden, *args, **kwargs)

    monkeypatch.setattr(loss_vanilla_transformer, "linear_label_smoothed_loss", spy)
    results = []
    for training in (False, True):
        model = tiny_model().train(training)  # dropout is 0, so both modes compute the same function
        out = model(input_ids=ids, labels=labels)
        out.loss.backward()
        results.append((out, [p.grad.clone() for p in model.parameters()]))
    (evaluation, eval_grads), (training, train_grads) = results
    assert evaluation.logits.shape == (3, 7, 99) and training.logits is None
    assert projected == [4 + 7 + 2]  # training mode only, and only the labelled positions (padding is -100 too)
    assert torch.allclose(evaluation.loss, training.loss, atol=1e-6)
    for a, b in zip(eval_grads, train_grads, strict=True):
        assert torch.allclose(a, b, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_loss_equals_autograd_over_the_whole_logits(dtype):
    """The chunked loss (gradients computed in its forward pass, chunk by chunk) equals autograd through the
    (tokens, vocabulary) logits: the loss and both gradients, over several chunks and a short last one, with the
    matrix products in `dtype` and the softmax in float32 in both."""
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(23, 16, generator=generator)
    weight = torch.randn(50, 16, generator=generator) * 0.3
    labels = torch.randint(0, 50, (23,), generator=generator)
    results = []
    for chunked in (False, True):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        if chunked:
            total = loss_vanilla_transformer._LinearLabelSmoothedLoss.apply(h, w, labels, 0.1, 5, dtype)
        else:
            logits = (h.to(dtype) @ w.to(dtype).T).float()
            total = torch.nn.functional.cross_entropy(logits, labels, label_smoothing=0.1, reduction="sum")
        (2.5 * total).backward()  # a scaled output gradient reaches both
        results.append((total.detach(), h.grad, w.grad))
    (expected, *expected_grads), (total, *grads) = results
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    assert torch.allclose(total, expected, rtol=1e-5)
    for grad, reference in zip(grads, expected_grads, strict=True):
        assert torch.allclose(grad, reference, rtol=tolerance, atol=tolerance)


def test_layer_norm_runs_in_float32_under_cpu_autocast():
    """With bf16 weights, CPU autocast would run LayerNorm in bf16; the model's normalise in float32 (as on CUDA)."""
    model = tiny_model().to(torch.bfloat16)
    seen = []
    hooks = [
        module.register_forward_hook(lambda module, args, output: seen.append((module, args[0], output)))
        for module in model.modules()
        if isinstance(module, torch.nn.LayerNorm)
    ]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(input_ids=random_ids(2, 6), decoder_input_ids=random_ids(2, 5, seed=1))
    for hook in hooks:
        hook.remove()
    assert len(seen) == 2 * 2 + 2 * 3  # tiny: 2 encoder layers x 2 norms, 2 decoder layers x 3 norms
    assert seen[0][1].dtype == torch.bfloat16  # the first norm gets a bf16 residual stream: the case that matters
    for module, inputs, output in seen:
        assert output.dtype == torch.float32
        expected = torch.nn.functional.layer_norm(
            inputs.float(), module.normalized_shape, module.weight.float(), module.bias.float(), module.eps
        )
        assert torch.equal(output, expected)
    assert torch.isfinite(out.logits).all()
    # Plain nn.LayerNorm would have stayed in bf16 there; outside autocast this one is plain nn.LayerNorm.
    norm, first_input, _ = seen[0]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.nn.LayerNorm.forward(norm, first_input).dtype == torch.bfloat16
    assert norm(first_input).dtype == torch.bfloat16


def test_padding_skips_the_feed_forward_and_changes_nothing_real(monkeypatch):
    """Source padding and trailing target padding skip the FFN; real positions, the loss and every gradient are
    those of the dense computation."""
    model = tiny_model().train()
    ids = random_ids(3, 9)
    ids[0, 4:] = PAD
    ids[2, 7:] = PAD
    labels = random_ids(3, 8, seed=2)
    labels[1, 3:] = -100
    labels[1, 1] = -100  # a hole inside a sentence: position 2 still counts in the loss
    labels[2, 6:] = -100
    inputs = dict(input_ids=ids, attention_mask=(ids != PAD).long(), labels=labels)
    rows = []  # the (tokens, ...) shapes entering the first FFN of the encoder, then of the decoder
    stacks = (model.get_encoder(), model.get_decoder())
    hooks = [stack.layers[0].ffn.fc1.register_forward_hook(lambda m, a, o: rows.append(a[0].shape)) for stack in stacks]

    def run():
        model.zero_grad()
        out = model(**inputs)
        out.loss.backward()
        return out.loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}

    packed_loss, packed_grads = run()
    assert rows[0][0] == int((ids != PAD).sum())  # encoder: only the real source tokens
    # decoder: each sentence up to its last labelled position (row 1 has a hole at 1 that is still computed)
    assert rows[1][0] == 8 + 3 + 6 < labels.numel()
    for module in (modeling_vanilla_transformer, padding_vanilla_transformer):  # the encoder's and the decoder's
        monkeypatch.setattr(module, "real_token_index", lambda keep: None)
    rows.clear()
    dense_loss, dense_grads = run()
    for hook in hooks:
        hook.remove()
    assert [shape[:2] for shape in rows] == [tuple(ids.shape), tuple(labels.shape)]  # the dense path really ran
    assert torch.allclose(packed_loss, dense_loss, atol=1e-6)
    for name, grad in dense_grads.items():
        assert torch.allclose(packed_grads[name], grad, atol=1e-6), name
