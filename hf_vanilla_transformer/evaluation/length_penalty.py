"""The GNMT length penalty's α, chosen as §6.1 chose it: "after experimentation on the development set": the
validation pairs decoded with each α of the recipe's choices (`training.choices.length_penalty_choices`), the one of
best BLEU kept by the run in the model's generation config, and reported by the model card."""

from __future__ import annotations

from datasets import DatasetDict

from .metrics import compute_bleu
from .translation import translate_each_alpha


def choose_length_penalty(
    model, tokenizer, sources: list[str], references: list[str], alphas: list[float], **translate_kwargs
) -> tuple[float, dict[float, float]]:
    """The GNMT α (§6.1: "chosen after experimentation on the development set") that gives the highest BLEU on
    these development pairs with beam search: (the best α, {α: BLEU}). A tie keeps the earlier α of `alphas`. The
    pairs are decoded once for all the α (`translate_each_alpha`: with early stopping, α only ranks what the search
    finished), not once per α."""
    if not alphas:
        raise ValueError("choose_length_penalty needs at least one alpha to try.")
    translations = translate_each_alpha(model, tokenizer, sources, list(alphas), **translate_kwargs)
    scores = {alpha: compute_bleu(translations[alpha], references, tokenized=False)["score"] for alpha in alphas}
    best = max(alphas, key=lambda alpha: (scores[alpha], -alphas.index(alpha)))
    return best, scores


def choose_alpha(
    alphas: list[float], model, tokenizer, corpus: DatasetDict, max_pairs: int | None, beams: int
) -> dict | None:
    """The GNMT alpha of `alphas` with the best BLEU on the first `max_pairs` validation pairs (beam search with
    `beams` beams), and what was measured; None without alphas or without a validation split. The model is left as
    it is: the caller keeps the choice in its generation config."""
    if not alphas or "validation" not in corpus:
        return None
    validation = corpus["validation"]
    if max_pairs is not None:
        validation = validation.select(range(min(max_pairs, len(validation))))
    sources, references = list(validation["source"]), list(validation["target"])
    best, bleu = choose_length_penalty(model, tokenizer, sources, references, alphas, num_beams=beams, progress=False)
    described = ", ".join(f"{alpha:g}: {score:.2f}" for alpha, score in bleu.items())
    print(
        f"Length penalty: GNMT alpha {best:g} (validation BLEU on {len(sources)} pairs, beam {beams}: {described}).",
        flush=True,
    )
    return {
        "chosen": best,
        "validation_bleu": {f"{alpha:g}": score for alpha, score in bleu.items()},
        "validation_pairs": len(sources),
        "beams": beams,
    }
