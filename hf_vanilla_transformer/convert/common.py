"""What every family's conversion shares: the refusal (`ConversionError`), what a family's reader hands back
(`Conversion`), the renaming of a post-LN layer's weights into ours, the model built and loaded from them, and the
source's decoding settings as a generation config that `generate()` follows as the source did."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import GenerationConfig

from ..model.configuration_vanilla_transformer import VanillaTransformerConfig
from ..model.modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration, sinusoidal_positions


class ConversionError(ValueError):
    """A source this package cannot hold: the message names what is missing or unsupported, in one line."""


@dataclass
class Conversion:
    """A source read and checked, nothing written yet: our config's fields, our weights by our names, the generation
    config, the tokenizer (a transformers tokenizer, saved with the model) and what the model card says of it."""

    family: str  # "marian", "fsmt" or "fairseq"
    source_name: str  # the source folder's or file's name (never a full path: the card may be published)
    config: dict
    weights: dict[str, torch.Tensor]
    generation: dict
    tokenizer: object
    languages: tuple[str | None, str | None] = (None, None)
    notes: list[str] = field(default_factory=list)  # each quirk of this source and how it maps, for the card


# Our layer's names are the names transformers' Marian and FSMT use and fairseq writes, except that our FFN is a
# module of its own (fairseq and transformers: `fc1`, `fc2`; ours: `ffn.fc1`, `ffn.fc2`).
LAYER_PARTS = {
    "encoder": ("self_attn", "self_attn_layer_norm", "fc1", "fc2", "final_layer_norm"),
    "decoder": (
        "self_attn",
        "self_attn_layer_norm",
        "encoder_attn",
        "encoder_attn_layer_norm",
        "fc1",
        "fc2",
        "final_layer_norm",
    ),
}
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "out_proj")


def layer_weights(source: dict[str, torch.Tensor], prefix: str, stack: str, layers: int) -> dict[str, torch.Tensor]:
    """Our weights `model.{stack}.layers.{i}.*` from `source`'s `{prefix}layers.{i}.*` (transformers' and fairseq's
    post-LN names). Raises ConversionError naming the first weight the source lacks."""
    ours = {}
    for index in range(layers):
        for part in LAYER_PARTS[stack]:
            names = [f"{name}.{kind}" for name in PROJECTIONS for kind in ("weight", "bias")]
            names = names if part.endswith("attn") else ["weight", "bias"]
            for name in names:
                key = f"{prefix}layers.{index}.{part}.{name}"
                if key not in source:
                    raise ConversionError(f"the checkpoint has no {key}: not a post-LN transformer layer as expected")
                mine = f"ffn.{part}" if part in ("fc1", "fc2") else part
                ours[f"model.{stack}.layers.{index}.{mine}.{name}"] = source[key]
    return ours


def layer_count(source: dict[str, torch.Tensor], prefix: str) -> int:
    """How many layers `{prefix}layers.{i}.*` the source holds."""
    found = {key[len(prefix) :].split(".")[1] for key in source if key.startswith(f"{prefix}layers.")}
    return len(found)


def embedding_weights(
    config: VanillaTransformerConfig, target: torch.Tensor, source: torch.Tensor | None, output: torch.Tensor | None
) -> dict[str, torch.Tensor]:
    """Our embedding matrices under every name the model gives them: the target (`shared`, the decoder's input,
    the output projection unless `output` is its own), the source (its own where `source` is given)."""
    weights = {"model.shared.weight": target, "model.decoder.embed_tokens.weight": target}
    weights["model.encoder.embed_tokens.weight"] = source if config.source_vocab_size is not None else target
    weights["lm_head.weight"] = target if config.tie_word_embeddings else output
    return weights


POSITION_TOLERANCE = 1e-5  # Marian tabulates its sinusoids in float64, then rounds them to float32


def check_position_table(table: torch.Tensor | None, layout: str, first: int, name: str) -> None:
    """A position table a checkpoint holds must be the sinusoids ours compute (`layout`, rows from `first` on: fairseq
    gives the rows up to its padding id to nothing); anything else (learned or altered positions) this model cannot
    hold. Ours are computed for any length, so the table itself is not kept."""
    if table is None:
        return
    rows = torch.arange(first, table.shape[0])
    expected = sinusoidal_positions(rows, table.shape[-1], layout)
    if not torch.allclose(table[first:].float(), expected, atol=POSITION_TOLERANCE):
        raise ConversionError(f"{name} is not the {layout} sinusoid table: this model has no learned positions")


def build_model(conversion: Conversion) -> VanillaTransformerForConditionalGeneration:
    """Our model holding the conversion's weights, every weight of the model given exactly once (else
    ConversionError naming the missing and unexpected ones), in eval mode, float32."""
    config = VanillaTransformerConfig(**conversion.config)
    with torch.device("meta"):
        model = VanillaTransformerForConditionalGeneration(config)
    expected = set(model.state_dict())
    missing = sorted(expected - set(conversion.weights))
    unexpected = sorted(set(conversion.weights) - expected)
    if missing or unexpected:
        raise ConversionError(f"the weights do not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
    wrong = [
        f"{name} {tuple(conversion.weights[name].shape)} (expected {tuple(tensor.shape)})"
        for name, tensor in model.state_dict().items()
        if tuple(conversion.weights[name].shape) != tuple(tensor.shape)
    ]
    if wrong:
        raise ConversionError(f"weights of the wrong shape: {', '.join(wrong[:3])}")
    weights = {name: tensor.detach().to(torch.float32).contiguous() for name, tensor in conversion.weights.items()}
    model.load_state_dict(weights, strict=True, assign=True)
    model.tie_weights()
    return model.eval()


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise ConversionError(f"{path.name} cannot be read: {error}") from error


def hf_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The weights of a transformers model folder: model.safetensors (or its shards), else pytorch_model.bin read
    with `weights_only=True` (no code in it runs)."""
    from safetensors.torch import load_file

    if (folder / "model.safetensors").exists():
        return load_file(folder / "model.safetensors")
    index = folder / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(read_json(index)["weight_map"].values()))
        return {name: tensor for file in files for name, tensor in load_file(folder / file).items()}
    if (folder / "pytorch_model.bin").exists():
        try:
            return torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
        except Exception as error:  # a pickle that needs more than tensors: refused, nothing of it run
            raise ConversionError(f"pytorch_model.bin holds more than tensors: {str(error).splitlines()[0]}") from error
    raise ConversionError(f"{folder.name} holds no model.safetensors or pytorch_model.bin")


