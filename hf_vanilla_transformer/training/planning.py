"""Training to a time budget (`--max_minutes`): the run's plan, a value computed once and read by the run.

A recipe that counts updates keeps its promise on one kind of machine only: the CPU recipe's 5,400 updates take
26 minutes on a Xeon with AMX in bf16 and 77 on an AVX2-only EPYC in fp32. With a budget the run instead

1. measures, before training, the time of a real update on a throwaway copy of the model, for each precision,
   attention implementation, batch size and model size the recipe leaves open (`calibration.py`), and keeps the
   fastest precision and attention, and the largest batch and model that still reach `min_updates`;
2. fixes the number of updates that fits what is left of the budget once set-up so far, the checkpoints, the
   validation passes and the test decoding are paid for;
3. derives the §5.3 warmup, the learning rate, the checkpoint spacing and the validation cadence from that number,
   and records the plan in `budget.json`, in every checkpoint's trainer state and in `results.json`, so that a
   resumed run keeps it: a run is reproducible for a seed on a given machine.

The plan never changes the user's arguments: `trainer_arguments` gives the Trainer a copy with the plan's values.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from ..data.batching import accumulation_steps
from ..evaluation.length_penalty import length_penalty_choices
from .arguments import preset_choices, token_choices
from .calibration import Measurement, measure_checkpoint_seconds, measure_choices


BUDGET_FILE = "budget.json"

# Decoding one test sentence with beam 4 costs about as much as training on this many tokens per side (an update's
# time divided by its tokens per batch): 1,152 sentences took 64 s at 0.86 s per 2,048-token update (EPYC, AVX2,
# fp32: 132 tokens), 75 s at 0.48 s per 1,024-token update (EPYC, fp32: 140), 22.4 s at 0.29 s per 2,048-token
# update (Xeon, AMX, bf16: 137), 57 s at 0.54 s per 1,024-token update (a slower EPYC, fp32: 94); greedy validation
# about half. The largest of them.
DECODE_TOKENS_PER_SENTENCE = {1: 90, 4: 140}
# What the planner keeps back: Trainer's own work per update (collation, scheduler, logging, token counting, the
# first touches of memory in a new process), measured as real updates against the calibration's (validation and
# checkpoints apart): on an EPYC (fp32) 0.835 s against 0.75 s with 2,048-token batches, 0.51 s against 0.42 s with
# 1,024; on a slower EPYC 0.517 s against 0.485 s and 0.563 s against 0.518 s with 1,024 (runs A and C of
# docs/cpu_recipe.md). Planning near the low end leaves less of the budget unused; a run that turns out slower
# stops at the deadline, saved, and averages its end.
TRAINER_OVERHEAD = 1.08
FINISHING_SECONDS = 30.0
SAFETY = 0.97  # of the training time left, for the noise of a shared machine


@dataclass
class BudgetPlan:
    """A run's length and what follows from it, with the reasons, as recorded in `budget.json`."""

    max_steps: int
    warmup_steps: int
    save_steps: int
    eval_steps: int | None
    precision: str  # "bf16" or "fp32"
    attn_implementation: str | None
    max_tokens: int | None = None  # padded source (and target) tokens per batch
    preset: str | None = None  # the model size trained by a budgeted run (None: the recipe's preset)
    max_minutes: float | None = None  # None: the length was given (--max_steps)
    seconds_per_update: float | None = None  # measured, for the chosen precision and attention
    planned_training_seconds: float | None = None  # updates, validation and checkpoints
    predicted_decode_seconds: float | None = None
    measured: dict[str, float] = field(default_factory=dict)  # "fp32/eager" -> seconds per update
    reasons: list[str] = field(default_factory=list)
    gradient_accumulation_steps: int | None = None  # batches per update (None in plans recorded before it)
    lr_scale: float | None = None  # the factor on the §5.3 schedule (None in plans recorded before it)
    checkpoint_seconds: float | None = None  # predicted for one checkpoint, one validation (re-plans measure them)
    validation_seconds: float | None = None
    replans: list[dict] = field(default_factory=list)  # each re-fit of the length from the run's own updates
    # Every (preset, batch size) calibrated, in the recipe's order of preference, with its seconds per update: what
    # the run may switch to when its own updates prove the calibration wrong (replanning.better_candidate).
    candidates: list[dict] = field(default_factory=list)
    switched_from: dict | None = None  # the choice a switch left, and why

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> BudgetPlan:
        known = {name: data[name] for name in cls.__dataclass_fields__ if name in data}
        return cls(**known)

    def summary(self) -> str:
        """One line a person reads at the start of a run: what was chosen and why."""
        return "; ".join(self.reasons)


