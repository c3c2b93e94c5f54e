"""A trained model folder as a stock MarianMTModel folder (`vanilla-transformer export MODEL_DIR OUT --format
marian`): `AutoModelForSeq2SeqLM.from_pretrained(OUT)` loads it with no remote code, and so do the tools that read
what transformers ships (ONNX graphs in Optimum's layout, written with it: `deploy/onnx_marian.py`; transformers.js, which
runs them in a web page). CTranslate2's own converter reads a MarianMTModel as Marian NMT writes one (a last `<pad>`
it drops, the decoder started from a zero vector), which a model started from `<s>`'s learned embedding is not: it
refuses these folders, and the package's CTranslate2 export (`deploy/ctranslate2.py`) is the way there.

transformers' MarianMTModel is this package's post-LN encoder-decoder with one shared embedding matrix scaled by
sqrt(d_model), sinusoidal positions and a final-logits bias. What differs is a layout and a rule, and the mapping is
exact:

* **positions**: Marian tabulates its sinusoids as `[sin | cos]` halves, ours interleave them (§3.5). The permutation
  of the model dimension that takes one to the other (`residual_permutation`) is applied to every weight that reads
  or writes the residual stream: the embedding's columns, the inputs of every query, key, value and first FFN
  projection, the outputs (and biases) of every attention output and second FFN projection, every LayerNorm's weight
  and bias. LayerNorm, attention and the FFN are equivariant to it, and the tied output projection follows the
  embedding, so every logit is the same. Marian's table has `max_positions` rows (`max_position_embeddings`);
  ours are computed for any length.
* **decoding**: Marian's `generate()` ranks beams by transformers' length penalty |Y|^α, not GNMT's
  ((5 + |Y|) / 6)^α (§6.1): the folder's α is GNMT's mapped at a typical length (`ctranslate2_alpha`: the same rule,
  measured) unless one is given, and its length limit is the table's, not the input's + 50.
* the output bias: ours (a converted model's) or zero; the special tokens: ours (`<s>`=0 starts the decoder).

A model this mapping cannot hold exactly (pre-LN layers, learned or fairseq-layout positions, heads of another width,
a source vocabulary of its own, another LayerNorm epsilon) is refused in one line naming what (`MarianExportError`).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path

import torch

from ..data.tokenizer import TOKENIZER_FILES
from ..deploy.ctranslate2 import ctranslate2_alpha
from ..deploy.rules import recorded_decoding
from ..model.configuration_vanilla_transformer import VanillaTransformerConfig
from ..model.layers_vanilla_transformer import sinusoidal_positions
from ..model.modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from ..sharing.reading import RefusedFile, open_model_folder
from .common import PERMUTED_FROM, permute_residual, residual_permutation


MARIAN_LAYER_NORM_EPS = 1e-5  # torch's default, which every LayerNorm of MarianMTModel uses
DEFAULT_MAX_POSITIONS = 1024
# The tokenizer classes whose files are `tokenizer.json` alone: written as the name every reader knows.
FAST_TOKENIZER_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")
STOCK_TOKENIZER_CLASS = "PreTrainedTokenizerFast"


class MarianExportError(ValueError):
    """A model the MarianMTModel layout cannot hold exactly: the message names what, in one line."""


def check_exportable(config) -> None:
    """Raise MarianExportError naming the first field of `config` that MarianMTModel cannot hold exactly."""
    heads = (config.encoder_attention_heads, config.decoder_attention_heads)
    refusals = [
        (config.pre_layer_norm, "pre_layer_norm=True: MarianMTModel's layers are post-LN, with no final LayerNorm"),
        (
            config.position_embedding_type != "sinusoidal",
            f"position_embedding_type={config.position_embedding_type!r}: MarianMTModel's positions are sinusoids",
        ),
        (
            config.sinusoid_layout not in ("interleaved", "concat"),
            f"sinusoid_layout={config.sinusoid_layout!r}: MarianMTModel's sinusoids have the paper's frequencies from "
            "position 0 (fairseq's have others, from the padding id on)",
        ),
        (
            config.d_model % 2 != 0,
            f"d_model={config.d_model}: MarianMTModel's halves of sines and cosines need it even",
        ),
        (
            any(config.head_dims(h) != (config.d_model // h,) * 2 or config.d_model % h for h in heads),
            f"d_k={config.d_k}, d_v={config.d_v} with {heads[0]}/{heads[1]} heads: MarianMTModel's heads are "
            "d_model / heads wide",
        ),
        (
            config.source_vocab_size is not None,
            f"source_vocab_size={config.source_vocab_size}: a source vocabulary of its own is not exported; models "
            "with one vocabulary are",
        ),
        (
            not math.isclose(config.layer_norm_eps, MARIAN_LAYER_NORM_EPS),
            f"layer_norm_eps={config.layer_norm_eps:g}: MarianMTModel's LayerNorms use {MARIAN_LAYER_NORM_EPS:g}",
        ),
    ]
    for refused, why in refusals:
        if refused:
            raise MarianExportError(f"this model cannot be a MarianMTModel folder: {why}.")


# The fields MarianConfig names as ours does, copied as they are.
SHARED_CONFIG_FIELDS = (
    "vocab_size", "tie_word_embeddings", "d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads",
    "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim", "activation_function", "dropout",
    "attention_dropout", "activation_dropout", "scale_embedding", "pad_token_id", "eos_token_id", "bos_token_id",
    "decoder_start_token_id",
)  # fmt: skip


def marian_config(config, max_positions: int) -> dict:
    """The MarianConfig of `config` (checked by `check_exportable`) with a position table of `max_positions` rows."""
    permuted = {PERMUTED_FROM: config.sinusoid_layout} if config.sinusoid_layout != "concat" else {}
    return dict(
        **permuted,
        **{name: getattr(config, name) for name in SHARED_CONFIG_FIELDS},
        model_type="marian",
        architectures=["MarianMTModel"],
        decoder_vocab_size=config.vocab_size,
        share_encoder_decoder_embeddings=True,
        max_position_embeddings=max_positions,
        forced_eos_token_id=None,
        is_encoder_decoder=True,
    )


def marian_weights(model: VanillaTransformerForConditionalGeneration, max_positions: int) -> dict[str, torch.Tensor]:
    """`model`'s weights under MarianMTModel's names, permuted into its layout (module docstring,
    `permute_residual`), with its position tables of `max_positions` rows and its final-logits bias."""
    config = model.config
    p = residual_permutation(config.d_model, config.sinusoid_layout)
    ours = permute_residual({name: tensor.detach().float() for name, tensor in model.state_dict().items()}, p)
    weights = {name.replace(".ffn.fc", ".fc"): tensor for name, tensor in ours.items() if ".layers." in name}
    weights["model.shared.weight"] = ours["model.shared.weight"]
    for stack in ("encoder", "decoder"):
        weights[f"model.{stack}.embed_tokens.weight"] = ours["model.shared.weight"]
        table = sinusoidal_positions(torch.arange(max_positions), config.d_model, "concat")
        weights[f"model.{stack}.embed_positions.weight"] = table
    weights["lm_head.weight"] = ours["lm_head.weight"]
    bias = ours.get("lm_head.bias")
    weights["final_logits_bias"] = (bias if bias is not None else torch.zeros(config.vocab_size)).reshape(1, -1)
    return weights


def marian_alpha(generation) -> float:
    """The transformers length penalty α for a folder whose decoding is `generation`'s: GNMT's α mapped at a typical
    target length (`ctranslate2_alpha`), or transformers' α as it is."""
    decoding = recorded_decoding(generation)
    return ctranslate2_alpha(decoding["length_penalty"], decoding["length_penalty_type"])


