"""The configuration: the paper's defaults, the presets, and a clear error for every impossible value."""

from __future__ import annotations

import pytest

from hf_vanilla_transformer import PRESETS, VanillaTransformerConfig, VanillaTransformerForConditionalGeneration


def test_defaults_are_the_paper_base_model():
    config = VanillaTransformerConfig()
    # §3.1-§3.4, §5.4, Table 3 "base".
    assert (config.d_model, config.encoder_layers, config.decoder_layers) == (512, 6, 6)
    assert (config.encoder_attention_heads, config.decoder_attention_heads) == (8, 8)
    assert (config.encoder_ffn_dim, config.decoder_ffn_dim) == (2048, 2048)
    assert config.head_dims(config.encoder_attention_heads) == (64, 64)
    assert config.dropout == 0.1 and config.attention_dropout == 0.0 and config.activation_dropout == 0.0
    assert config.activation_function == "relu"
    assert config.scale_embedding and config.tie_word_embeddings
    assert config.label_smoothing == 0.1
    assert not config.pre_layer_norm
    assert config.position_embedding_type == "sinusoidal" and config.sinusoid_layout == "interleaved"
    assert config.is_encoder_decoder and config.model_type == "vanilla_transformer"
    assert config.hidden_size == 512  # generic HF names resolve through attribute_map


def test_presets():
    big = VanillaTransformerConfig.from_preset("big")
    assert (big.d_model, big.encoder_ffn_dim, big.encoder_attention_heads, big.dropout) == (1024, 4096, 16, 0.3)
    assert big.head_dims(16) == (64, 64)
    assert VanillaTransformerConfig.from_preset("base").to_dict() == VanillaTransformerConfig().to_dict()
    tiny = VanillaTransformerConfig.from_preset("tiny", dropout=0.0)
    assert tiny.d_model == 32 and tiny.dropout == 0.0
    assert set(PRESETS) >= {"base", "big", "tiny"}
    with pytest.raises(ValueError, match="'huge'"):
        VanillaTransformerConfig.from_preset("huge")


def test_options_beyond_the_paper_are_single_fields():
    config = VanillaTransformerConfig(
        pre_layer_norm=True,
        sinusoid_layout="concat",
        position_embedding_type="learned",
        max_position_embeddings=512,
        tie_word_embeddings=False,
        d_k=32,
        d_v=48,
    )
    assert config.head_dims(8) == (32, 48)
    # Each option is one field, and each reaches the model it builds.
    model = VanillaTransformerForConditionalGeneration(config)
    layer = model.model.encoder.layers[0]
    assert type(layer).__name__ == "VanillaTransformerPreLNEncoderLayer"
    assert model.model.encoder.layer_norm is not None  # pre-LN ends each stack with a LayerNorm
    assert model.model.encoder.embed_positions.weight.shape == (512, 512)
    assert layer.self_attn.q_proj.out_features == 8 * 32 and layer.self_attn.v_proj.out_features == 8 * 48
    assert model.lm_head.weight.data_ptr() != model.model.shared.weight.data_ptr()  # untied output projection
    assert config.sinusoid_layout == "concat"


@pytest.mark.parametrize(
    "field, value",
    [
        ("vocab_size", 0),
        ("d_model", -512),
        ("d_model", 512.0),
        ("encoder_layers", 0),
        ("decoder_layers", True),
        ("encoder_attention_heads", 0),
        ("decoder_attention_heads", 7),  # 512 % 7 != 0 and no explicit d_k/d_v
        ("encoder_ffn_dim", 0),
        ("d_k", 0),
        ("d_v", -1),
        ("dropout", 1.0),
        ("attention_dropout", -0.1),
        ("activation_dropout", "0.1"),
        ("label_smoothing", 1.5),
        ("activation_function", "swishy"),
        ("layer_norm_eps", 0.0),
        ("init_std", -1.0),
        ("position_embedding_type", "rotary"),
        ("sinusoid_layout", "sideways"),
        ("max_position_embeddings", 0),
        ("max_position_embeddings", -5),
        ("pre_layer_norm", "yes"),
        ("pad_token_id", 37000),
        ("eos_token_id", -1),
        ("decoder_start_token_id", None),
    ],
)
def test_invalid_values_raise_value_error_naming_them(field, value):
    with pytest.raises(ValueError, match=field):
        VanillaTransformerConfig(**{field: value})


def test_learned_positions_need_a_maximum():
    with pytest.raises(ValueError, match="max_position_embeddings=None"):
        VanillaTransformerConfig(position_embedding_type="learned")
    config = VanillaTransformerConfig(position_embedding_type="learned", max_position_embeddings=256)
    assert (config.position_embedding_type, config.max_position_embeddings) == ("learned", 256)
    model = VanillaTransformerForConditionalGeneration(
        VanillaTransformerConfig.from_preset("tiny", position_embedding_type="learned", max_position_embeddings=16)
    )
    assert model.model.encoder.embed_positions.weight.shape == (16, 32)


def test_heads_need_not_divide_d_model_with_explicit_head_sizes():
    config = VanillaTransformerConfig(d_model=30, encoder_attention_heads=4, decoder_attention_heads=4, d_k=8, d_v=8)
    assert config.head_dims(4) == (8, 8)


def test_round_trip_through_json(tmp_path):
    config = VanillaTransformerConfig.from_preset("tiny", sinusoid_layout="concat", label_smoothing=0.2)
    config.save_pretrained(tmp_path)
    loaded = VanillaTransformerConfig.from_pretrained(tmp_path)
    assert loaded.to_dict() == config.to_dict()
