"""The checks of a training run's arguments (`arguments.py`), before any corpus or model work: each refuses a value
out of range, or one the run would silently ignore, with a ValueError that names it."""

from __future__ import annotations

from pathlib import Path

from ..model.configuration_vanilla_transformer import PRESETS
from .arguments import ModelDataArguments, TransformerTrainingArguments
from .budget import check_cooldown_fraction
from .choices import (
    average_last_by_epochs,
    budgeted,
    dropout_by_epochs,
    length_penalty_choices,
    peak_by_start_bleu,
    preset_choices,
    size_min_updates,
    token_choices,
    warmup_by_start_bleu,
)
from .models import parse_config_overrides


def check_schedule_arguments(args: TransformerTrainingArguments) -> None:
    """The §5.3 schedule sets the learning rate at every step; refuse the Trainer flags it would silently ignore."""
    default_rate = TransformerTrainingArguments.__dataclass_fields__["learning_rate"].default
    if args.learning_rate != default_rate:
        raise ValueError(
            f"learning_rate={args.learning_rate} is not used: the §5.3 schedule sets the rate from d_model and "
            "warmup_steps. Scale it with --lr_scale (peak = lr_scale * d_model^-0.5 * warmup_steps^-0.5)."
        )
    check_cooldown_fraction(args.cooldown_fraction)
    if args.lr_scheduler_type != "linear":  # a str enum after TrainingArguments.__post_init__
        raise ValueError(
            f"lr_scheduler_type={args.lr_scheduler_type!r} is not supported: training always uses the §5.3 schedule "
            "(warmup_steps, lr_scale)."
        )


def check_run_arguments(recipe: ModelDataArguments, args: TransformerTrainingArguments) -> None:
    """Every check of the two argument dataclasses, before any corpus or model work: a ValueError names the value."""
    check_recipe_arguments(recipe)
    check_schedule_arguments(args)
    for name in ("preset_choices", "max_tokens_choices"):
        if getattr(recipe, name) and not budgeted(recipe, args):
            raise ValueError(
                f"{name}={getattr(recipe, name)!r} needs a time budget to choose by (max_minutes, without max_steps)."
            )
    if args.push_to_hub:  # publishing stays explicit: the push command's allowlist, card and line (docs/security.md)
        raise ValueError(
            "push_to_hub=True is not supported: publish the finished folder with `vanilla-transformer push "
            "OUTPUT_DIR REPO_ID [--private]`, which uploads only the model's files and says whether the repository is "
            "public."
        )
    if recipe.preset_choices and recipe.model_name_or_path:
        raise ValueError(
            f"preset_choices={recipe.preset_choices!r} cannot apply to the saved model {recipe.model_name_or_path!r}; "
            "give one or the other."
        )
    if recipe.model_name_or_path and Path(recipe.model_name_or_path).exists():
        start, output = Path(recipe.model_name_or_path).resolve(), Path(args.output_dir).resolve()
        if start == output or output in start.parents:
            raise ValueError(
                f"model_name_or_path={recipe.model_name_or_path!r} is inside output_dir={args.output_dir!r}: the run "
                "writes its checkpoints and its model there, over the model it starts from and keeps if it is the "
                "better; give another output_dir."
            )


def check_recipe_arguments(recipe: ModelDataArguments) -> None:
    """Raise a ValueError naming the value for recipe fields out of range, the lists of choices among them."""
    if recipe.preset not in PRESETS and not recipe.model_name_or_path:
        raise ValueError(f"preset={recipe.preset!r} is invalid; expected one of {sorted(PRESETS)}.")
    length_penalty_choices(recipe)
    preset_choices(recipe)
    token_choices(recipe)
    parse_config_overrides(recipe.config_overrides)
    if recipe.config_overrides and recipe.model_name_or_path:
        raise ValueError(
            f"config_overrides={recipe.config_overrides!r} cannot change the sizes of the saved model "
            f"{recipe.model_name_or_path!r}; give it with a --preset only."
        )
    if recipe.bpe_sample_pairs is not None and recipe.bpe_sample_pairs < 1:
        raise ValueError(f"bpe_sample_pairs={recipe.bpe_sample_pairs} is invalid; expected a positive number of pairs.")
    if recipe.preprocessing_num_workers is not None and recipe.preprocessing_num_workers < 1:
        raise ValueError(
            f"preprocessing_num_workers={recipe.preprocessing_num_workers} is invalid; expected at least 1 process."
        )
    if recipe.wmt14_dir is not None and recipe.dataset != "wmt14":
        raise ValueError(f"wmt14_dir={recipe.wmt14_dir!r} applies to --dataset wmt14 only, not to {recipe.dataset!r}.")
    if recipe.max_minutes is not None and recipe.max_minutes <= 0:
        raise ValueError(f"max_minutes={recipe.max_minutes:g} is invalid; expected a positive number of minutes.")
    if recipe.peak_learning_rate is not None and recipe.peak_learning_rate <= 0:
        raise ValueError(f"peak_learning_rate={recipe.peak_learning_rate} is invalid; expected a positive rate.")
    if recipe.peak_learning_rate_preset is not None and recipe.peak_learning_rate_preset not in PRESETS:
        raise ValueError(
            f"peak_learning_rate_preset={recipe.peak_learning_rate_preset!r} is invalid; expected one of "
            f"{sorted(PRESETS)}."
        )
    if recipe.lr_reference_tokens is not None and recipe.lr_reference_tokens < 1:
        raise ValueError(f"lr_reference_tokens={recipe.lr_reference_tokens} is invalid; expected a positive count.")
    for name in ("checkpoints_per_run", "evaluations_per_run"):
        value = getattr(recipe, name)
        if value is not None and value < 1:
            raise ValueError(f"{name}={value} is invalid; expected at least 1.")
    if recipe.min_updates is not None and recipe.min_updates < 1:
        raise ValueError(f"min_updates={recipe.min_updates} is invalid; expected at least 1.")
    size_min_updates(recipe), dropout_by_epochs(recipe), average_last_by_epochs(recipe)
    peak_by_start_bleu(recipe), warmup_by_start_bleu(recipe)
    if recipe.plateau_validations is not None and recipe.plateau_validations < 1:
        raise ValueError(f"plateau_validations={recipe.plateau_validations} is invalid; expected at least 1.")
    if recipe.max_warmup_fraction is not None and not 0 < recipe.max_warmup_fraction <= 1:
        raise ValueError(f"max_warmup_fraction={recipe.max_warmup_fraction} is invalid; expected a fraction in (0, 1].")
    if recipe.max_epochs is not None and recipe.max_epochs <= 0:
        raise ValueError(f"max_epochs={recipe.max_epochs} is invalid; expected a positive number of epochs.")
    if not 0 < recipe.average_window <= 1:
        raise ValueError(f"average_window={recipe.average_window} is invalid; expected a fraction in (0, 1].")
    if recipe.attn_implementation not in (None, "auto", "eager", "sdpa", "flash_attention_2", "flex_attention"):
        raise ValueError(
            f"attn_implementation={recipe.attn_implementation!r} is invalid; expected eager, sdpa, "
            "flash_attention_2, flex_attention or auto."
        )
