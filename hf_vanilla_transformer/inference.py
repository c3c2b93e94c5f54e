"""Translating many sentences: batched by length, beam search with the model's defaults (§6.1), BLEU."""

from __future__ import annotations

import torch
from tqdm.auto import tqdm

from .metrics import compute_bleu


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
    `generate_kwargs` go to `model.generate` (e.g. `num_beams=1` for greedy decoding).
    """
    if isinstance(sentences, str):
        raise TypeError("translate() takes a list of sentences; wrap a single one in a list.")
    model.eval()
    encoded = tokenizer(list(sentences))["input_ids"]
    order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i]))
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
