"""BLEU of main-job model folders at GNMT length penalties (α) beyond the recipe's grid (issue 48, docs/cpu_recipe.md):
beam 4, on the 200 validation pairs the main job chooses α on and on the 1,152 test pairs of its corpus, each split
decoded once for all the α (`translate_each_alpha`).

    python scripts/length_penalty_probe.py FOLDER [FOLDER ...] [--alphas 0.6,1.0,1.5,2.0,2.5,3.0]
    python scripts/length_penalty_probe.py FOLDER --time_searches [--alphas 0.6,1.0,1.5]

One line of JSON per folder and α; nothing else should run meanwhile (it decodes on every core). `--validation_files`
and `--test_files` (TSV or JSONL, both or neither) score other held-out pairs than the main job's; `--beams` sets the
beam (4, §6.1). With
`--time_searches`, the validation pairs (what the main job chooses α on) are decoded both ways in turns instead,
once per α with `translate()` and once for all with `translate_each_alpha`, and one line per folder gives both times
and whether every translation is the same."""

import argparse
import json
import time

from hf_vanilla_transformer.data.corpora import hold_out, load_corpus, read_parallel_file
from hf_vanilla_transformer.evaluation.metrics import compute_bleu
from hf_vanilla_transformer.evaluation.translation import load_translator, translate, translate_each_alpha
from hf_vanilla_transformer.training.recipes import parse_run


def add_split_flags(parser: argparse.ArgumentParser) -> None:
    """The probes' flags for what they decode: the held-out pairs and the beam."""
    parser.add_argument("--validation_files", help="validation pairs (TSV or JSONL) instead of the main job's")
    parser.add_argument("--test_files", help="test pairs (TSV or JSONL) instead of the main job's")
    parser.add_argument("--beams", type=int, default=4, help="the beam (default: 4, §6.1)")


def held_out_splits(
    validation_pairs: int | None = 200, validation_files: str | None = None, test_files: str | None = None
) -> dict:
    """The main job's held-out splits of its corpus (the `cpu` recipe's), or the pairs of `validation_files` and
    `test_files` (both or neither): the first `validation_pairs` of validation (all where None) and the test split."""
    if (validation_files is None) != (test_files is None):
        raise SystemExit(
            f"--validation_files {validation_files!r} and --test_files {test_files!r}: expected both files or neither."
        )
    if validation_files is not None:
        corpus = {"validation": read_parallel_file(validation_files), "test": read_parallel_file(test_files)}
    else:
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


def beam_bleu(model, tokenizer, splits: dict, alphas: list[float], beams: int = 4) -> dict[float, dict]:
    """{alpha: {"<split>_bleu": sacreBLEU, "<split>_chrf": chrF}} of `model` on each of `splits`, beam search, one
    search per split."""
    rows: dict[float, dict] = {alpha: {} for alpha in alphas}
    for name, pairs in splits.items():
        translations = translate_each_alpha(
            model, tokenizer, list(pairs["source"]), alphas, num_beams=beams, progress=False
        )
        for alpha in alphas:
            scores = compute_bleu(translations[alpha], list(pairs["target"]))
            rows[alpha][f"{name}_bleu"] = round(scores["score"], 2)
            rows[alpha][f"{name}_chrf"] = round(scores["chrf"], 2)
    return rows


def time_searches(model, tokenizer, splits: dict, alphas: list[float], beams: int = 4, rounds: int = 2) -> list[dict]:
    """Per split: seconds of the choice of α decoded once per α (`translate`) and in one search
    (`translate_each_alpha`), in turns, the fastest of `rounds` each; and whether their translations are the same."""
    rows = []
    for name, pairs in splits.items():
        sources = list(pairs["source"])
        seconds = {"per_alpha": [], "one_search": []}
        for _ in range(rounds):
            started = time.perf_counter()
            each = {alpha: translate(model, tokenizer, sources, num_beams=beams, length_penalty=alpha, progress=False)
                    for alpha in alphas}  # fmt: skip
            seconds["per_alpha"].append(time.perf_counter() - started)
            started = time.perf_counter()
            together = translate_each_alpha(model, tokenizer, sources, alphas, num_beams=beams, progress=False)
            seconds["one_search"].append(time.perf_counter() - started)
        best = {way: min(times) for way, times in seconds.items()}
        rows.append({
            "split": name, "sentences": len(sources), "alphas": alphas,
            "per_alpha_seconds": round(best["per_alpha"], 2), "one_search_seconds": round(best["one_search"], 2),
            "ratio": round(best["per_alpha"] / best["one_search"], 2), "same_translations": each == together,
        })  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("folders", nargs="+")
    parser.add_argument("--alphas", default="0.6,1.0,1.5,2.0,2.5,3.0")
    parser.add_argument("--time_searches", action="store_true", help="time one search against one per alpha")
    add_split_flags(parser)
    flags = parser.parse_args()
    alphas = [float(value) for value in flags.alphas.split(",")]
    splits = held_out_splits(200, flags.validation_files, flags.test_files)
    for folder in flags.folders:
        model, tokenizer = load_translator(folder)
        if flags.time_searches:
            for row in time_searches(model, tokenizer, {"validation": splits["validation"]}, alphas, flags.beams):
                print(json.dumps({"folder": folder, **row}), flush=True)
            continue
        for alpha, row in beam_bleu(model, tokenizer, splits, alphas, flags.beams).items():
            print(json.dumps({"folder": folder, "alpha": alpha, **row}), flush=True)


if __name__ == "__main__":
    main()
