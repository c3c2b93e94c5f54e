"""The command line of scripts/train.py and scripts/main.py: parse a recipe and flags, train, report."""

from __future__ import annotations

import logging
import shlex
import sys
import time
from pathlib import Path

from ..data.errors import CorpusError
from .checkpoints import CheckpointError
from .collapse import SourceCollapseError, collapse_message
from .recipes import parse_arguments
from .run import train_and_evaluate


def train_from_command_line(
    argv: list[str] | None = None, default_recipe: str | None = None, defaults: dict | None = None
) -> dict | None:
    """Train, evaluate and save as the flags say; print the plan, the test scores, a few translations and where
    the model went. Returns the results (None in the processes other than the main one). A bad recipe, flag,
    corpus or checkpoint ends the program with one line naming it."""
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    script = Path(sys.argv[0]).name if argv is None else "train.py"
    try:
        recipe, args = parse_arguments(argv, default_recipe=default_recipe, defaults=defaults)
    except ValueError as error:
        raise SystemExit(f"{script}: {error}") from None
    try:
        return _train_and_report(recipe, args, argv)
    except (CorpusError, CheckpointError, FileNotFoundError, SourceCollapseError) as error:
        raise SystemExit(f"{script}: {error}") from None


def process_start_time() -> float:
    """When this process started (time.time() scale), or now where that cannot be read."""
    try:
        import psutil

        return psutil.Process().create_time()
    except Exception:  # psutil missing or the platform does not say
        return time.time()


def _train_and_report(recipe, args, argv) -> dict | None:
    started = process_start_time()
    if args.should_save:
        what = f"the {recipe.preset!r} Transformer" if not recipe.model_name_or_path else recipe.model_name_or_path
        data = recipe.data_files or f"{recipe.dataset} {recipe.source_lang}-{recipe.target_lang}"
        length = f"{recipe.max_minutes:g} minutes" if recipe.max_minutes and args.max_steps <= 0 else None
        length = length or (
            f"{args.max_steps:,} updates" if args.max_steps > 0 else f"{args.num_train_epochs:g} epochs"
        )
        source = f" (recipe {recipe.recipe})" if recipe.recipe else ""
        print(f"Training {what} on {data} for {length}{source}, into {args.output_dir}.", flush=True)
    command = shlex.join(["python", *(sys.argv if argv is None else ["scripts/train.py", *argv])])
    results = train_and_evaluate(recipe, args, command=command, started=started)
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
