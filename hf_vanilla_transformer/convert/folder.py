"""`convert_model`: a MarianMTModel folder, an FSMT folder or a fairseq checkpoint into a model folder of this
package, refused in one line (`ConversionError`) before anything is written when it is something this model cannot
hold. The folder is written under a temporary name beside the output and renamed into place when complete: config,
safetensors weights, generation config (the source's decoding), the source's tokenizer, the remote-code files and a
model card (README.md) saying where the weights came from."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

from transformers import GenerationConfig

from ..data.tokenizer import save_tokenizer
from ..sharing.model_card import yaml_string
from .common import Conversion, ConversionError, build_model, read_json


HUB_ID = re.compile(r"[\w.-]+(/[\w.-]+)?")  # what the card's base_model may name
FAIRSEQ_CHECKPOINT_NAMES = ("model.pt", "checkpoint_best.pt", "checkpoint_last.pt")  # a fairseq folder's checkpoint


def read_source(
    source: str | Path,
    source_dict: str | Path | None = None,
    target_dict: str | Path | None = None,
    bpe_codes: str | Path | None = None,
) -> Conversion:
    """The source read and checked: a transformers folder (by its config.json's model_type), a fairseq checkpoint
    file, or a folder holding one (`model.pt`, as fairseq's published archives unpack)."""
    source = Path(source)
    if not source.exists():
        raise ConversionError(
            f"{source} does not exist; expected a MarianMTModel or FSMT folder or a fairseq checkpoint"
        )
    if source.is_dir() and (source / "config.json").exists():
        model_type = read_json(source / "config.json").get("model_type")
        if model_type == "marian":
            from .marian import marian_conversion

            return marian_conversion(source)
        if model_type == "fsmt":
            from .fsmt import fsmt_conversion

            return fsmt_conversion(source)
        raise ConversionError(
            f"{source.name}/config.json has model_type {model_type!r}; expected a MarianMTModel ('marian') or FSMT "
            "('fsmt') folder, or a fairseq checkpoint"
        )
    if source.is_dir():
        found = [source / name for name in FAIRSEQ_CHECKPOINT_NAMES if (source / name).is_file()]
        if not found:
            raise ConversionError(
                f"{source.name} holds neither a config.json nor a fairseq checkpoint ({', '.join(FAIRSEQ_CHECKPOINT_NAMES)})"
            )
        source = found[0]
    from .fairseq import fairseq_conversion

    paths = [Path(path) if path else None for path in (source_dict, target_dict, bpe_codes)]
    return fairseq_conversion(source, *paths)


def convert_model(
    source: str | Path,
    output: str | Path,
    source_dict: str | Path | None = None,
    target_dict: str | Path | None = None,
    bpe_codes: str | Path | None = None,
    source_id: str | None = None,
) -> Path:
    """Convert `source` into the model folder `output` (which must not exist, or be empty) and return its path.

    `source_dict`, `target_dict`, `bpe_codes`: a fairseq checkpoint's files where they are not beside it under
    fairseq's names. `source_id`: the source's Hub id (e.g. `Helsinki-NLP/opus-mt-en-de`), named in the card.
    Raises ConversionError (a ValueError) naming what the source lacks or this model does not have; nothing is
    written then.
    """
    output = Path(output)
    if source_id is not None and not HUB_ID.fullmatch(source_id):
        raise ConversionError(
            f"source_id={source_id!r} is invalid; expected a Hub id such as Helsinki-NLP/opus-mt-en-de"
        )
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise ConversionError(f"{output} exists and is not an empty folder; choose a new output folder")
    conversion = read_source(source, source_dict, target_dict, bpe_codes)
    model = build_model(conversion)
    generation = GenerationConfig(**conversion.generation)
    generation.validate(strict=True)
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    try:
        model.generation_config = generation
        model.save_pretrained(staging)
        save_tokenizer(conversion.tokenizer, staging)
        (staging / "README.md").write_text(model_card(conversion, source_id), encoding="utf-8")
        if output.exists():
            output.rmdir()  # empty, checked above
        os.replace(staging, output)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return output


FAMILIES = {
    "marian": "MarianMTModel (Marian NMT's opus-mt models in transformers)",
    "fsmt": "FSMT (fairseq's WMT19 systems in transformers)",
    "fairseq": "a fairseq `transformer` checkpoint",
}


def model_card(conversion: Conversion, source_id: str | None = None) -> str:
    """The model card of a converted folder: its source, what each of the source's quirks became, how to use it."""
    # What the source says of itself (its languages, its folder's name) is escaped: one YAML value each, one line of
    # text in the card (`yaml_string`); `source_id` is a Hub id (checked by `convert_model`).
    source, target = conversion.languages
    languages = "".join(f"- {yaml_string(language)}\n" for language in (source, target) if language)
    base = f"base_model: {source_id}\n" if source_id else ""
    name = yaml_string(conversion.source_name)[1:-1]
    named = f"`{source_id}`" if source_id else f"`{name}`"
    decoding = ", ".join(
        f"{key} {value}"
        for key, value in conversion.generation.items()
        if key in ("num_beams", "length_penalty", "max_length", "early_stopping")
    )
    notes = "".join(f"- {note}\n" for note in conversion.notes)
    return f"""---
{"language:" + chr(10) + languages if languages else ""}{base}library_name: transformers
pipeline_tag: translation
tags:
- translation
- vanilla-transformer
- converted
---

# {name}, converted to hf_vanilla_transformer

The weights of {named}, {FAMILIES[conversion.family]}, in the post-LN Transformer of
[*Attention Is All You Need*](https://arxiv.org/abs/1706.03762) as hf_vanilla_transformer implements it, converted by
`vanilla-transformer convert`: the same weights (in float32), the same logits (the package's tests hold the two
within 1e-5 on padded batches) and the same tokens from greedy and beam search, with the source's tokenizer and its
decoding settings ({decoding}; transformers' length penalty, `length_penalty_type="hf"`, no relative length limit).

What the source does that the paper's model does not, and how this model holds it:

{notes}
```python
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

model = AutoModelForSeq2SeqLM.from_pretrained("THIS_FOLDER", trust_remote_code=True)
tokenizer = AutoTokenizer.from_pretrained("THIS_FOLDER", trust_remote_code=True)
batch = tokenizer(["A sentence to translate."], return_tensors="pt")
print(tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True))
```

The weights keep the license of {named}.
"""