def strip_model_prefix(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The weights of a transformers `*ForConditionalGeneration` by its base model's names (`model.` dropped)."""
    return {name.removeprefix("model."): tensor for name, tensor in weights.items()}


# Generation settings a converted model takes from its source: the search, its length rule, forced and banned tokens.
GENERATION_FIELDS = (
    "num_beams",
    "length_penalty",
    "early_stopping",
    "max_length",
    "max_new_tokens",
    "min_length",
    "no_repeat_ngram_size",
    "repetition_penalty",
    "bad_words_ids",
    "suppress_tokens",
    "forced_bos_token_id",
    "forced_eos_token_id",
    "renormalize_logits",
    "num_return_sequences",
    "do_sample",
)


def source_generation(settings: dict, config: dict) -> dict:
    """Our generation config's fields from the source's decoding `settings`: its search and length rule as they
    are (transformers' length penalty |Y|^alpha, `length_penalty_type="hf"`, and its absolute `max_length` instead
    of the paper's input + 50, `relative_max_length=None`), with our config's special tokens."""
    kept = {name: settings[name] for name in GENERATION_FIELDS if settings.get(name) is not None}
    return {
        **kept,
        "length_penalty_type": "hf",
        "relative_max_length": None,
        "bos_token_id": config.get("bos_token_id"),
        "eos_token_id": config["eos_token_id"],
        "pad_token_id": config["pad_token_id"],
        "decoder_start_token_id": config["decoder_start_token_id"],
    }


def folder_generation(folder: Path, raw_config: dict) -> dict:
    """A transformers folder's decoding settings: its generation_config.json, else the generation keys that older
    folders kept in config.json."""
    if (folder / "generation_config.json").exists():
        return GenerationConfig.from_pretrained(folder).to_dict()
    return {name: raw_config[name] for name in GENERATION_FIELDS if name in raw_config}


def single_token_id(name: str, value) -> int | None:
    """A special token id as our config holds it: one id (transformers allows a list of end tokens; we do not)."""
    if isinstance(value, list):
        if len(value) != 1:
            raise ConversionError(f"{name}={value}: this model has one {name.removesuffix('_id')}, not several")
        value = value[0]
    return value