@dataclass
class PlanContext:
    """What the planner reads about a run: its two argument dataclasses (never changed), the model of the recipe's
    preset, samples of real training batches, the sizes of the held-out splits and when the budget's clock started.

    `sample_batches(max_tokens)` gives a few collated training batches of that size (for calibration);
    `updates_per_epoch(max_tokens, accumulation)` the updates in an epoch of the training split; `build(preset)` a
    new model of another preset, to measure the recipe's `preset_choices` (None: the recipe's preset only)."""

    recipe: object  # ModelDataArguments
    args: object  # TransformerTrainingArguments
    model: torch.nn.Module
    sample_batches: Callable[[int], list[dict]]
    updates_per_epoch: Callable[[int, int], int]
    validation_pairs: int | None  # None: no validation split
    test_pairs: int
    started: float
    build: Callable[[str], torch.nn.Module] | None = None
    known: Measurement | None = None  # a run switched to another choice: its seconds, measured by the Trainer

    @property
    def budgeted(self) -> bool:
        return self.recipe.max_minutes is not None and self.args.max_steps <= 0


@dataclass
class BudgetFit:
    """How a measured update time fits the budget: the batch size, the updates, the seconds planned and predicted,
    the reason in words, and whether the updates reach the recipe's `min_updates` (`enough`)."""

    max_tokens: int
    max_steps: int
    seconds_per_update: float
    training_seconds: float
    decode_seconds: float
    reason: str
    enough: bool
    checkpoint_seconds: float = 0.0
    validation_seconds: float = 0.0


# ---------------------------------------------------------------------------------------------------------------------
# Arithmetic
# ---------------------------------------------------------------------------------------------------------------------


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


def updates_that_fit(
    seconds: float,
    seconds_per_update: float,
    checkpoints: int = 0,
    seconds_per_checkpoint: float = 0.0,
    validations: int = 0,
    seconds_per_validation: float = 0.0,
) -> int:
    """How many updates fit `seconds` of training, once `checkpoints` saves and `validations` passes are paid for
    (their number is fixed per run: their spacing grows with the run)."""
    if seconds_per_update <= 0:
        raise ValueError(f"seconds_per_update={seconds_per_update} is invalid; expected a positive measured time.")
    left = seconds - checkpoints * seconds_per_checkpoint - validations * seconds_per_validation
    return max(0, math.floor(left / seconds_per_update))


def decode_seconds(sentences: int, beams: int, seconds_per_update: float, tokens_per_update: int) -> float:
    """Predicted time to translate `sentences` with `beams` beams, from the time of an update of
    `tokens_per_update` tokens per side of the same model on the same machine."""
    per_token = seconds_per_update / tokens_per_update
    if beams <= 1:
        return sentences * DECODE_TOKENS_PER_SENTENCE[1] * per_token
    return sentences * DECODE_TOKENS_PER_SENTENCE[4] * max(1, beams) / 4 * per_token


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


