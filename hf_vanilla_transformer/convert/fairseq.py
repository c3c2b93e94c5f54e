"""A fairseq checkpoint of the `transformer` family (transformer_wmt_en_de, transformer_vaswani_wmt_en_de_big,
transformer_iwslt_de_en, ...) read into a `Conversion`, with its dictionaries and BPE codes.

* **Loading runs no code** (`fairseq_checkpoint.py`: `torch.load(weights_only=True)`, the few classes a checkpoint
  holds allowed by name, every other refused before anything of it runs).
* **Its layout**: fairseq's names are FSMT's (`encoder.layers.0.self_attn.q_proj.weight`, ...); older checkpoints
  (fairseq before 0.7) keep each attention's three input projections in one `in_proj_weight` and their LayerNorms
  as `layer_norms.0/1/2`, which are mapped as fairseq itself upgrades them. The output projection is
  `decoder.output_projection.weight` (or the older `decoder.embed_out`) unless it shares the target embedding. The
  layer counts and embedding widths the arguments give are checked against the weights, and every weight the mapping
  does not take is refused by name (a LayerNorm after a stack or on the embeddings, NormFormer's scales, a layer
  beyond the count); only the version counters, the positions' placeholder buffer and an old checkpoint's table of
  fairseq's own sinusoids (checked) are left out.
* **Its arguments** choose the variant: fairseq's positions (`sinusoid_layout="fairseq"`), one matrix for source and
  target (`share_all_embeddings`) or a source embedding of its own (`source_vocab_size`), the output projection
  shared with the target embedding (`share_decoder_input_output_embed`), embeddings scaled (unless
  `no_scale_embedding`). Booleans are read by one reader (`flag`: "False" is False everywhere). Options this model
  lacks are refused by name (`UNSUPPORTED_FLAGS`, `UNSUPPORTED_VALUES`), and so is an architecture whose defaults
  are such an option (`transformer_wmt_en_de_big_t2t`: pre-LN) where the arguments do not override them.
* **Its text pipeline** (`--tokenizer`, `--bpe` and their flags) is read from the checkpoint and honoured by the
  tokenizer, or refused by name (`fairseq_tokenizer.py`).
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from ..model.configuration_vanilla_transformer import VanillaTransformerConfig
from .common import (
    Conversion,
    ConversionError,
    check_position_tables,
    checked_layer_counts,
    embedding_weights,
    layer_weights,
    refuse_unconsumed,
    same_weights,
    source_generation,
)
from .fairseq_checkpoint import checkpoint_arguments, checkpoint_languages, flag, load_checkpoint
from .fairseq_tokenizer import SPECIAL_IDS, fairseq_tokenizer, read_dictionary, text_pipeline


# fairseq's `transformer` architectures and their defaults (fairseq/models/transformer/transformer_legacy.py): what
# an argument missing from a checkpoint means. Every other architecture is refused.
BASE = dict(embed_dim=512, ffn_embed_dim=2048, layers=6, attention_heads=8, dropout=0.1)
BIG = dict(BASE, embed_dim=1024, ffn_embed_dim=4096, attention_heads=16)
ARCHITECTURES = {
    "transformer": BASE,
    "transformer_tiny": dict(BASE, embed_dim=64, ffn_embed_dim=64, layers=2, attention_heads=2),
    "transformer_wmt_en_de": BASE,
    "transformer_iwslt_de_en": dict(BASE, ffn_embed_dim=1024, attention_heads=4),
    "transformer_vaswani_wmt_en_de_big": dict(BIG, dropout=0.3),
    "transformer_vaswani_wmt_en_fr_big": BIG,
    "transformer_wmt_en_de_big": dict(BIG, dropout=0.3),
    # tensor2tensor's later default: pre-LN, which this model holds only where the arguments turn it off
    "transformer_wmt_en_de_big_t2t": dict(BIG, encoder_normalize_before=True, decoder_normalize_before=True),
}
# Flags this model holds off only: (argument, what it turned on would need).
UNSUPPORTED_FLAGS = (
    ("encoder_normalize_before", "pre-LN encoder layers"),
    ("decoder_normalize_before", "pre-LN decoder layers"),
    ("encoder_learned_pos", "learned positions"),
    ("decoder_learned_pos", "learned positions"),
    ("no_token_positional_embeddings", "a Transformer without positions"),
    ("layernorm_embedding", "a LayerNorm on the embeddings"),
    ("adaptive_input", "adaptive input embeddings"),
    ("cross_self_attention", "cross+self attention"),
    ("no_cross_attention", "a decoder without encoder-decoder attention"),
    ("char_inputs", "character inputs"),
    *((f"scale_{part}", "NormFormer's extra LayerNorms and scales") for part in ("attn", "fc", "heads", "resids")),
)
# Options this model holds unset only: (argument, what a value would need).
UNSUPPORTED_VALUES = (
    ("adaptive_softmax_cutoff", "an adaptive softmax"),
    ("encoder_layers_to_keep", "pruned layers"),
    ("decoder_layers_to_keep", "pruned layers"),
    ("base_layers", "BASE layers"),
)
# fairseq-generate's defaults as transformers' settings: beam 5, lenpen 1 (|Y|^1), at most max_len_b=200 tokens and
# then </s> (202 with the start token), at least one token before </s> (min_len 1), never <pad>.
DECODING = dict(
    num_beams=5,
    length_penalty=1.0,
    early_stopping=True,
    max_length=202,
    min_length=2,
    forced_eos_token_id=SPECIAL_IDS["eos_token_id"],
    suppress_tokens=[SPECIAL_IDS["pad_token_id"]],
)


def fairseq_config(args: dict, vocab_size: int, source_vocab_size: int | None) -> dict:
    """Our config's fields from fairseq's arguments; raises ConversionError naming an option this model lacks."""
    arch = args.get("arch", args.get("_name"))  # newer checkpoints: cfg["model"]["_name"]
    if arch not in ARCHITECTURES:
        raise ConversionError(
            f"arch={arch!r} is not one of fairseq's transformer encoder-decoders ({', '.join(ARCHITECTURES)})"
        )
    defaults = ARCHITECTURES[arch]
    _check_options(args, arch, defaults)

    def side(stack: str, key: str):
        return args.get(f"{stack}_{key}", defaults[key])

    width = side("encoder", "embed_dim")
    for key in ("decoder_embed_dim", "decoder_output_dim", "decoder_input_dim"):
        if args.get(key, width) != width:
            raise ConversionError(f"{key}={args[key]} differs from encoder_embed_dim={width}: one d_model is needed")
    return dict(
        vocab_size=vocab_size,
        source_vocab_size=source_vocab_size,
        d_model=width,
        **{f"{stack}_layers": side(stack, "layers") for stack in ("encoder", "decoder")},
        **{f"{stack}_attention_heads": side(stack, "attention_heads") for stack in ("encoder", "decoder")},
        **{f"{stack}_ffn_dim": side(stack, "ffn_embed_dim") for stack in ("encoder", "decoder")},
        dropout=float(args.get("dropout", defaults["dropout"])),
        attention_dropout=float(args.get("attention_dropout", 0.0)),
        activation_dropout=float(args.get("activation_dropout", args.get("relu_dropout", 0.0))),
        activation_function=_activation(args.get("activation_fn", "relu")),
        scale_embedding=not flag(args, "no_scale_embedding"),
        tie_word_embeddings=flag(args, "share_decoder_input_output_embed") or flag(args, "share_all_embeddings"),
        layer_norm_eps=1e-5,
        sinusoid_layout="fairseq",
        **SPECIAL_IDS,
    )


def _check_options(args: dict, arch: str, defaults: dict) -> None:
    """Refuse, by name, a flag this model holds off only that is on (in the arguments, or by the architecture's
    default where they lack it), and an option it holds unset only that has a value."""
    for key, needs in UNSUPPORTED_FLAGS:
        if flag(args, key, defaults.get(key, False)):
            named = f"{key}={args[key]!r}" if key in args else f"arch={arch!r} (its default {key}=True)"
            raise ConversionError(f"{named}: this model cannot hold {needs} ({key})")
    for key, needs in UNSUPPORTED_VALUES:
        if args.get(key) not in (None, 0, "", []):
            raise ConversionError(f"{key}={args[key]!r}: this model cannot hold {needs} ({key})")


def _activation(name: str) -> str:
    """fairseq's activation names as transformers' (`gelu_accurate` is transformers' tanh form, `gelu_new`)."""
    names = {"relu": "relu", "gelu": "gelu", "gelu_fast": "gelu_new", "gelu_accurate": "gelu_new", "tanh": "tanh"}
    if name not in names:
        raise ConversionError(f"activation_fn={name!r}: this model has {sorted(names)}")
    return names[name]


def upgraded_weights(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Older fairseq names as fairseq upgrades them: `in_proj_weight` / `in_proj_bias` split into q, k, v (in that
    order) and `layer_norms.N` named by what they normalise. Every other entry is kept as it is (what no mapping
    takes is refused later, by name)."""
    encoder_norms = ("self_attn_layer_norm", "final_layer_norm")
    decoder_norms = ("self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm")
    upgraded = {}
    for name, tensor in weights.items():
        match = re.match(r"(.*)\.in_proj_(weight|bias)$", name)
        if match:
            for part, chunk in zip(("q_proj", "k_proj", "v_proj"), tensor.chunk(3), strict=True):
                upgraded[f"{match.group(1)}.{part}.{match.group(2)}"] = chunk
            continue
        match = re.match(r"(encoder|decoder)(\.layers\.\d+)\.layer_norms\.(\d)\.(weight|bias)$", name)
        if match:
            norms = encoder_norms if match.group(1) == "encoder" else decoder_norms
            name = f"{match.group(1)}{match.group(2)}.{norms[int(match.group(3))]}.{match.group(4)}"
        upgraded[name] = tensor
    return upgraded


def fairseq_conversion(
    checkpoint: Path, source_dict: Path | None = None, target_dict: Path | None = None, bpe_codes: Path | None = None
) -> Conversion:
    """Read and check a fairseq checkpoint with its dictionaries (default: `dict.{source_lang}.txt` and
    `dict.{target_lang}.txt` beside it) and BPE codes (default: the file its arguments name, `bpecodes` or `code`
    beside it)."""
    state = load_checkpoint(checkpoint)
    args = checkpoint_arguments(state)
    languages = checkpoint_languages(state, args)
    folder = checkpoint.parent
    source_dict = source_dict or folder / f"dict.{languages[0]}.txt"
    target_dict = target_dict or folder / f"dict.{languages[1]}.txt"
    source_words, target_words = read_dictionary(source_dict), read_dictionary(target_dict)
    shared = flag(args, "share_all_embeddings")
    config = fairseq_config(args, len(target_words), None if shared else len(source_words))
    pipeline = text_pipeline(state, args, languages)  # refused before the weights are read where it cannot be held
    weights = upgraded_weights(state["model"])
    checked_layer_counts(weights, (config["encoder_layers"], config["decoder_layers"]), "the arguments say")
    ours, consumed = layer_weights(weights, config)
    embeddings, taken = _embeddings(weights, config, shared, (source_dict.name, target_dict.name))
    # fairseq before 0.7 could keep its sinusoids' table (`embed_positions.weights`); later ones a placeholder buffer.
    first = SPECIAL_IDS["pad_token_id"] + 1
    checked = check_position_tables(weights, "embed_positions.weights", "fairseq", first, config["d_model"])
    refuse_unconsumed(weights, consumed | taken | checked)
    return Conversion(
        family="fairseq",
        source_name=checkpoint.name if folder.name in ("", ".") else f"{folder.name}/{checkpoint.name}",
        config=config,
        weights=ours | embeddings,
        generation=source_generation(DECODING, config),
        tokenizer=fairseq_tokenizer(source_words, target_words, pipeline, bpe_codes, folder),
        languages=languages,
        notes=_notes(args, config) + list(pipeline.notes),
    )


def _embeddings(
    weights: dict, config: dict, shared: bool, dictionaries: tuple[str, str]
) -> tuple[dict[str, torch.Tensor], set[str]]:
    """The embedding matrices, checked against the dictionaries' sizes, the width and the sharing the arguments
    claim; with the names they consumed."""
    names = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")
    if any(name not in weights for name in names):
        raise ConversionError("the checkpoint lacks encoder.embed_tokens.weight or decoder.embed_tokens.weight")
    source, target = weights[names[0]], weights[names[1]]
    rows = {"encoder": (source, config["source_vocab_size"] or config["vocab_size"], dictionaries[0])}
    rows["decoder"] = (target, config["vocab_size"], dictionaries[1])
    for stack, (matrix, size, name) in rows.items():
        if matrix.shape[0] != size:
            raise ConversionError(f"{name} has {size} symbols but the {stack} embedding {matrix.shape[0]} rows")
        if matrix.shape[1] != config["d_model"]:
            raise ConversionError(
                f"the {stack} embedding is {matrix.shape[1]} wide but the arguments say {stack}_embed_dim="
                f"{config['d_model']}"
            )
    taken = set(names)
    if shared:
        taken |= same_weights(weights, names, names[1], "but share_all_embeddings is set")
    # The output projection: the target embedding where the arguments share it (fairseq saves it under the output's
    # name too, which must then be the same matrix), else its own (under one name or both, the same matrix).
    outputs = ("decoder.output_projection.weight", "decoder.embed_out")
    found = [name for name in outputs if name in weights]
    output = names[1] if config["tie_word_embeddings"] else found[0] if found else None
    if output is None:
        raise ConversionError("the checkpoint has no output projection (decoder.output_projection.weight)")
    why = "but the arguments share it with the target embedding" if config["tie_word_embeddings"] else "both outputs"
    taken |= {output} | same_weights(weights, outputs, output, why)
    matrix = None if config["tie_word_embeddings"] else weights[output]
    return embedding_weights(VanillaTransformerConfig(**config), target, source, matrix), taken


def _notes(args: dict, config: dict) -> list[str]:
    return [
        f"fairseq arch {args.get('arch', args.get('_name'))}: post-LN, fairseq's sinusoids (`sinusoid_layout='fairseq'`)",
        "embeddings: one matrix for source and target"
        if config["source_vocab_size"] is None
        else "embeddings: a source embedding of its own (`source_vocab_size`)",
        f"output projection: {'the target embedding' if config['tie_word_embeddings'] else 'its own'}",
        "decoding starts from `</s>` (id 2); beam 5, lenpen 1, at most 200 tokens: fairseq-generate's defaults",
    ]
