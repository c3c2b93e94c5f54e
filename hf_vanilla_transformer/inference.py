"""Translating many sentences: batched by length, beam search with the model's defaults (§6.1), BLEU."""

from __future__ import annotations

from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from .metrics import compute_bleu


def load_translator(model: str | Path, device: str | torch.device = "cpu"):
    """(model in eval mode on `device`, tokenizer) from a trained folder or a Hub id.

    A folder that does not exist, or that holds no model or tokenizer, raises an OSError whose one-line message
    names it and what was expected; a missing local folder is reported without asking the Hub.
    """
    name = str(model)
    local = Path(name).expanduser()
    looks_local = local.is_absolute() or name.startswith((".", "~")) or name.count("/") > 1
    if not local.exists() and looks_local:
        raise FileNotFoundError(
            f"{name} does not exist; expected a model folder (config.json, model.safetensors and "
            "the tokenizer files) or a Hub id."
        )
    if local.exists() and not local.is_dir():
        raise NotADirectoryError(f"{name} is a file; expected a model folder (or a Hub id).")
    try:
        loaded = AutoModelForSeq2SeqLM.from_pretrained(name, trust_remote_code=True).to(device).eval()
        tokenizer = AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError) as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise OSError(f"Cannot load a model and its tokenizer from {name}: {first_line}") from error
    return loaded, tokenizer


@torch.no_grad()
def translate(
    model,
    tokenizer,
    sentences: list[str],
    max_tokens: int = 4000,
    max_sentences: int = 128,
    progress: bool = True,
    **generate_kwargs,
) -> list[str]:
    """Translate `sentences`, longest first in batches of at most `max_tokens` padded source tokens.

    Sorting by length keeps padding (and the wasted decoding work on it) small; the output is in input order.
    Empty and whitespace-only sentences come back empty without reaching the model (which would only invent a
    sentence for them). `generate_kwargs` go to `model.generate` (e.g. `num_beams=1` for greedy decoding).
    """
    if isinstance(sentences, str):
        raise TypeError("translate() takes a list of sentences; wrap a single one in a list.")
    sentences = list(sentences)
    for sentence in sentences:
        if not isinstance(sentence, str):
            raise TypeError(f"translate() takes a list of strings; got a {type(sentence).__name__}: {sentence!r:.80}.")
    model.eval()
    texts = [i for i, sentence in enumerate(sentences) if sentence.strip()]  # the sentences to translate
    encoded = dict(zip(texts, tokenizer([sentences[i] for i in texts])["input_ids"], strict=True)) if texts else {}
    order = sorted(texts, key=lambda i: -len(encoded[i]))
    batches, current, longest = [], [], 0
    for index in order:
        longest = max(longest, len(encoded[index])) if current else len(encoded[index])
        if current and (longest * (len(current) + 1) > max_tokens or len(current) >= max_sentences):
            batches.append(current)
            current, longest = [], len(encoded[index])
        current.append(index)
    if current:
        batches.append(current)

    outputs: list[str] = [""] * len(sentences)
    device = next(model.parameters()).device
    bar = tqdm(total=len(sentences), desc="translating", unit="sent", disable=not progress)
    bar.update(len(sentences) - len(texts))
    for batch in batches:
        features = tokenizer.pad({"input_ids": [encoded[i] for i in batch]}, return_tensors="pt").to(device)
        generated = model.generate(**features, **generate_kwargs)
        for index, text in zip(batch, tokenizer.batch_decode(generated, skip_special_tokens=True), strict=True):
            outputs[index] = text.strip()
        bar.update(len(batch))
    bar.close()
    return outputs


def evaluate_translations(
    model, tokenizer, sources: list[str], references: list[str], tokenized_bleu: bool = True, **translate_kwargs
) -> tuple[dict, list[str]]:
    """Translate `sources` and score them against `references`: (sacreBLEU/chrF result, hypotheses)."""
    hypotheses = translate(model, tokenizer, sources, **translate_kwargs)
    return compute_bleu(hypotheses, references, tokenized=tokenized_bleu), hypotheses