def build_marian(model_dir: str | Path, max_positions: int = DEFAULT_MAX_POSITIONS):
    """(the MarianMTModel holding the model folder `model_dir`'s weights, the folder's model): checked, permuted and
    loaded, every weight given (strict)."""
    from transformers import MarianConfig, MarianMTModel

    if max_positions < 2:
        raise ValueError(f"max_positions={max_positions} is invalid; expected at least 2.")
    model_dir = Path(model_dir)
    if not (model_dir / "config.json").exists():
        raise FileNotFoundError(f"{model_dir} holds no config.json; expected a model folder saved by this package.")
    config = VanillaTransformerConfig.from_pretrained(model_dir)
    check_exportable(config)  # refused before any weight is read
    ours = VanillaTransformerForConditionalGeneration.from_pretrained(model_dir, config=config, dtype=torch.float32)
    ours.eval()
    marian = MarianMTModel(MarianConfig(**marian_config(ours.config, max_positions))).eval()
    marian.load_state_dict(marian_weights(ours, max_positions), strict=True)
    return marian, ours


def export_marian(
    model_dir: str | Path,
    output_dir: str | Path,
    max_positions: int = DEFAULT_MAX_POSITIONS,
    length_penalty: float | None = None,
    onnx: bool = False,
) -> Path:
    """Write the model folder `model_dir` as a stock MarianMTModel folder `output_dir` (new, or empty): config,
    safetensors weights, the tokenizer as `tokenizer.json` with a stock class, a generation config (beam search, the
    transformers α `length_penalty`, default `marian_alpha`) and a card (README.md) saying what differs; with `onnx`,
    its graphs in Optimum's layout too (`deploy/onnx_marian.py`). Written under a temporary name beside it and renamed into
    place when complete."""
    output = Path(output_dir)
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise FileExistsError(f"{output} exists and is not an empty folder; choose a new output folder.")
    marian, ours = build_marian(model_dir, max_positions)
    alpha = marian_alpha(ours.generation_config) if length_penalty is None else float(length_penalty)
    marian.generation_config = marian_generation(ours, alpha, max_positions)
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    try:
        with open_model_folder(model_dir) as folder:
            _write_tokenizer(folder, staging, max_positions)
            results = folder.json("results.json") if folder.exists("results.json") else None
        marian.save_pretrained(staging)
        _note_fp32(staging)
        if onnx:
            from ..deploy.onnx_marian import export_marian_onnx

            export_marian_onnx(marian, staging)
        facts = _facts(Path(model_dir), ours, results, alpha, max_positions, onnx, length_penalty is None)
        (staging / "README.md").write_text(marian_card(facts), encoding="utf-8")
        os.chmod(staging, 0o777 & ~_umask())  # a folder as any other the user makes (mkdtemp's is private)
        if output.exists():
            output.rmdir()  # empty, checked above
        os.replace(staging, output)
    except RefusedFile as error:
        shutil.rmtree(staging, ignore_errors=True)
        raise MarianExportError(f"{model_dir}: {error}; nothing was written.") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return output


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def marian_generation(ours, alpha: float, max_positions: int):
    """The exported folder's GenerationConfig: the search and the limits of ours that transformers' generate()
    follows (its beams, banned and forced tokens, penalties), transformers' length penalty `alpha` where it searches
    with beams, the table's length as its limit (ours adds at most 50 tokens to the input's length, which stock
    transformers cannot say), and our special tokens."""
    from transformers import GenerationConfig

    from .common import GENERATION_FIELDS

    given, config = ours.generation_config.to_diff_dict(), ours.config  # what the folder set, not the defaults
    kept = {name: given[name] for name in GENERATION_FIELDS if given.get(name) is not None}
    kept.pop("max_new_tokens", None)
    kept["max_length"] = min(kept.get("max_length") or max_positions, max_positions)
    if (kept.get("num_beams") or 1) > 1:
        kept["length_penalty"] = alpha
        kept.setdefault("early_stopping", True)
    else:  # a greedy search has no length penalty nor early stopping (transformers refuses to save them)
        for name in ("length_penalty", "early_stopping"):
            kept.pop(name, None)
    ids = {
        "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_id,
        "pad_token_id": config.pad_token_id,
        "decoder_start_token_id": config.decoder_start_token_id,
    }
    return GenerationConfig(**kept, **ids)


