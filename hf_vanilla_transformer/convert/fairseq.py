"""A fairseq checkpoint of the `transformer` family (transformer_wmt_en_de, transformer_vaswani_wmt_en_de_big,
transformer_iwslt_de_en, ...) read into a `Conversion`, with its dictionaries and BPE codes.

* **Loading runs no code.** A checkpoint is a pickle; it is read with `torch.load(weights_only=True)`, which builds
  tensors and plain containers only, plus the few classes a fairseq checkpoint holds (`ALLOWED`: the `argparse`
  Namespace of its arguments, numpy's scalars in its training state). Any other class or function the pickle names
  is refused by name, before anything of it runs.
* **Its layout**: fairseq's names are FSMT's (`encoder.layers.0.self_attn.q_proj.weight`, ...); older checkpoints
  (fairseq before 0.7) keep each attention's three input projections in one `in_proj_weight` and their LayerNorms
  as `layer_norms.0/1/2`, which are mapped as fairseq itself upgrades them. The output projection is
  `decoder.output_projection.weight` (or the older `decoder.embed_out`) unless it shares the target embedding.
* **Its arguments** choose the variant: fairseq's positions (`sinusoid_layout="fairseq"`), one matrix for source and
  target (`share_all_embeddings`) or a source embedding of its own (`source_vocab_size`), the output projection
  shared with the target embedding (`share_decoder_input_output_embed`), embeddings scaled (unless
  `no_scale_embedding`). Options this model lacks are refused by name (`UNSUPPORTED`).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import torch

from ..model.configuration_vanilla_transformer import VanillaTransformerConfig
from .common import Conversion, ConversionError, embedding_weights, layer_weights, source_generation
from .fairseq_tokenizer import SPECIAL_IDS, fairseq_tokenizer, read_dictionary


def allowed_globals() -> list:
    """The classes a fairseq checkpoint's pickle may name besides tensors and containers."""
    import numpy as np

    core = getattr(np, "_core", None) or np.core
    scalar = core.multiarray.scalar
    dtypes = [type(np.dtype(name)) for name in ("float64", "float32", "int64", "int32", "bool")]
    # numpy 2 names its scalar constructor numpy._core.multiarray.scalar; checkpoints pickled under numpy 1 name it
    # numpy.core.multiarray.scalar: both names are the same function.
    return [argparse.Namespace, scalar, (scalar, "numpy.core.multiarray.scalar"), np.dtype, *dtypes]


def load_checkpoint(path: Path) -> dict:
    """The checkpoint's contents, read without running any code: a class or function outside `allowed_globals()`
    is refused (ConversionError naming it)."""
    try:
        with torch.serialization.safe_globals(allowed_globals()):
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        named = re.search(r"GLOBAL ([\w.]+)", str(error))
        if named:
            raise ConversionError(
                f"{path.name} names {named.group(1)} in its pickle, which a fairseq checkpoint does not need: refused "
                "without running it (allowed: tensors, containers, argparse.Namespace, numpy scalars)"
            ) from None
        raise ConversionError(f"{path.name} cannot be read as a checkpoint: {str(error).splitlines()[0]}") from None
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise ConversionError(f"{path.name} has no 'model' weights: not a fairseq checkpoint")
    return state


def checkpoint_arguments(state: dict) -> dict:
    """The model's arguments: `args` (a Namespace) of older checkpoints, `cfg["model"]` of newer ones."""
    args = state.get("args")
    if args is None and isinstance(state.get("cfg"), dict):
        args = state["cfg"].get("model")
    if isinstance(args, argparse.Namespace):
        return vars(args)
    if isinstance(args, dict):
        return args
    raise ConversionError("the checkpoint holds no model arguments (neither 'args' nor cfg['model'])")


# fairseq's `transformer` architectures and their defaults (fairseq/models/transformer/transformer_legacy.py): what
# an argument missing from a checkpoint means. Every other architecture is refused.
BASE = dict(embed_dim=512, ffn_embed_dim=2048, layers=6, attention_heads=8, dropout=0.1)
ARCHITECTURES = {
    "transformer": BASE,
    "transformer_wmt_en_de": BASE,
    "transformer_iwslt_de_en": dict(BASE, ffn_embed_dim=1024, attention_heads=4),
    "transformer_vaswani_wmt_en_de_big": dict(
        BASE, embed_dim=1024, ffn_embed_dim=4096, attention_heads=16, dropout=0.3
    ),
    "transformer_vaswani_wmt_en_fr_big": dict(BASE, embed_dim=1024, ffn_embed_dim=4096, attention_heads=16),
    "transformer_wmt_en_de_big": dict(BASE, embed_dim=1024, ffn_embed_dim=4096, attention_heads=16, dropout=0.3),
    "transformer_wmt_en_de_big_t2t": dict(BASE, embed_dim=1024, ffn_embed_dim=4096, attention_heads=16),
}
# (argument, the value this model holds, what another value would need)
UNSUPPORTED = (
    ("encoder_normalize_before", False, "pre-LN encoder layers (encoder_normalize_before)"),
    ("decoder_normalize_before", False, "pre-LN decoder layers (decoder_normalize_before)"),
    ("encoder_learned_pos", False, "learned positions (encoder_learned_pos)"),
    ("decoder_learned_pos", False, "learned positions (decoder_learned_pos)"),
    ("no_token_positional_embeddings", False, "a Transformer without positions (no_token_positional_embeddings)"),
    ("layernorm_embedding", False, "a LayerNorm on the embeddings (layernorm_embedding)"),
    ("adaptive_softmax_cutoff", None, "an adaptive softmax (adaptive_softmax_cutoff)"),
    ("adaptive_input", False, "adaptive input embeddings (adaptive_input)"),
    ("cross_self_attention", False, "cross+self attention (cross_self_attention)"),
    ("no_cross_attention", False, "a decoder without encoder-decoder attention (no_cross_attention)"),
    ("encoder_layers_to_keep", None, "pruned layers (encoder_layers_to_keep)"),
    ("decoder_layers_to_keep", None, "pruned layers (decoder_layers_to_keep)"),
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
    for key, holds, needs in UNSUPPORTED:
        if args.get(key, holds) not in (holds, "False"):  # fairseq's oldest arguments hold booleans as text
            raise ConversionError(f"{key}={args[key]!r}: this model has no {needs}")
    defaults = ARCHITECTURES[arch]

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
        scale_embedding=not args.get("no_scale_embedding", False),
        tie_word_embeddings=bool(args.get("share_decoder_input_output_embed") or args.get("share_all_embeddings")),
        layer_norm_eps=1e-5,
        sinusoid_layout="fairseq",
        **SPECIAL_IDS,
    )


