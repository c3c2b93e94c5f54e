"""BLEU of main-job model folders averaged anew from their kept checkpoints (issue 48, docs/cpu_recipe.md): the last
k checkpoints for each k asked, beam 4 at the α the run chose, on every validation pair and on the 1,152 test pairs.

    python scripts/averaging_probe.py FOLDER [FOLDER ...] [--last 1,2,3,4,5,6]

One line of JSON per folder and k (the checkpoints averaged, their validation losses as the run logged them, BLEU
on both splits); nothing else should run meanwhile (it decodes on every core). The folders are left untouched: each
average is written to a temporary folder."""

import argparse
import json
import tempfile
from pathlib import Path

from hf_vanilla_transformer.data.corpora import hold_out, load_corpus
from hf_vanilla_transformer.evaluation.translation import evaluate_translations, load_translator
from hf_vanilla_transformer.training.averaging import average_checkpoints, checkpoint_folders, validation_losses
from hf_vanilla_transformer.training.recipes import parse_run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("folders", nargs="+")
    parser.add_argument("--last", default="1,2,3,4,5,6")
    flags = parser.parse_args()
    recipe = parse_run(["--recipe", "cpu", "--output_dir", "averaging-probe"]).recipe
    files = (recipe.data_files, recipe.validation_files, recipe.test_files)
    languages = (recipe.source_lang, recipe.target_lang)
    corpus = hold_out(
        load_corpus(recipe.dataset, *languages, *files, recipe.data_cache_dir, recipe.wmt14_dir, carve=True)
    )
    splits = {"validation": corpus["validation"], "test": corpus["test"]}
    for folder in map(Path, flags.folders):
        results = json.loads((folder / "results.json").read_text())
        alpha = results["test"]["length_penalty"]
        checkpoints = checkpoint_folders(folder)
        losses = validation_losses(json.loads((checkpoints[-1] / "trainer_state.json").read_text())["log_history"])
        for last in (int(value) for value in flags.last.split(",")):
            chosen = checkpoints[-last:]
            steps = [int(path.name.rsplit("-", 1)[1]) for path in chosen]
            row = {"folder": str(folder), "last": last, "steps": steps, "alpha": alpha}
            row["validation_losses"] = [round(losses[step], 3) if step in losses else None for step in steps]
            with tempfile.TemporaryDirectory() as averaged:
                average_checkpoints(chosen, averaged)
                model, tokenizer = load_translator(averaged)
                for name, pairs in splits.items():
                    scores, _ = evaluate_translations(
                        model, tokenizer, list(pairs["source"]), list(pairs["target"]), num_beams=4,
                        length_penalty=alpha, progress=False,
                    )  # fmt: skip
                    row[f"{name}_bleu"] = round(scores["score"], 2)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
