"""The §5.3 schedule of a run of a given length, in numbers: the warmup, the spacing of checkpoints and validations,
the batches per update, and the learning rate's factor that follows the model trained (`lr_scale_for`)."""

from __future__ import annotations

import math

from ..data.batching import accumulation_steps
from ..model.configuration_vanilla_transformer import PRESETS
from .arguments import parse_config_overrides


def warmup_for(max_steps: int, warmup: float, max_fraction: float | None = None) -> int:
    """Warmup updates: `warmup` itself when >= 1, else that fraction of the run; never more than `max_fraction` of
    the run where given; at least 1 update."""
    if warmup <= 0:
        raise ValueError(f"warmup_steps={warmup} is invalid; expected updates (>= 1) or a fraction of the run (0, 1).")
    updates = int(warmup) if warmup >= 1 else round(max_steps * warmup)
    if max_fraction is not None:
        if not 0 < max_fraction <= 1:
            raise ValueError(f"max_warmup_fraction={max_fraction} is invalid; expected a fraction in (0, 1].")
        updates = min(updates, round(max_steps * max_fraction))
    return max(1, updates)


def spacing_for(max_steps: int, per_run: int) -> int:
    """Updates between two of `per_run` evenly spaced events (checkpoints, validations) over `max_steps`."""
    if per_run < 1:
        raise ValueError(f"{per_run} events per run is invalid; expected at least 1.")
    return max(1, math.ceil(max_steps / per_run))


def schedule_for(
    max_steps: int,
    warmup: float,
    checkpoints_per_run: int | None,
    evaluations_per_run: int | None,
    save_steps: float,
    eval_steps: float | None,
    max_warmup_fraction: float | None = None,
) -> tuple[int, int, int | None]:
    """(warmup, checkpoint spacing, validation spacing) for a run of `max_steps` updates: fractions of the run where
    the recipe gives them per run, else the fixed spacings given."""
    save = spacing_for(max_steps, checkpoints_per_run) if checkpoints_per_run else max(1, int(save_steps))
    if evaluations_per_run:
        evaluate = spacing_for(max_steps, evaluations_per_run)
        if checkpoints_per_run and evaluations_per_run <= checkpoints_per_run:
            evaluate = save * max(1, round(evaluate / save))  # validate where a checkpoint is saved
    else:
        evaluate = int(eval_steps) if eval_steps else None
    return warmup_for(max_steps, warmup, max_warmup_fraction), save, evaluate


def updates_per_epoch(sampler, accumulation: int, world_size: int) -> int:
    """Updates in an epoch of `sampler`'s batches, `accumulation` batches per update in each of `world_size`
    processes."""
    return max(1, math.ceil(len(sampler) / (accumulation * max(1, world_size))))


def accumulation_for(recipe, args, max_tokens: int) -> int:
    """Batches per update: the given gradient accumulation, or more where `tokens_per_update` asks for it."""
    return max(
        args.gradient_accumulation_steps, accumulation_steps(recipe.tokens_per_update, max_tokens, args.world_size)
    )


def lr_scale_for(recipe, args, warmup: int, tokens_per_update: int, d_model: int) -> float:
    """The factor on the §5.3 schedule, lr = lr_scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), for a
    run of `warmup` warmup updates of `tokens_per_update` source tokens; `d_model` is the width of the model trained
    (used where the rate was named for it: a saved model fine-tuned).

    1. The recipe's rate: `lr_scale`, or the one that gives its `peak_learning_rate` to the model it names it for
       (`peak_learning_rate_preset`, else `preset`). The factor is the same for every size, so each peaks at
       lr_scale * d_model^-0.5 * warmup^-0.5: the rate follows the model (the CPU recipe's 1.98e-3 for small is
       1.40e-3 for base and 0.99e-3 for big, at the update size it is named for), as §5.3 has it.
    2. Where the recipe names the update size its rate holds at (`lr_reference_tokens`), the square root of the
       update's tokens over it.
    3. Where a short run cut the warmup (`max_warmup_fraction`), the rate climbs the same ramp and peaks lower: a
       post-LN model needs the ramp (warmup 308 to the full peak stalled at loss 4.7 on the CPU recipe,
       docs/cpu_recipe.md)."""
    nominal = args.warmup_steps if args.warmup_steps >= 1 else warmup
    scale = recipe.lr_scale
    if recipe.peak_learning_rate is not None:
        scale = recipe.peak_learning_rate * (rate_owner_d_model(recipe, d_model) * nominal) ** 0.5
    if recipe.lr_reference_tokens:
        scale *= (tokens_per_update / recipe.lr_reference_tokens) ** 0.5
    if warmup < nominal:
        scale *= (warmup / nominal) ** 1.5
    return scale


def rate_owner_d_model(recipe, d_model: int) -> int:
    """The width of the model a `peak_learning_rate` was named for: its `peak_learning_rate_preset`'s, else the
    run's preset's (with its config overrides), else (a saved model) `d_model`."""
    if recipe.peak_learning_rate_preset:
        return PRESETS[recipe.peak_learning_rate_preset]["d_model"]
    if recipe.model_name_or_path:
        return d_model
    return parse_config_overrides(recipe.config_overrides).get("d_model", PRESETS[recipe.preset]["d_model"])


def peak_learning_rate(lr_scale: float, d_model: int, warmup: int) -> float:
    """The §5.3 schedule's peak, at the end of warmup: lr_scale * d_model^-0.5 * warmup^-0.5."""
    return lr_scale * (d_model * max(1, warmup)) ** -0.5
