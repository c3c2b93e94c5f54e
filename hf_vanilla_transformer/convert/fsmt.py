"""An FSMT folder (fairseq's WMT19 systems in transformers: facebook/wmt19-en-de, ...) read into a `Conversion`.

FSMT is fairseq's post-LN Transformer, so its quirks are fairseq's, each one field of our config:

* positions: fairseq's sinusoids (`sinusoid_layout="fairseq"`): `[sin | cos]`, frequencies 10000^(-i / (d/2 - 1)),
  positions counted from padding id + 1;
* a source vocabulary and embedding of its own (`source_vocab_size`) where the encoder's embedding is not the
  decoder's, and an output projection of its own (`tie_word_embeddings=False`) where it is not the decoder's
  embedding: decided from the weights themselves;
* decoding starts from `</s>` (`decoder_start_token_id=2`), fairseq's special tokens otherwise.

The tokenizer is the folder's `FSMTTokenizer` (Moses, then BPE: vocab-src.json, vocab-tgt.json, merges.txt).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..model.configuration_vanilla_transformer import VanillaTransformerConfig
from .common import (
    Conversion,
    ConversionError,
    check_position_tables,
    checked_layer_counts,
    embedding_weights,
    folder_generation,
    hf_weights,
    layer_weights,
    read_json,
    refuse_unconsumed,
    single_token_id,
    source_generation,
    source_tokenizer,
    strip_model_prefix,
)


def fsmt_conversion(folder: Path) -> Conversion:
    """Read and check the FSMT folder `folder`; raises ConversionError naming what this model lacks."""
    from transformers import FSMTConfig

    raw = read_json(folder / "config.json")
    if raw.get("model_type") != "fsmt":
        raise ConversionError(f"config.json has model_type {raw.get('model_type')!r}; expected 'fsmt'")
    fsmt = FSMTConfig.from_dict(raw)
    weights = strip_model_prefix(hf_weights(folder))
    source, target = weights.get("encoder.embed_tokens.weight"), weights.get("decoder.embed_tokens.weight")
    if source is None or target is None:
        raise ConversionError("the checkpoint lacks encoder.embed_tokens.weight or decoder.embed_tokens.weight")
    output = weights.get("decoder.output_projection.weight", target)
    own_source = not torch.equal(source, target)
    config = dict(
        vocab_size=fsmt.tgt_vocab_size,
        source_vocab_size=fsmt.src_vocab_size if own_source else None,
        d_model=fsmt.d_model,
        encoder_layers=fsmt.encoder_layers,
        decoder_layers=fsmt.decoder_layers,
        encoder_attention_heads=fsmt.encoder_attention_heads,
        decoder_attention_heads=fsmt.decoder_attention_heads,
        encoder_ffn_dim=fsmt.encoder_ffn_dim,
        decoder_ffn_dim=fsmt.decoder_ffn_dim,
        dropout=float(fsmt.dropout),
        attention_dropout=float(fsmt.attention_dropout),
        activation_dropout=float(fsmt.activation_dropout),
        activation_function=fsmt.activation_function,
        scale_embedding=fsmt.scale_embedding,
        tie_word_embeddings=torch.equal(output, target),
        layer_norm_eps=1e-5,  # torch's LayerNorm default, which FSMT's layers use
        sinusoid_layout="fairseq",
        pad_token_id=fsmt.pad_token_id,
        bos_token_id=fsmt.bos_token_id,
        eos_token_id=single_token_id("eos_token_id", fsmt.eos_token_id),
        decoder_start_token_id=fsmt.decoder_start_token_id,
    )
    if tuple(source.shape) != (fsmt.src_vocab_size, fsmt.d_model):
        raise ConversionError(f"encoder.embed_tokens.weight {tuple(source.shape)} does not match src_vocab_size")
    checked_layer_counts(weights, (fsmt.encoder_layers, fsmt.decoder_layers), "config.json says")
    ours, consumed = layer_weights(weights, config)
    ours |= embedding_weights(VanillaTransformerConfig(**config), target, source, output)
    consumed |= {"encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "decoder.output_projection.weight"}
    first = fsmt.pad_token_id + 1  # fairseq's positions count from the padding id on
    consumed |= check_position_tables(weights, "embed_positions.weight", "fairseq", first, fsmt.d_model)
    refuse_unconsumed(weights, consumed)
    return Conversion(
        family="fsmt",
        source_name=folder.name,
        config=config,
        weights=ours,
        generation=source_generation(folder_generation(folder, raw), config),
        tokenizer=_tokenizer(folder, fsmt.langs),
        languages=tuple(fsmt.langs) if len(fsmt.langs) == 2 else (None, None),
        notes=_notes(config),
    )


def _notes(config: dict) -> list[str]:
    return [
        "positions: fairseq's sinusoids (`sinusoid_layout='fairseq'`): `[sin | cos]`, frequencies "
        "10000^(-i / (d_model/2 - 1)), counted from padding id + 1",
        f"source embedding: {'its own (`source_vocab_size`)' if config['source_vocab_size'] else 'the target one'}",
        f"output projection: {'the target embedding' if config['tie_word_embeddings'] else 'its own'}",
        f"decoding starts from `</s>` (id {config['decoder_start_token_id']}), as in fairseq",
    ]


def _tokenizer(folder: Path, langs):
    """The folder's FSMTTokenizer (it needs `sacremoses`: `pip install hf-vanilla-transformer[convert]`)."""
    files = ("vocab-src.json", "vocab-tgt.json", "merges.txt")
    return source_tokenizer(folder, "FSMTTokenizer", files, "sacremoses", langs=list(langs))