def lr_scale_for(recipe, args, d_model: int, warmup: int) -> float:
    """The factor on the §5.3 schedule (peak lr_scale * d_model^-0.5 * warmup^-0.5 at the end of warmup). A recipe
    that names its peak gets the lr_scale that reaches it; where a short run cut the warmup (max_warmup_fraction),
    the rate climbs the same ramp and peaks lower: a post-LN model needs the ramp (warmup 308 to the full peak
    stalled at loss 4.7 on the CPU recipe, docs/cpu_recipe.md)."""
    if recipe.peak_learning_rate is None:
        return recipe.lr_scale
    peak = recipe.peak_learning_rate
    nominal = args.warmup_steps
    if nominal >= 1 and warmup < nominal:
        peak *= warmup / nominal
    return peak * (d_model * warmup) ** 0.5


# ---------------------------------------------------------------------------------------------------------------------
# Planning a run
# ---------------------------------------------------------------------------------------------------------------------


def new_plan(context: PlanContext) -> BudgetPlan:
    """A new plan for the run `context` describes: measured where the budget or an `auto` choice asks for it, then
    its length and schedule. A budgeted run measures each preset of `preset_choices` in turn (largest first) and
    keeps the first whose fit reaches `min_updates`, else the last."""
    recipe = context.recipe
    if not context.budgeted:
        return _given_length_plan(context)
    sizes = token_choices(recipe)
    presets = preset_choices(recipe) if context.build is not None else [recipe.preset]
    measured, reasons, fixed, candidates = {}, [], None, []
    for index, preset in enumerate(presets):
        model = context.model if preset == recipe.preset else context.build(preset)
        # 1. Precision, attention and the time of a batch at each size; a smaller preset keeps the precision and
        #    attention measured on the first. A run switched to another choice knows its time already.
        measurement = context.known or measure_choices(
            recipe, context.args, model, context.sample_batches, sizes, True, fixed
        )
        fixed = (measurement.precision, measurement.attention)
        prefix = f"{preset}/" if len(presets) > 1 else ""
        measured.update({prefix + name: seconds for name, seconds in measurement.measured.items()})
        reasons = reasons or measurement.reasons
        candidates += [_candidate(context, preset, size, measurement.per_size[size]) for size in sizes]
        # 2. The number of updates (and the batch size): what fits the budget.
        fit = fit_budget(context, model, sizes, measurement.per_size)
        if fit.enough or index == len(presets) - 1:
            break
    if fit.max_steps < 1:
        raise ValueError(
            f"max_minutes={recipe.max_minutes} leaves no time to train on this machine (set-up took "
            f"{(time.time() - context.started) / 60:.1f} min, an update {fit.seconds_per_update:.2f} s); give more "
            "minutes."
        )
    reason = fit.reason
    if len(presets) > 1:
        rule = "the largest that gives" if fit.enough else "none gives"
        reason = f"the {preset} model ({', '.join(presets)}: {rule} {recipe.min_updates or 0:,} updates); {reason}"
    plan = _schedule(context, model, fit.max_steps, fit.max_tokens, measurement, [*reasons, reason], measured)
    plan.preset = preset
    plan.max_minutes = recipe.max_minutes
    plan.seconds_per_update = fit.seconds_per_update
    plan.planned_training_seconds = fit.training_seconds
    plan.predicted_decode_seconds = fit.decode_seconds
    plan.checkpoint_seconds, plan.validation_seconds = fit.checkpoint_seconds, fit.validation_seconds
    plan.candidates = candidates
    return plan


def _candidate(context: PlanContext, preset: str, max_tokens: int, seconds_per_batch: float) -> dict:
    """A calibrated choice: its preset, batch size, accumulation, seconds per update and updates per epoch."""
    accumulation = accumulation_for(context.recipe, context.args, max_tokens)
    return {
        "preset": preset,
        "max_tokens": max_tokens,
        "accumulation": accumulation,
        "seconds_per_update": seconds_per_batch * accumulation,
        "updates_per_epoch": context.updates_per_epoch(max_tokens, accumulation),
    }


