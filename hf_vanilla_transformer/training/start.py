"""A fine-tuning run never returns a model worse than the one it started from, and says which it kept.

A run that starts from a saved model (`--model_name_or_path`) measures that model before its first update on the
validation pairs its validations use (the first `max_eval_samples`, greedy, as they decode): `starting_point`, kept in
the output folder (`start.json`, with the `fingerprint` of the model and the pairs) so that a resumed run compares
with the same start. At the end the trained (averaged) model is measured the same way, and the better of the two on
validation BLEU becomes the model folder (`keep_the_better`: BLEU first, chrF at equal BLEU; a tie keeps the trained
one): the log, `results.json` ("kept") and the model card say which. The second measurement is in the budget: the
clock keeps twice the first's seconds for it (`BudgetClock.with_final_check`; a worse model often decodes longer).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from ..data.cache import file_signature, text_key
from ..evaluation.translation import evaluate_translations
from ..utils.files import write_json_atomically
from .models import build_model


logger = logging.getLogger(__name__)

START_FILE = "start.json"  # the starting model's validation scores, in the output folder


def validation_pairs(corpus, max_pairs: int | None) -> tuple[list[str], list[str]] | None:
    """The (sources, references) a run's validations decode: the first `max_pairs` of the validation split; None
    without one."""
    if "validation" not in corpus:
        return None
    validation = corpus["validation"]
    if max_pairs is not None:
        validation = validation.select(range(min(max_pairs, len(validation))))
    return list(validation["source"]), list(validation["target"])


def validation_score(model, tokenizer, pairs: tuple[list[str], list[str]]) -> dict:
    """Greedy validation BLEU and chrF of `model` on `pairs`, with the seconds they took."""
    began = time.time()
    scores, _ = evaluate_translations(model, tokenizer, *pairs, tokenized_bleu=False, num_beams=1, progress=False)
    return {"bleu": scores["score"], "chrf": scores["chrf"], "pairs": len(pairs[0]), "seconds": time.time() - began}


def fingerprint(model_name_or_path: str, pairs: tuple[list[str], list[str]]) -> str:
    """What a recorded start must match to be reused: a key (`data.cache.text_key`) of the starting model (a local
    folder: its resolved path, its config and the signature of each of its files, `data.cache.file_signature`; a Hub
    id: the id) and of the validation pairs. A key only: no path reaches the output folder."""
    folder = Path(model_name_or_path)
    if not folder.is_dir():
        return text_key(model_name_or_path, pairs)
    files = sorted(item for item in folder.iterdir() if item.is_file() and not item.is_symlink())
    config = (folder / "config.json").read_text(encoding="utf-8") if (folder / "config.json").is_file() else None
    signatures = [[file.name, *file_signature(file)] for file in files]
    return text_key(str(folder.resolve()), signatures, config, pairs)


def starting_point(settings, data) -> dict | None:
    """The starting model's validation scores (see the module docstring): read from the output folder where a run
    of the same model on the same validation pairs recorded them (`fingerprint`), else measured and recorded; None
    where the run starts from no saved model, has no validation split (said in the log), or is not the process that
    writes the folder."""
    recipe, args = settings.recipe, settings.args
    pairs = validation_pairs(data.corpus, recipe.max_eval_samples)
    if recipe.model_name_or_path and pairs is None:
        logger.warning(
            "no validation split: the model %s started from is not measured, and the trained model is kept whatever "
            "it scores%s (give --validation_files to keep the better of the two)",
            Path(recipe.model_name_or_path).name,
            ", and its peak and warmup are the recipe's (peak_by_start_bleu and warmup_by_start_bleu need the "
            "start's score)"
            if settings.start_peaks or settings.start_warmups
            else "",
        )
    if not recipe.model_name_or_path or pairs is None or not args.should_save:
        return None
    path, name = Path(args.output_dir) / START_FILE, Path(recipe.model_name_or_path).name
    mark = fingerprint(recipe.model_name_or_path, pairs)
    recorded = json.loads(path.read_text(encoding="utf-8")) if path.exists() else None
    if recorded is not None and recorded.get("fingerprint") == mark:
        return recorded  # a resumed run: the same start, measured before its first update
    model = build_model(recipe, data.tokenizer).to(args.device).eval()
    start = {"model": name, "fingerprint": mark, **validation_score(model, data.tokenizer, pairs)}
    print(
        f"Starting point: {start['model']}, validation BLEU {start['bleu']:.2f} (chrF {start['chrf']:.2f}) on "
        f"{start['pairs']} pairs, greedy.",
        flush=True,
    )
    write_json_atomically(path, start)
    return start


def better_or_equal(scores: dict, than: dict) -> bool:
    """Whether `scores` are at least as good as `than`: a higher validation BLEU, and at equal BLEU (a weak model's
    is often 0) a chrF at least as high."""
    return (round(scores["bleu"], 2), scores["chrf"]) >= (round(than["bleu"], 2), than["chrf"])


def keep_the_better(model, settings, data, start: dict, output_dir: Path):
    """(the model the folder keeps, what was compared): the trained `model`, measured as the start was, or the
    starting model where it scores higher on validation BLEU, written into `output_dir` over the trained weights."""
    recipe = settings.recipe
    trained = validation_score(model.eval(), data.tokenizer, validation_pairs(data.corpus, recipe.max_eval_samples))
    kept = "trained" if better_or_equal(trained, start) else "start"
    if kept == "start":
        model = build_model(recipe, data.tokenizer).to(model.device).eval()
        model.save_pretrained(output_dir)
    said = "the trained model" if kept == "trained" else f"the model it started from, {start['model']}"
    print(
        f"Kept: {said} (validation BLEU {trained['bleu']:.2f} trained against {start['bleu']:.2f} at the start, "
        f"greedy, {trained['pairs']} pairs).",
        flush=True,
    )
    return model, {"kept": kept, "start": start, "trained": trained}
