"""A MarianMTModel folder (the opus-mt family) read into a `Conversion`.

Marian is this model with four quirks, each one field of our config:

* positions: the sinusoids tabulated in `[sin | cos]` halves with the paper's frequencies (`sinusoid_layout="concat"`;
  the table in the checkpoint is checked against ours, then dropped: ours are computed for any length);
* the FFN activation is usually `swish` (`activation_function`, any of transformers' activations);
* `final_logits_bias`, a bias on the output logits (`output_bias`, where it is not zero);
* special tokens: `</s>`=0, `<pad>` the last id, decoding starts from `<pad>` (the four `*_token_id` fields).

The tokenizer is the folder's `MarianTokenizer` (source.spm, target.spm, vocab.json), saved as it is.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..model.configuration_vanilla_transformer import VanillaTransformerConfig
from .common import (
    PERMUTED_FROM,
    Conversion,
    ConversionError,
    check_position_tables,
    checked_layer_counts,
    embedding_weights,
    folder_generation,
    hf_weights,
    layer_weights,
    permute_residual,
    read_json,
    refuse_unconsumed,
    residual_permutation,
    same_weights,
    single_token_id,
    source_generation,
    source_tokenizer,
    strip_model_prefix,
)


# Options older Marian folders keep in config.json that would describe another model than the post-LN one
# MarianMTModel computes (transformers' conversion refused them too): (key, the value this model holds, what the other
# value would need).
UNSUPPORTED = (
    ("normalize_before", False, "pre-LN layers with a final LayerNorm (normalize_before)"),
    ("add_final_layer_norm", False, "a LayerNorm after the last layer (add_final_layer_norm)"),
    ("normalize_embedding", False, "a LayerNorm on the embeddings (normalize_embedding)"),
    ("static_position_embeddings", True, "learned positions (static_position_embeddings=False)"),
)


def marian_conversion(folder: Path) -> Conversion:
    """Read and check the MarianMTModel folder `folder`; raises ConversionError naming what this model lacks."""
    raw = read_json(folder / "config.json")
    _check_options(raw)
    weights = strip_model_prefix(hf_weights(folder))
    config = _config(raw, weights)
    ours, consumed = layer_weights(weights, config)
    embeddings, taken = _embeddings(weights, config)
    ours |= embeddings
    if config["output_bias"]:
        ours["lm_head.bias"] = weights["final_logits_bias"].reshape(-1)
    checked = check_position_tables(weights, "embed_positions.weight", "concat", 0, config["d_model"])
    refuse_unconsumed(weights, consumed | taken | checked | {"final_logits_bias"})
    restored = raw.get(PERMUTED_FROM) == "interleaved"
    if restored:  # written by `export --format marian` from the paper's layout: permuted back, the same weights
        ours = permute_residual(ours, torch.argsort(residual_permutation(config["d_model"])))
        config["sinusoid_layout"] = "interleaved"
    tokenizer = _tokenizer(folder)
    notes = [
        "positions: the paper's interleaved sinusoids, the weights permuted back from the `[sin | cos]` layout "
        "`export --format marian` wrote them in (the same weights as the model exported)"
        if restored
        else "positions: Marian's `[sin | cos]` sinusoids (`sinusoid_layout='concat'`), computed instead of tabulated",
        f"activation: {config['activation_function']}",
        "output bias: Marian's final_logits_bias (`output_bias=True`)"
        if config["output_bias"]
        else "output bias: Marian's final_logits_bias is zero, left out",
        f"special tokens: `</s>`={config['eos_token_id']}, `<pad>`={config['pad_token_id']}, decoding starts from "
        f"id {config['decoder_start_token_id']}",
    ]
    languages = (getattr(tokenizer, "source_lang", None), getattr(tokenizer, "target_lang", None))
    return Conversion(
        family="marian",
        source_name=folder.name,
        config=config,
        weights=ours,
        generation=source_generation(folder_generation(folder, raw), config),
        tokenizer=tokenizer,
        languages=languages,
        notes=notes,
    )


def _check_options(raw: dict) -> None:
    if raw.get("model_type") != "marian":
        raise ConversionError(f"config.json has model_type {raw.get('model_type')!r}; expected 'marian'")
    for key, holds, needs in UNSUPPORTED:
        if key in raw and raw[key] != holds:
            raise ConversionError(f"{key}={raw[key]!r}: this model has no {needs}")


def _config(raw: dict, weights: dict[str, torch.Tensor]) -> dict:
    """Our config's fields for the Marian config `raw` (transformers' defaults where a key is absent)."""
    from transformers import MarianConfig

    marian = MarianConfig.from_dict(raw)
    shared = marian.share_encoder_decoder_embeddings
    bias = weights.get("final_logits_bias")
    config = dict(
        vocab_size=marian.vocab_size if shared else marian.decoder_vocab_size,
        source_vocab_size=None if shared else marian.vocab_size,
        d_model=marian.d_model,
        encoder_layers=marian.encoder_layers,
        decoder_layers=marian.decoder_layers,
        encoder_attention_heads=marian.encoder_attention_heads,
        decoder_attention_heads=marian.decoder_attention_heads,
        encoder_ffn_dim=marian.encoder_ffn_dim,
        decoder_ffn_dim=marian.decoder_ffn_dim,
        dropout=float(marian.dropout),
        attention_dropout=float(marian.attention_dropout),
        activation_dropout=float(marian.activation_dropout),
        activation_function=marian.activation_function,
        scale_embedding=marian.scale_embedding,
        tie_word_embeddings=marian.tie_word_embeddings,
        output_bias=bias is not None and bool(bias.any()),
        layer_norm_eps=1e-5,  # torch's LayerNorm default, which Marian's layers use
        sinusoid_layout="concat",
        pad_token_id=marian.pad_token_id,
        bos_token_id=single_token_id("bos_token_id", marian.bos_token_id),
        eos_token_id=single_token_id("eos_token_id", marian.eos_token_id),
        decoder_start_token_id=marian.decoder_start_token_id,
    )
    checked_layer_counts(weights, (marian.encoder_layers, marian.decoder_layers), "config.json says")
    return config


def _embeddings(weights: dict[str, torch.Tensor], config: dict) -> tuple[dict[str, torch.Tensor], set[str]]:
    """The one shared matrix (or, without `share_encoder_decoder_embeddings`, the source's and the target's), and
    an untied output projection where the config unties it; with the source names they consumed (a copy of the
    shared matrix under another name must equal it)."""
    shared = config["source_vocab_size"] is None
    # Folders written by transformers 5 hold the shared matrix once (shared.weight); older ones under each name.
    names = ("shared.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight")
    target_name = next((name for name in names[:2] if name in weights), None) if shared else names[2]
    source_name = None if shared else names[1]
    if target_name not in weights or (source_name is not None and source_name not in weights):
        raise ConversionError("the checkpoint lacks its token embeddings (shared.weight or *.embed_tokens.weight)")
    taken = {target_name, source_name} - {None}
    if shared:
        taken |= same_weights(weights, names, target_name, "but share_encoder_decoder_embeddings is set")
    if config["tie_word_embeddings"]:
        taken |= same_weights(weights, ("lm_head.weight",), target_name, "but tie_word_embeddings is set")
    elif "lm_head.weight" not in weights:
        raise ConversionError("tie_word_embeddings=False but the checkpoint has no lm_head.weight")
    else:
        taken.add("lm_head.weight")
    target, source = weights[target_name], weights.get(source_name)
    output = None if config["tie_word_embeddings"] else weights["lm_head.weight"]
    return embedding_weights(VanillaTransformerConfig(**config), target, source, output), taken


def _tokenizer(folder: Path):
    """The folder's MarianTokenizer (it needs `sentencepiece`: `pip install hf-vanilla-transformer[convert]`), or,
    where the folder holds a `tokenizer.json` and no SentencePiece models (a folder of `export --format marian`), its
    fast tokenizer, of a class transformers ships."""
    if (folder / "tokenizer.json").is_file() and not (folder / "source.spm").exists():
        return source_tokenizer(folder, "AutoTokenizer", ("tokenizer.json",), "tokenizers")
    return source_tokenizer(folder, "MarianTokenizer", ("source.spm", "target.spm", "vocab.json"), "sentencepiece")
