"""Train the Transformer with the paper's recipe, average the last checkpoints, and evaluate BLEU on the test split.

Usage:
    vanilla-transformer train --recipe cpu --max_minutes 30 --output_dir runs/en-de
    vanilla-transformer train --recipe cpu --data_files mine.tsv --max_minutes 30 --output_dir runs/mine
    vanilla-transformer train --preset tiny --max_steps 30 --output_dir runs/tiny
    vanilla-transformer train --recipe base --output_dir runs/base          # the paper's base (WMT 2014, GPUs)
    vanilla-transformer train --model_name_or_path runs/base --dataset libreoffice-ui --output_dir runs/ui
    vanilla-transformer train --data_files train.tsv --validation_files dev.tsv --test_files test.tsv ...
    accelerate launch --num_processes 2 -m hf_vanilla_transformer train ...
    vanilla-transformer main                     # the main job: the machine's recipe (gpu or cpu), 26 minutes

A recipe shipped with the package (cpu, gpu, base, big: `vanilla-transformer configs`) or a file of your own sets
defaults; every flag overrides it, and every `Seq2SeqTrainingArguments` flag works (--max_steps, --seed, --bf16,
--resume_from_checkpoint, ...). Without a recipe the defaults are the paper's (Adam 0.9/0.98/1e-9, warmup 4000, no
weight decay, no clipping). `--max_minutes M` measures an update on this machine and fixes the number of updates that
fits M minutes. With no data flag the corpus is the LibreOffice help EN-DE. A run restarted with the same
--output_dir resumes from its newest complete checkpoint. `main` is `train` with the recipe of this machine (gpu
where PyTorch sees a CUDA device, else cpu) and the output folder outputs/vanilla-transformer-en-de.
"""

from __future__ import annotations

import logging
import shlex
import sys
import time
from pathlib import Path

from ..data.splits import CorpusError, DataFileError
from ..training.budget import BudgetError
from ..training.checkpoints import CheckpointError
from ..training.collapse import SourceCollapseError, collapse_message
from ..training.recipes import machine_recipe, parse_run
from ..training.results import describe_time
from ..training.run import train_and_evaluate
from ..utils.files import DiskFullError, is_disk_full
from ..utils.locks import FolderInUseError
from ..utils.redact import public_command


MAIN_JOB_FOLDER = "outputs/vanilla-transformer-en-de"


# What the user's data, flags, folders or budget cause: said in one line (no traceback).
USER_ERRORS = (
    CorpusError,
    DataFileError,
    CheckpointError,
    FileNotFoundError,
    IsADirectoryError,
    SourceCollapseError,
    BudgetError,
)


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    """`train`: the flags over a recipe (none unless `--recipe`)."""
    train_from_command_line(argv, prog=prog)


def main_job(argv: list[str] | None = None, prog: str | None = None) -> None:
    """`main`: the machine's recipe, into outputs/vanilla-transformer-en-de (both overridable)."""
    defaults = {"output_dir": MAIN_JOB_FOLDER}
    train_from_command_line(argv, default_recipe=machine_recipe(argv), defaults=defaults, prog=prog)


def train_from_command_line(
    argv: list[str] | None = None,
    default_recipe: str | None = None,
    defaults: dict | None = None,
    prog: str | None = None,
) -> dict | None:
    """Train, evaluate and save as the flags say; print the plan, the test scores, a few translations and where
    the model went. Returns the results (None in the processes other than the main one). A bad recipe, flag,
    corpus or checkpoint ends the program with one line naming it."""
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    script = prog or (Path(sys.argv[0]).name if argv is None else "train")
    try:
        settings = parse_run(argv, default_recipe=default_recipe, defaults=defaults, prog=prog)
    except ValueError as error:
        raise SystemExit(f"{script}: {error}") from None
    try:
        return _train_and_report(settings, public_command(_command(argv, prog), settings.output_dir))
    except USER_ERRORS as error:
        raise SystemExit(f"{script}: {error}") from None
    except (DiskFullError, FolderInUseError) as error:
        raise SystemExit(f"{script}: {error.strerror if isinstance(error, OSError) else error}") from None
    except OSError as error:  # a full device where no writer above named it (a marker, budget.json, a log)
        if not is_disk_full(error):
            raise
        where = f" while writing {error.filename}" if error.filename else ""
        raise SystemExit(
            f"{script}: no space left on the device{where}. Free some space and run the same command again: it "
            "resumes from its last complete checkpoint."
        ) from None