def _given_length_plan(context: PlanContext) -> BudgetPlan:
    """The plan of a run whose length is given (`--max_steps`, or epochs): the precision and attention measured
    only where the recipe leaves them open."""
    recipe, args = context.recipe, context.args
    max_tokens = recipe.max_tokens
    measurement = measure_choices(recipe, args, context.model, context.sample_batches, [max_tokens], False)
    per_epoch = context.updates_per_epoch(max_tokens, accumulation_for(recipe, args, max_tokens))
    max_steps = args.max_steps if args.max_steps > 0 else math.ceil(args.num_train_epochs * per_epoch)
    reasons = [*measurement.reasons, f"{max_steps:,} updates as given"]
    plan = _schedule(context, context.model, max_steps, max_tokens, measurement, reasons, measurement.measured)
    plan.seconds_per_update = measurement.per_size.get(max_tokens)
    return plan


def _schedule(context, model, max_steps, max_tokens, measurement: Measurement, reasons, measured) -> BudgetPlan:
    """The plan of a run of `max_steps` updates: the schedule follows from the length (warmup, checkpoint and
    validation spacing), the learning rate from the warmup and the model's width."""
    recipe, args = context.recipe, context.args
    warmup, save, evaluate = schedule_for(
        max_steps,
        args.warmup_steps,
        recipe.checkpoints_per_run,
        recipe.evaluations_per_run,
        args.save_steps,
        args.eval_steps,
        max_warmup_fraction=recipe.max_warmup_fraction,
    )
    cadence = f"warmup {warmup:,} updates, a checkpoint every {save:,}"
    if args.eval_strategy == "steps" and evaluate:
        cadence += f", validation every {evaluate:,}"
    return BudgetPlan(
        max_steps=max_steps,
        warmup_steps=warmup,
        save_steps=save,
        eval_steps=evaluate,
        precision=measurement.precision,
        attn_implementation=measurement.attention,
        max_tokens=max_tokens,
        measured=measured,
        reasons=[*reasons, cadence],
        gradient_accumulation_steps=accumulation_for(recipe, args, max_tokens),
        lr_scale=lr_scale_for(recipe, args, model.config.d_model, warmup),
    )


def fit_budget(context: PlanContext, model, sizes: list[int], per_size: dict[int, float]) -> BudgetFit:
    """The largest batch size of `sizes` that still gives `min_updates` updates in the budget (enough), else the
    smallest, from the measured seconds of a batch at each size."""
    recipe, args = context.recipe, context.args
    checkpoint_seconds = measure_checkpoint_seconds(model) if recipe.checkpoints_per_run else 0.0
    for max_tokens in sizes:
        accumulation = accumulation_for(recipe, args, max_tokens)
        seconds = per_size[max_tokens] * accumulation
        fit = _updates_for_budget(context, max_tokens, accumulation, seconds, checkpoint_seconds)
        if fit.enough:
            break
    if len(sizes) > 1:
        listed = ", ".join(map(str, sizes))
        fit.reason += f"; batches of {fit.max_tokens:,} tokens per side (of {listed}: " + (
            f"the largest that gives {recipe.min_updates:,} updates)"
            if fit.enough
            else f"none gives {recipe.min_updates or 0:,} updates here)"
        )
    return fit


def _finishing_seconds(context: PlanContext, update: float, tokens: int) -> tuple[float, float, int]:
    """(test decoding with the choice of alpha, one validation pass, validations per run), predicted from the
    time of an update of `tokens` padded tokens per side."""
    recipe, args, pairs = context.recipe, context.args, context.validation_pairs
    decode = decode_seconds(context.test_pairs, recipe.test_beams, update, tokens)
    alphas = len(length_penalty_choices(recipe)) if pairs is not None else 0
    decode += alphas * decode_seconds(pairs, recipe.test_beams, update, tokens) if alphas else 0.0
    validations = (recipe.evaluations_per_run or 0) if args.eval_strategy == "steps" and pairs is not None else 0
    # A validation pass: greedy decoding of its pairs, and their loss (batches of 64 pairs, ~1/10 of an update each).
    validation_seconds = (
        decode_seconds(pairs, args.generation_num_beams or 1, update, tokens) + pairs / 640 * update
        if validations
        else 0.0
    )
    return decode, validation_seconds, validations


