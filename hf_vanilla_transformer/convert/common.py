"""What every family's conversion shares: the refusal (`ConversionError`), what a family's reader hands back
(`Conversion`), the renaming of a post-LN layer's weights into ours, the model built and loaded from them, and the
source's decoding settings as a generation config that `generate()` follows as the source did."""

from __future__ import annotations

import json
import re
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


def layer_sources(prefix: str, stack: str, layers: int) -> dict[str, str]:
    """Our names `model.{stack}.layers.{i}.*` and the source's names `{prefix}layers.{i}.*` they are read from
    (transformers' and fairseq's post-LN names)."""
    names = {}
    for index in range(layers):
        for part in LAYER_PARTS[stack]:
            kinds = [f"{name}.{kind}" for name in PROJECTIONS for kind in ("weight", "bias")]
            kinds = kinds if part.endswith("attn") else ["weight", "bias"]
            mine = f"ffn.{part}" if part in ("fc1", "fc2") else part
            for kind in kinds:
                names[f"model.{stack}.layers.{index}.{mine}.{kind}"] = f"{prefix}layers.{index}.{part}.{kind}"
    return names


def layer_weights(source: dict[str, torch.Tensor], config: dict) -> tuple[dict[str, torch.Tensor], set[str]]:
    """Our weights of both stacks' layers (`config`'s counts) from the source's `encoder.layers.{i}.*` and
    `decoder.layers.{i}.*`, and the source names they consumed. Raises ConversionError naming the first weight the
    source lacks."""
    names = {}
    for stack in ("encoder", "decoder"):
        names |= layer_sources(f"{stack}.", stack, config[f"{stack}_layers"])
    for key in names.values():
        if key not in source:
            raise ConversionError(f"the checkpoint has no {key}: not a post-LN transformer layer as expected")
    return {ours: source[key] for ours, key in names.items()}, set(names.values())


# Where a MarianMTModel config.json written by `export --format marian` says the paper's layout was permuted into
# Marian's: the Marian conversion reads it and permutes back, so that ours -> Marian -> ours gives the same weights
# (a note, no code).
PERMUTED_FROM = "sinusoids_permuted_from"


def residual_permutation(d_model: int, layout: str = "interleaved") -> torch.Tensor:
    """The permutation `p` of the model dimension with Marian's feature j = ours p[j]: Marian's first half holds
    the sines (ours at even features), its second half the cosines (ours at odd ones); the identity for a model in
    Marian's own layout (`"concat"`)."""
    if layout == "concat":
        return torch.arange(d_model)
    half = d_model // 2
    return torch.cat([torch.arange(half) * 2, torch.arange(half) * 2 + 1])


# The kinds of our weights that read the residual stream (their input features) and that write or normalize it (their
# output features and biases): the two sides of a permutation of the model dimension (`permute_residual`).
READS_RESIDUAL = ("q_proj", "k_proj", "v_proj", "fc1")
WRITES_RESIDUAL = (
    "out_proj",
    "fc2",
    "self_attn_layer_norm",
    "encoder_attn_layer_norm",
    "final_layer_norm",
    "layer_norm",
)


def permute_residual(weights: dict[str, torch.Tensor], p: torch.Tensor) -> dict[str, torch.Tensor]:
    """Our weights (by our names) with the model dimension permuted: feature j of the new residual stream is feature
    p[j] of the old. LayerNorm, attention and the FFN are equivariant to such a permutation, and the embeddings (and
    an untied output projection) follow it, so every logit stays the same; the position encodings must follow it too
    (Marian's `[sin | cos]` halves are the paper's interleaved sinusoids permuted: `marian_export.py`). A bias of a
    projection that reads the stream, and every matrix of another kind, stay as they are."""
    permuted = {}
    for name, tensor in weights.items():
        parts = name.split(".")
        kind = parts[-2] if len(parts) >= 2 else ""
        if name.endswith("embed_tokens.weight") or name.endswith("shared.weight") or name == "lm_head.weight":
            permuted[name] = tensor[:, p]
        elif kind in READS_RESIDUAL:
            permuted[name] = tensor[:, p] if parts[-1] == "weight" else tensor
        elif kind in WRITES_RESIDUAL:
            permuted[name] = tensor[p]
        else:
            permuted[name] = tensor
    return permuted


def layer_count(source: dict[str, torch.Tensor], prefix: str) -> int:
    """How many layers `{prefix}layers.{i}.*` the source holds."""
    found = {key[len(prefix) :].split(".")[1] for key in source if key.startswith(f"{prefix}layers.")}
    return len(found)


def checked_layer_counts(source: dict[str, torch.Tensor], declared: tuple[int, int], says: str) -> None:
    """The encoder's and decoder's layer counts the source's configuration `declared` (`says`: "config.json says"),
    which its weights must hold: a layer more or less is a model other than the one its configuration describes."""
    found = (layer_count(source, "encoder."), layer_count(source, "decoder."))
    if found != tuple(declared):
        raise ConversionError(f"the weights hold {found[0]} + {found[1]} layers; {says} {declared[0]} + {declared[1]}")


def embedding_weights(
    config: VanillaTransformerConfig, target: torch.Tensor, source: torch.Tensor | None, output: torch.Tensor | None
) -> dict[str, torch.Tensor]:
    """Our embedding matrices under every name the model gives them: the target (`shared`, the decoder's input,
    the output projection unless `output` is its own), the source (its own where `source` is given)."""
    weights = {"model.shared.weight": target, "model.decoder.embed_tokens.weight": target}
    weights["model.encoder.embed_tokens.weight"] = source if config.source_vocab_size is not None else target
    weights["lm_head.weight"] = target if config.tie_word_embeddings else output
    return weights