def _activation(name: str) -> str:
    """fairseq's activation names as transformers' (`gelu_accurate` is transformers' tanh form, `gelu_new`)."""
    names = {"relu": "relu", "gelu": "gelu", "gelu_fast": "gelu_new", "gelu_accurate": "gelu_new", "tanh": "tanh"}
    if name not in names:
        raise ConversionError(f"activation_fn={name!r}: this model has {sorted(names)}")
    return names[name]


def upgraded_weights(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Older fairseq names as fairseq upgrades them: `in_proj_weight` / `in_proj_bias` split into q, k, v (in that
    order) and `layer_norms.N` named by what they normalise. Position buffers and version counters are dropped."""
    encoder_norms = ("self_attn_layer_norm", "final_layer_norm")
    decoder_norms = ("self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm")
    upgraded = {}
    for name, tensor in weights.items():
        if name.endswith((".version", "embed_positions._float_tensor", "embed_positions.weights")):
            continue
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
    `dict.{target_lang}.txt` beside it) and BPE codes (default: `bpecodes` or `code` beside it)."""
    state = load_checkpoint(checkpoint)
    args = checkpoint_arguments(state)
    languages = (args.get("source_lang"), args.get("target_lang"))
    folder = checkpoint.parent
    source_dict = source_dict or folder / f"dict.{languages[0]}.txt"
    target_dict = target_dict or folder / f"dict.{languages[1]}.txt"
    source_words, target_words = read_dictionary(source_dict), read_dictionary(target_dict)
    weights = upgraded_weights(state["model"])
    shared = bool(args.get("share_all_embeddings"))
    config = fairseq_config(args, len(target_words), None if shared else len(source_words))
    ours = layer_weights(weights, "encoder.", "encoder", config["encoder_layers"])
    ours |= layer_weights(weights, "decoder.", "decoder", config["decoder_layers"])
    ours |= _embeddings(weights, config, shared, (source_dict.name, target_dict.name))
    tokenizer = fairseq_tokenizer(source_words, target_words, languages, bpe_codes, folder)
    return Conversion(
        family="fairseq",
        source_name=checkpoint.name if folder.name in ("", ".") else f"{folder.name}/{checkpoint.name}",
        config=config,
        weights=ours,
        generation=source_generation(DECODING, config),
        tokenizer=tokenizer,
        languages=languages,
        notes=_notes(args, config),
    )


def _embeddings(weights: dict, config: dict, shared: bool, dictionaries: tuple[str, str]) -> dict:
    """The embedding matrices, checked against the dictionaries' sizes and against the sharing the arguments claim."""
    source, target = weights.get("encoder.embed_tokens.weight"), weights.get("decoder.embed_tokens.weight")
    if source is None or target is None:
        raise ConversionError("the checkpoint lacks encoder.embed_tokens.weight or decoder.embed_tokens.weight")
    rows = {"encoder": (source, config["source_vocab_size"] or config["vocab_size"], dictionaries[0])}
    rows["decoder"] = (target, config["vocab_size"], dictionaries[1])
    for stack, (matrix, size, name) in rows.items():
        if matrix.shape[0] != size:
            raise ConversionError(f"{name} has {size} symbols but the {stack} embedding {matrix.shape[0]} rows")
    if shared and not torch.equal(source, target):
        raise ConversionError("share_all_embeddings is set but the encoder and decoder embeddings differ")
    output = weights.get("decoder.output_projection.weight", weights.get("decoder.embed_out"))
    if not config["tie_word_embeddings"] and output is None:
        raise ConversionError("the checkpoint has no output projection (decoder.output_projection.weight)")
    return embedding_weights(VanillaTransformerConfig(**config), target, source, output)


def _notes(args: dict, config: dict) -> list[str]:
    return [
        f"fairseq arch {args.get('arch')}: post-LN, fairseq's sinusoids (`sinusoid_layout='fairseq'`)",
        "embeddings: one matrix for source and target"
        if config["source_vocab_size"] is None
        else "embeddings: a source embedding of its own (`source_vocab_size`)",
        f"output projection: {'the target embedding' if config['tie_word_embeddings'] else 'its own'}",
        "decoding starts from `</s>` (id 2); beam 5, lenpen 1, at most 200 tokens: fairseq-generate's defaults",
    ]