def _updates_for_budget(
    context: PlanContext, max_tokens: int, accumulation: int, seconds_per_update: float, checkpoint_seconds: float
) -> BudgetFit:
    """The updates that fit the budget at `seconds_per_update` (measured) for updates of `accumulation` batches of
    `max_tokens` padded tokens per side and process, once set-up so far, the checkpoints, the validations and the
    test decoding are paid for."""
    recipe = context.recipe
    update = seconds_per_update * (1.0 if context.known else TRAINER_OVERHEAD)  # a known time is the Trainer's
    decode, validation_seconds, validations = _finishing_seconds(context, update, max_tokens * accumulation)
    checkpoints = recipe.checkpoints_per_run or 0
    spent = time.time() - context.started
    left = (recipe.max_minutes * 60 - spent - decode - FINISHING_SECONDS) * SAFETY
    fit = updates_that_fit(left, update, checkpoints, checkpoint_seconds, validations, validation_seconds)
    alphas = context.validation_pairs is not None and length_penalty_choices(recipe)
    reason = (
        f"{fit:,} updates fit {left / 60:.1f} training minutes of the {recipe.max_minutes:g}-minute budget "
        f"({update:.2f} s each; set-up so far {spent / 60:.1f} min, test decoding {decode / 60:.1f} min predicted"
        f"{', with the choice of alpha' if alphas else ''})"
    )
    per_epoch = context.updates_per_epoch(max_tokens, accumulation)
    if recipe.max_epochs is not None and fit > recipe.max_epochs * per_epoch:
        fit = max(1, math.floor(recipe.max_epochs * per_epoch))
        reason += f"; capped at {fit:,} = {recipe.max_epochs:g} epochs of this corpus"
    training = fit * update + checkpoints * checkpoint_seconds + validations * validation_seconds
    enough = recipe.min_updates is None or fit >= recipe.min_updates
    return BudgetFit(
        max_tokens, fit, seconds_per_update, training, decode, reason, enough, checkpoint_seconds, validation_seconds
    )


# ---------------------------------------------------------------------------------------------------------------------
# What the run reads from the plan
# ---------------------------------------------------------------------------------------------------------------------


def trainer_arguments(args, plan: BudgetPlan, d_model: int, max_steps: int | None = None):
    """A copy of the user's `args` with the plan's length (or the upper bound `max_steps` of a run whose length the
    budget may re-fit: the plan's length is then kept by the budget callback), schedule, precision, accumulation and
    §5.3 learning rate (lr_scale * d_model^-0.5, which the schedule multiplies): what the Trainer runs. `args` is
    left as given."""
    planned = copy.copy(args)
    planned.max_steps = max(plan.max_steps, max_steps or 0)
    planned.warmup_steps = plan.warmup_steps
    planned.save_steps = plan.save_steps
    if plan.eval_steps:
        planned.eval_steps = plan.eval_steps
    planned.bf16 = plan.precision == "bf16"
    planned.mixed_precision = "bf16" if planned.bf16 else ("fp16" if args.fp16 else "no")
    planned.gradient_accumulation_steps = plan.gradient_accumulation_steps
    planned.learning_rate = plan.lr_scale * d_model**-0.5
    return planned


def complete_recorded_plan(plan: BudgetPlan, recipe, args, d_model: int) -> BudgetPlan:
    """A plan recorded before it held the batch size, accumulation and lr_scale, with them computed as the run then
    did."""
    plan.max_tokens = plan.max_tokens or recipe.max_tokens
    if plan.gradient_accumulation_steps is None:
        plan.gradient_accumulation_steps = accumulation_for(recipe, args, plan.max_tokens or recipe.max_tokens)
    if plan.lr_scale is None:
        plan.lr_scale = lr_scale_for(recipe, args, d_model, plan.warmup_steps)
    return plan