def _note_fp32(folder: Path) -> None:
    """config.json told that its graphs are float32, as transformers.js reads it (`transformers.js_config`: its
    default on WebAssembly is 8-bit, a file this export does not write)."""
    path = folder / "config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    config["transformers.js_config"] = {"dtype": "fp32"}
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


# A model folder's tokenizer: a fast one (`tokenizer.json`), or a converted MarianMTModel's own (SentencePiece).
TOKENIZERS = (("tokenizer.json",), ("source.spm", "target.spm", "vocab.json"))


def _write_tokenizer(folder, output: Path, max_positions: int) -> None:
    """The open model folder's tokenizer files (regular files inside it only: `sharing.reading`), its
    tokenizer_config.json naming a class every reader knows: a fast tokenizer's `PreTrainedTokenizerFast`
    (transformers 4 and 5, transformers.js), a converted model's own (MarianTokenizer); the longest input is the
    position table's. A folder with no tokenizer is refused by name."""
    if not any(all(folder.exists(name) for name in names) for names in TOKENIZERS):
        raise MarianExportError(
            f"{folder.path} holds no tokenizer (tokenizer.json, or a MarianTokenizer's source.spm, target.spm and "
            "vocab.json); a MarianMTModel folder needs one."
        )
    for name in TOKENIZER_FILES:
        if folder.exists(name) and not name.endswith(".py"):
            folder.copy(name, output / name)
    path = output / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    if config.get("tokenizer_class") in FAST_TOKENIZER_CLASSES or "tokenizer_class" not in config:
        config["tokenizer_class"] = STOCK_TOKENIZER_CLASS
    config.pop("auto_map", None)  # no code of this package is named or needed
    config["model_max_length"] = max_positions
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _facts(model_dir: Path, ours, results, alpha: float, max_positions: int, onnx: bool, mapped: bool) -> dict:
    """What the card says: the source folder by its name, its sizes, decoding, its results (as published: no path,
    no token), whether the α was mapped from GNMT's, and whether the ONNX graphs are there."""
    from ..sharing.hub import public_results

    return {
        "name": model_dir.resolve().name,
        "d_model": ours.config.d_model,
        "layers": (ours.config.encoder_layers, ours.config.decoder_layers),
        "results": public_results(results, model_dir) if results else None,
        "ours": recorded_decoding(ours.generation_config),
        "alpha": alpha,
        "mapped": mapped and recorded_decoding(ours.generation_config)["length_penalty_type"] == "gnmt",
        "max_positions": max_positions,
        "onnx": onnx,
    }