def check_position_tables(source: dict[str, torch.Tensor], key: str, layout: str, first: int, width: int) -> set[str]:
    """The position tables `{stack}.{key}` a checkpoint holds, each checked to be the sinusoids ours compute
    (`check_position_table`); returns the names checked (consumed: ours are computed for any length instead)."""
    checked = set()
    for stack in ("encoder", "decoder"):
        name = f"{stack}.{key}"
        if name in source:
            check_position_table(source[name], layout, first, width, name)
            checked.add(name)
    return checked


def check_position_table(table: torch.Tensor, layout: str, first: int, width: int, name: str) -> None:
    """A position table must be the sinusoids ours compute (`layout`, rows from `first` on: fairseq gives the rows up
    to its padding id to nothing), computed as the source computed them (Marian: float64, then rounded to float32;
    fairseq: in float32), and equal to them up to the rounding of the type it is stored in (one unit in the last
    place of 1.0: 1.2e-7 in float32, 9.8e-4 in float16). Anything else (learned or altered positions) this model
    cannot hold."""
    if table.dim() != 2 or table.shape[1] != width or not table.is_floating_point():
        raise ConversionError(f"{name} {tuple(table.shape)} {table.dtype} is no table of {width}-wide positions")
    rows = torch.arange(first, table.shape[0])
    difference = (table[first:].double() - sinusoidal_positions(rows, width, layout).double()).abs()
    tolerance = torch.finfo(table.dtype).eps
    if difference.numel() and difference.max() > tolerance:
        row, column = divmod(int(difference.argmax()), width)
        raise ConversionError(
            f"{name} is not the {layout} sinusoid table: row {row + first}, column {column} differs by "
            f"{difference.max():.3g} (rounding to {table.dtype} is at most {tolerance:.3g}); this model has no "
            "learned positions"
        )


# What a checkpoint holds besides weights: fairseq's version counters and its positions' placeholder buffer.
BOOKKEEPING = re.compile(r"(^|\.)(version|_float_tensor)$")


def refuse_unconsumed(source: dict[str, torch.Tensor], consumed: set[str]) -> None:
    """Every weight of the source that the conversion neither took nor checked is refused, by name: a weight left
    out silently (a LayerNorm after the stack, one on the embeddings, a layer beyond the count) is a model changed
    silently. Only the bookkeeping entries (`BOOKKEEPING`) are left out."""
    left = sorted(name for name in source if name not in consumed and not BOOKKEEPING.search(name))
    if left:
        more = f" and {len(left) - 5} more" if len(left) > 5 else ""
        raise ConversionError(f"the checkpoint holds weights this model has no place for: {', '.join(left[:5])}{more}")


def same_weights(source: dict[str, torch.Tensor], names: tuple[str, ...], reference: str, why: str) -> set[str]:
    """The copies `names` of the matrix `reference` the source holds (a shared matrix saved under several names);
    each must equal it, else ConversionError naming it and `why` it must ("but tie_word_embeddings is set"). Returns
    the names found."""
    found = {name for name in names if name in source and name != reference}
    for name in sorted(found):
        if not torch.equal(source[name], source[reference]):
            raise ConversionError(f"{name} differs from {reference}, {why}")
    return found


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
        return {name: tensor for file in shard_files(index) for name, tensor in load_file(file).items()}
    if (folder / "pytorch_model.bin").exists():
        try:
            return torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
        except Exception as error:  # a pickle that needs more than tensors: refused, nothing of it run
            raise ConversionError(f"pytorch_model.bin holds more than tensors: {str(error).splitlines()[0]}") from error
    raise ConversionError(f"{folder.name} holds no model.safetensors or pytorch_model.bin")


def shard_files(index: Path) -> list[Path]:
    """The shards a sharded folder's index names, each a file of the folder itself: a name with a folder in it, an
    absolute path or a link leading out of the folder is refused (ConversionError naming it), never read."""
    weight_map = read_json(index).get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(file, str) for file in weight_map.values()):
        raise ConversionError(f"{index.name} has no weight_map of weight names to shard file names")
    folder = index.parent.resolve()
    shards = []
    for name in sorted(set(weight_map.values())):
        path = index.parent / name
        if Path(name).name != name or path.resolve().parent != folder or not path.is_file():
            raise ConversionError(
                f"{index.name} names the shard {name!r}, which is not a file of {index.parent.name}: refused"
            )
        shards.append(path)
    return shards


def source_tokenizer(folder: Path, class_name: str, files: tuple[str, ...], needs: str, **kwargs):
    """The source folder's own transformers tokenizer (`class_name`, read from `files`; `kwargs` to its
    `from_pretrained`). Whatever of the folder's tokenizer_config.json the class does not define is left out when the
    converted folder is saved (`data.tokenizer.save_tokenizer`). ConversionError where a file is missing, the library
    it needs (`needs`) is not installed, or the folder's tokenizer configuration does not load."""
    missing = [name for name in files if not (folder / name).exists()]
    if missing:
        raise ConversionError(f"no {class_name} in {folder.name}: {', '.join(missing)} missing")
    try:
        import transformers

        return getattr(transformers, class_name).from_pretrained(folder, **kwargs)
    except ImportError as error:
        raise ConversionError(f"the {class_name} needs {needs} ({error}); pip install {needs}") from error
    except (TypeError, ValueError, OSError) as error:
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ConversionError(f"the {class_name} of {folder.name} does not load: {first}") from error


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
