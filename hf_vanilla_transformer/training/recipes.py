"""Training recipes as files: one shipped with the package by name (cpu, gpu, base, big: `configs/recipes/`) or any
YAML/JSON file of flags.

A recipe holds values of `ModelDataArguments` and `TransformerTrainingArguments`; it becomes the defaults of
`HfArgumentParser`, so every flag on the command line overrides it:

    vanilla-transformer train --recipe cpu --data_files mine.tsv --max_minutes 30 --output_dir runs/mine
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch
import yaml
from transformers import HfArgumentParser

from ..configs import config_files
from ..utils.command_line import unknown_words
from .arguments import ModelDataArguments, TransformerTrainingArguments
from .choices import settle_choices
from .settings import RunSettings, settle


def recipe_file(name: str | Path) -> Path:
    """The file of recipe `name`: a path to a .yaml/.yml/.json file, or the name of one shipped with the package."""
    path = Path(name)
    shipped = config_files("recipes")
    if path.suffix not in (".yaml", ".yml", ".json"):
        path = shipped.get(str(name), path)
    if not path.is_file():
        raise ValueError(
            f"recipe {str(name)!r} not found; expected a YAML or JSON file, or one of {sorted(shipped)} (shipped with "
            "the package)."
        )
    return path


EXTENDS = "extends"  # a recipe's key that names the recipe it is written over ("machine": this machine's, cpu or gpu)
FINE_TUNING = "finetune"  # the recipe of a run that starts from a saved model (`--model_name_or_path`), by default
# A value given (on the command line, or by a recipe over the one it extends) is the run's own: the rule that would
# set it from what the run measures is turned off, unless the same place gives the rule too.
RULE_OF_VALUE = {
    "dropout": "dropout_by_epochs",  # a dropout given is the run's, whatever its epochs
    "peak_learning_rate": "peak_by_start_bleu",  # a peak given is the run's, whatever its start scores
    "warmup_steps": "warmup_by_start_bleu",  # so is a warmup given
    "average_last": "average_last_by_epochs",  # and the checkpoints averaged given ...
    "average_window": "average_last_by_epochs",  # ... or the fraction of the run they come from
}


def rules_given_values_turn_off(given: set[str], under: dict | None = None) -> dict:
    """The rules (None) that values in `given` turn off (`RULE_OF_VALUE`), where `given` does not name the rule itself
    and `under` (the values of the recipe extended; None: the command line's, over every flag) has the rule."""
    return {
        rule: None
        for value, rule in RULE_OF_VALUE.items()
        if value in given and rule not in given and (under is None or rule in under)
    }


def read_recipe(name: str | Path) -> dict:
    """The flags of recipe `name` as a dict (with the recipe it `extends`, if it names one); a ValueError names any
    key that is no flag."""
    path = recipe_file(name)
    values = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(values, dict):
        raise ValueError(f"{path} holds a {type(values).__name__}; expected a mapping of flag names to values.")
    known = set(ModelDataArguments.__dataclass_fields__) | set(TransformerTrainingArguments.__dataclass_fields__)
    unknown = sorted(set(values) - known - {EXTENDS})
    if unknown:
        raise ValueError(f"{path}: {unknown} are not flags of training; see `vanilla-transformer train --help`.")
    return values


def recipe_values(name: str | Path, argv: list[str] | None = None) -> dict:
    """The flags of recipe `name` written over those of the recipe it `extends` ("machine": `machine_recipe(argv)`),
    itself read the same way; a ValueError names a recipe that extends itself."""
    values, seen = read_recipe(name), [str(name)]
    while EXTENDS in values:
        base = values.pop(EXTENDS)
        base = machine_recipe(argv) if base == "machine" else str(base)
        if base in seen:
            raise ValueError(f"recipe {seen[0]!r} extends {base!r}, which extends it again: {' -> '.join(seen)}.")
        seen.append(base)
        under = read_recipe(base)
        given = {name for name, value in values.items() if value is not None}  # null: the default, no value given
        values = {**under, **values, **rules_given_values_turn_off(given, under)}
    return values


def machine_recipe(argv: list[str] | None = None) -> str:
    """The recipe of the main job on this machine: `gpu` where PyTorch sees a CUDA device and the command line
    `argv` (default: this process's) does not ask for the CPU (`--use_cpu true`), else `cpu`."""
    argv = sys.argv[1:] if argv is None else argv
    first = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    first.add_argument("--use_cpu", nargs="?", const="true", default="false")
    known, _ = first.parse_known_args(argv)
    on_cpu = known.use_cpu.lower() in ("true", "1", "yes")
    return "gpu" if torch.cuda.is_available() and not on_cpu else "cpu"


def given_flags(argv: list[str]) -> set[str]:
    """The flag names on the command line `argv` (`--max_tokens 1024`, `--max-tokens=1024`: max_tokens)."""
    return {token[2:].split("=", 1)[0].replace("-", "_") for token in argv if token.startswith("--")}


def parse_arguments(
    argv: list[str] | None = None,
    default_recipe: str | None = None,
    defaults: dict | None = None,
    prog: str | None = None,
) -> tuple[ModelDataArguments, TransformerTrainingArguments]:
    """The two argument dataclasses from the command line `argv`, over the values of `--recipe` (or
    `default_recipe`), over `defaults`. An explicit `--bf16` fixes the precision that a recipe's `auto` would
    measure (`--bf16 false` on an AMX machine shows what a CPU without bf16 units gets). `prog` names the command
    in the usage and the help (default: the script's file name). Flags are taken written in full only, and an
    unknown one is a ValueError naming it without its value (utils/command_line.py). The values are parsed, not
    checked: `parse_run` settles them (`settings.settle`, every check)."""
    first = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    first.add_argument("--recipe", default=default_recipe)
    first.add_argument("--model_name_or_path", "--model-name-or-path")  # HfArgumentParser takes both
    known, _ = first.parse_known_args(argv)
    values = dict(defaults or {})
    if known.model_name_or_path and "recipe" not in given_flags(argv if argv is not None else sys.argv[1:]):
        known.recipe = FINE_TUNING  # a saved model is continued, not trained again from scratch
    if known.recipe:
        values.update(recipe_values(known.recipe, argv))
        values["recipe"] = str(known.recipe)
        if "peak_learning_rate" in values and "preset" in values:  # a recipe file's peak is its own preset's
            values.setdefault("peak_learning_rate_preset", values["preset"])
    parser = HfArgumentParser((ModelDataArguments, TransformerTrainingArguments), prog=prog, allow_abbrev=False)
    parser.set_defaults(**values)
    recipe, args, unknown = parser.parse_args_into_dataclasses(args=argv, return_remaining_strings=True)
    if unknown:  # named without their values (utils/command_line.py)
        raise ValueError(unknown_words(unknown, parser))
    given = given_flags(argv if argv is not None else sys.argv[1:])
    changes = {}
    if "bf16" in given or "fp16" in given:  # an explicit mixed precision fixes what `auto` would measure
        changes["precision"] = "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32"
    changes.update(rules_given_values_turn_off(given))
    if "peak_learning_rate" in given:  # the command line's peak is the run's own preset's and update size's ...
        for owner in ("peak_learning_rate_preset", "lr_reference_tokens"):
            if owner not in given:  # ... not those the recipe named for its own peak
                changes[owner] = None
    return settle_choices(dataclasses.replace(recipe, **changes), args, given), args


def parse_run(
    argv: list[str] | None = None,
    default_recipe: str | None = None,
    defaults: dict | None = None,
    prog: str | None = None,
) -> RunSettings:
    """The run of the command line `argv` (see `parse_arguments`), settled: a ValueError names a bad value."""
    return settle(*parse_arguments(argv, default_recipe, defaults, prog))