def _front_matter(facts: dict) -> str:
    """The card's metadata: its languages, license, corpus and test scores from the source folder's results (as the
    package's own card has them), else what the folder says of itself."""
    from ..sharing.model_card import _data_values, _score_values, yaml_string

    tags = "tags:\n- translation\n- marian\n- vanilla-transformer\n- hf_vanilla_transformer\n"
    head = "library_name: transformers\npipeline_tag: translation\n"
    results = facts["results"]
    if not results or "test" not in results:
        return head + tags
    data, score = _data_values(results), _score_values(results)
    languages = f"language:\n- {data['source_lang']}\n- {data['target_lang']}\nlicense: {data['license']}\n"
    index = (
        f"datasets:\n- {data['dataset_id']}\nmodel-index:\n- name: {yaml_string(facts['name'])}\n  results:\n"
        f"  - task:\n      type: translation\n      name: Translation {data['source_lang']}-{data['target_lang']}\n"
        f"    dataset:\n      type: {data['dataset_id']}\n      name: {data['dataset_name']}\n      split: test\n"
        f"    metrics:\n    - type: bleu\n      value: {score['bleu']}\n      name: sacreBLEU (the package's decoding)\n"
        f'      args: "{score["bleu_signature"]}"\n    - type: chrf\n      value: {score["chrf"]}\n      name: chrF\n'
        f'      args: "{score["chrf_signature"]}"\n'
    )
    return languages + head + tags + index


def marian_card(facts: dict) -> str:
    """The exported folder's model card: what it is, how to load it (no remote code), and what differs from the
    package's own decoding."""
    ours, test = facts["ours"], (facts["results"] or {}).get("test") or {}
    score = (
        f" Its test BLEU with the package's decoding: {test['bleu']:.2f} (beam {test.get('beams', 4)})."
        if test.get("bleu") is not None
        else ""
    )
    onnx = (
        "\n\n`onnx/` holds its graphs in Optimum's layout (`encoder_model.onnx`, `decoder_model_merged.onnx`): "
        "transformers.js translates with them in a web page, ONNX Runtime anywhere."
        if facts["onnx"]
        else ""
    )
    penalty = "GNMT's ((5 + |Y|) / 6)^α" if ours["length_penalty_type"] == "gnmt" else "transformers' |Y|^α"
    relative = ours["relative_max_length"]
    limit = (
        f"the package stops at the input's length + {relative} tokens (§6.1)"
        if relative is not None
        else "the package stops where its generation config's absolute limit says"
    )
    generation_limit = facts["max_positions"]
    return f"""---
{_front_matter(facts)}---

# {facts["name"]}, as a stock MarianMTModel

The Transformer of [*Attention Is All You Need*](https://arxiv.org/abs/1706.03762) trained by hf_vanilla_transformer
(d_model {facts["d_model"]}, {facts["layers"][0]} + {facts["layers"][1]} post-LN layers), written by `vanilla-transformer
export --format marian` in the layout of transformers' `MarianMTModel`. **It needs no remote code**: stock
transformers and the tools that read what it ships (ONNX exports in Optimum's layout, transformers.js) read
it.{score}{onnx}

```python
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

model = AutoModelForSeq2SeqLM.from_pretrained("THIS_FOLDER")  # no trust_remote_code
tokenizer = AutoTokenizer.from_pretrained("THIS_FOLDER")
batch = tokenizer(["A sentence to translate."], return_tensors="pt")
print(tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True))
```

What differs from the package's own folder, and why the logits do not:

- **Positions**: the package interleaves sines and cosines (§3.5); Marian tabulates them as `[sin | cos]` halves. The
  weights were permuted along the model dimension so that every logit is the same (the package's tests hold them
  within 1e-5). Marian's table has {facts["max_positions"]} rows: inputs and translations up to
  {facts["max_positions"] - 1} tokens (the package computes positions for any length).
- **Length penalty**: the package's beam search divides a hypothesis's log-probability by {penalty} with α
  {ours["length_penalty"]:g} (§6.1); MarianMTModel's `generate()` divides by transformers' |Y|^α, here α
  {facts["alpha"]:g}{", which ranks hypotheses of about 20 tokens as GNMT's does" if facts["mapped"] else ""}.
- **Length limit**: {limit}; this folder at `max_length` {generation_limit} (pass `max_new_tokens` to `generate()`
  for a tighter one).
- The decoder starts from `<s>`'s learned embedding, as the package's does.
"""