def process_start_time() -> float:
    """When this process started (time.time() scale), or now where that cannot be read."""
    try:
        import psutil

        return psutil.Process().create_time()
    except Exception:  # psutil missing or the platform does not say
        return time.time()


def _command(argv: list[str] | None, prog: str | None) -> str:
    """The command line as typed, for results.json: the script's or the installed command's (published without its
    tokens and paths: `public_command`)."""
    if prog is None:
        return shlex.join(["python", *sys.argv] if argv is None else ["vanilla-transformer", "train", *argv])
    return shlex.join([*prog.split(), *(sys.argv[1:] if argv is None else argv)])


def headline(settings) -> str:
    """The run's first line: what it trains (the size the plan chooses, where it chooses), on what, for how long."""
    recipe, args = settings.recipe, settings.args
    if recipe.model_name_or_path:
        what = recipe.model_name_or_path
    elif len(settings.presets) > 1:
        what = f"a Transformer of the size the plan chooses ({', '.join(settings.presets)})"
    else:
        what = f"the {settings.presets[0]!r} Transformer"
    data = recipe.data_files or f"{recipe.dataset} {recipe.source_lang}-{recipe.target_lang}"
    length = f"{recipe.max_minutes:g} minutes" if settings.budgeted else None
    length = length or (f"{args.max_steps:,} updates" if args.max_steps > 0 else f"{args.num_train_epochs:g} epochs")
    source = f" (recipe {recipe.recipe})" if recipe.recipe else ""
    return f"Training {what} on {data} for {length}{source}, into {args.output_dir}."


def _train_and_report(settings, command: str) -> dict | None:
    recipe, args = settings.recipe, settings.args
    started = process_start_time()
    if args.should_save:
        print(headline(settings), flush=True)
    results = train_and_evaluate(settings, command=command, started=started)
    if results is None:  # not the main process of a multi-process launch
        return None
    test, training = results["test"], results["training"]
    print("\n" + "=" * 100)
    print(f"test sacreBLEU {test['bleu']:.2f}  ({test['bleu_signature']})")
    print(f"test chrF      {test['chrf']:.2f}  ({test['chrf_signature']})")
    print(
        f"{test['pairs']} held-out pairs, beam {test['beams']}; trained {training['steps']:,} updates "
        f"({training['epochs']:.1f} epochs) in {training['seconds'] / 60:.1f} min; "
        f"averaged {', '.join(results['averaged_checkpoints'])}"
    )
    for example in results["examples"]:
        print(
            f"\n  source:      {example['source']}\n  translation: {example['translation']}"
            f"\n  reference:   {example['reference']}"
        )
    print(
        f"\nModel folder: {args.output_dir} (model, tokenizer, results.json, README.md); "
        f"total {(time.time() - started) / 60:.1f} min"
    )
    print(f"Where the time went, in minutes, {describe_time(results['time'])}.")
    if results["plan"].get("ended_by") == "epochs":
        print(
            f"The {recipe.max_epochs:g}-epoch cap (--max_epochs) ended training before the "
            f"{recipe.max_minutes:g}-minute budget: this corpus gives no more.",
            flush=True,
        )
    check = results.get("source_check") or {}
    if check.get("collapsed_at") is not None:
        entry = next(e for e in check["history"] if e["step"] == check["collapsed_at"])
        message = collapse_message(entry, args.output_dir, check["mode"])
        if check["mode"] == "stop":
            raise SourceCollapseError(message)
        print(f"\nWARNING: {message}", flush=True)
    return results
