"""BLEU of main-job model folders averaged anew from their kept checkpoints (issue 48, docs/cpu_recipe.md): the last
k checkpoints for each k asked, beam search (`--beams`, default 4) at the α the run chose, on every validation pair
and on the 1,152 test pairs.

    python scripts/averaging_probe.py FOLDER [FOLDER ...] [--last 1,2,3,4,5,6]
        [--validation_files V --test_files T] [--beams 4]

One line of JSON per folder and k (the checkpoints averaged, their validation losses as the run logged them, BLEU
on both splits); nothing else should run meanwhile (it decodes on every core). The folders are left untouched: each
average is written to a temporary folder."""

import argparse
import json
import tempfile
from pathlib import Path

# scripts/ is the script's own folder on sys.path
from length_penalty_probe import add_split_flags, beam_bleu, held_out_splits

from hf_vanilla_transformer.evaluation.translation import load_translator
from hf_vanilla_transformer.training.averaging import average_checkpoints, checkpoint_folders, validation_losses
from hf_vanilla_transformer.training.checkpoints import checkpoint_step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("folders", nargs="+")
    parser.add_argument("--last", default="1,2,3,4,5,6")
    add_split_flags(parser)
    flags = parser.parse_args()
    splits = held_out_splits(None, flags.validation_files, flags.test_files)
    for folder in map(Path, flags.folders):
        results = json.loads((folder / "results.json").read_text())
        alpha = results["test"]["length_penalty"]
        checkpoints = checkpoint_folders(folder)
        losses = validation_losses(json.loads((checkpoints[-1] / "trainer_state.json").read_text())["log_history"])
        for last in (int(value) for value in flags.last.split(",")):
            if not 1 <= last <= len(checkpoints):
                print(json.dumps({"folder": str(folder), "last": last, "skipped": f"{len(checkpoints)} kept"}))
                continue
            chosen = checkpoints[-last:]
            steps = [checkpoint_step(path) for path in chosen]
            row = {"folder": str(folder), "last": last, "steps": steps, "alpha": alpha}
            row["validation_losses"] = [round(losses[step], 3) if step in losses else None for step in steps]
            with tempfile.TemporaryDirectory() as averaged:
                average_checkpoints(chosen, averaged)
                model, tokenizer = load_translator(averaged)
                row.update(beam_bleu(model, tokenizer, splits, [alpha], flags.beams)[alpha])
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
