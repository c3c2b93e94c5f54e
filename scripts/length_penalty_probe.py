"""BLEU of main-job model folders at GNMT length penalties (α) beyond the recipe's grid (issue 48, docs/cpu_recipe.md):
beam 4, on the 200 validation pairs the main job chooses α on and on the 1,152 test pairs of its corpus.

    python scripts/length_penalty_probe.py FOLDER [FOLDER ...] [--alphas 2.0,2.5,3.0]

One line of JSON per folder and α; nothing else should run meanwhile (it decodes on every core)."""

import argparse
import json

from hf_vanilla_transformer.data.corpora import hold_out, load_corpus
from hf_vanilla_transformer.evaluation.translation import evaluate_translations, load_translator
from hf_vanilla_transformer.training.recipes import parse_run


def held_out_splits(validation_pairs: int | None = 200) -> dict:
    """The main job's held-out splits of its corpus (the `cpu` recipe's): the first `validation_pairs` of validation
    (all where None) and the test split."""
    recipe = parse_run(["--recipe", "cpu", "--output_dir", "length-penalty-probe"]).recipe
    files = (recipe.data_files, recipe.validation_files, recipe.test_files)
    languages = (recipe.source_lang, recipe.target_lang)
    corpus = hold_out(
        load_corpus(recipe.dataset, *languages, *files, recipe.data_cache_dir, recipe.wmt14_dir, carve=True)
    )
    validation = corpus["validation"]
    if validation_pairs is not None:
        validation = validation.select(range(min(validation_pairs, len(validation))))
    return {"validation": validation, "test": corpus["test"]}


def beam_bleu(model, tokenizer, splits: dict, alpha: float) -> dict:
    """{"<split>_bleu": sacreBLEU} of `model` on each of `splits`, beam 4 at length penalty `alpha`."""
    row = {}
    for name, pairs in splits.items():
        scores, _ = evaluate_translations(
            model, tokenizer, list(pairs["source"]), list(pairs["target"]), num_beams=4, length_penalty=alpha,
            progress=False,
        )  # fmt: skip
        row[f"{name}_bleu"] = round(scores["score"], 2)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("folders", nargs="+")
    parser.add_argument("--alphas", default="2.0,2.5,3.0")
    flags = parser.parse_args()
    splits = held_out_splits()
    for folder in flags.folders:
        model, tokenizer = load_translator(folder)
        for alpha in (float(value) for value in flags.alphas.split(",")):
            print(
                json.dumps({"folder": folder, "alpha": alpha, **beam_bleu(model, tokenizer, splits, alpha)}), flush=True
            )


if __name__ == "__main__":
    main()
