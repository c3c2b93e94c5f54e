"""The GNMT length penalty's α, chosen as §6.1 chose it: "after experimentation on the development set". One place
reads the recipe's choices (`--length_penalty_choices`), decodes the validation pairs with each, and keeps the best
in the model's generation config; the planner counts the choices from here and the model card reports the result.
"""

from __future__ import annotations

from pathlib import Path

from datasets import DatasetDict

from .translation import evaluate_translations


def length_penalty_choices(recipe) -> list[float]:
    """The GNMT alphas of `--length_penalty_choices` as numbers ([] when not given); a ValueError names a bad one."""
    if not recipe.length_penalty_choices:
        return []
    alphas = []
    for text in str(recipe.length_penalty_choices).split(","):
        try:
            alpha = float(text)
        except ValueError:
            alpha = -1.0
        if not 0 <= alpha < float("inf"):
            raise ValueError(
                f"length_penalty_choices={recipe.length_penalty_choices!r} holds {text.strip()!r}; expected "
                "comma-separated GNMT alphas of 0 or more (e.g. 0.6,1.0,1.4)."
            )
        alphas.append(alpha)
    if recipe.test_beams <= 1 and len(alphas) > 1:
        raise ValueError(
            f"length_penalty_choices={recipe.length_penalty_choices!r} needs beam search: test_beams={recipe.test_beams} "
            "decodes greedily, where alpha changes nothing."
        )
    return alphas


def choose_length_penalty(
    model, tokenizer, sources: list[str], references: list[str], alphas: list[float], **translate_kwargs
) -> tuple[float, dict[float, float]]:
    """The GNMT α (§6.1: "chosen after experimentation on the development set") that gives the highest BLEU on
    these development pairs with beam search: (the best α, {α: BLEU}). A tie keeps the earlier α of `alphas`."""
    if not alphas:
        raise ValueError("choose_length_penalty needs at least one alpha to try.")
    scores = {}
    for alpha in alphas:
        result, _ = evaluate_translations(
            model, tokenizer, sources, references, tokenized_bleu=False, length_penalty=alpha, **translate_kwargs
        )
        scores[alpha] = result["score"]
    best = max(alphas, key=lambda alpha: (scores[alpha], -alphas.index(alpha)))
    return best, scores


def choose_alpha(recipe, model, tokenizer, corpus: DatasetDict, output_dir: str | Path) -> dict | None:
    """With `--length_penalty_choices`, decode the first `max_eval_samples` validation pairs with each alpha (beam
    search, `test_beams`), keep the best in the model's generation config (saved in `output_dir`) and return what was
    measured; None (and the model's alpha unchanged) without choices or without a validation split."""
    alphas = length_penalty_choices(recipe)
    if not alphas or "validation" not in corpus:
        return None
    validation = corpus["validation"]
    if recipe.max_eval_samples is not None:
        validation = validation.select(range(min(recipe.max_eval_samples, len(validation))))
    sources, references = list(validation["source"]), list(validation["target"])
    best, bleu = choose_length_penalty(
        model, tokenizer, sources, references, alphas, num_beams=recipe.test_beams, progress=False
    )
    model.generation_config.length_penalty = best
    model.generation_config.save_pretrained(output_dir)
    described = ", ".join(f"{alpha:g}: {score:.2f}" for alpha, score in bleu.items())
    print(
        f"Length penalty: GNMT alpha {best:g} (validation BLEU on {len(sources)} pairs, beam {recipe.test_beams}: "
        f"{described}).",
        flush=True,
    )
    return {
        "chosen": best,
        "validation_bleu": {f"{alpha:g}": score for alpha, score in bleu.items()},
        "validation_pairs": len(sources),
        "beams": recipe.test_beams,
    }
