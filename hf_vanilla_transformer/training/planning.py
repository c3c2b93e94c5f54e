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

The plan is a value: made here, changed only by making a new one (`dataclasses.replace`: the re-plans of
`replanning.py`), written and read back by `plan_record.py`. It never changes the user's arguments:
`trainer_arguments` gives the Trainer a copy with the plan's values.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

import torch

from ..utils.machine import describe_device
from .calibration import Measurement, Timing, measure_checkpoint_seconds, measure_choices
from .choices import budgeted, length_penalty_choices, preset_choices, token_choices
from .costs import (
    FINISHING_SECONDS,
    SAFETY,
    TRAINER_OVERHEAD,
    decode_seconds,
    updates_that_fit,
    validation_loss_seconds,
)
from .device import training_device
from .schedule import accumulation_for, lr_scale_for, peak_learning_rate, schedule_for


class BudgetError(ValueError):
    """A time budget that leaves no time to train on this machine; the message says how much set-up took."""


@dataclass
class BudgetPlan:
    """A run's length and what follows from it, with the reasons, as recorded in `budget.json`."""

    max_steps: int
    warmup_steps: int
    save_steps: int
    eval_steps: int | None
    precision: str  # "fp32", "bf16", and on CUDA "fp16" or "tf32" (device.py)
    attn_implementation: str | None
    max_tokens: int | None = None  # padded source (and target) tokens per batch
    preset: str | None = None  # the model size trained by a budgeted run (None: the recipe's preset)
    max_minutes: float | None = None  # None: the length was given (--max_steps)
    seconds_per_update: float | None = None  # measured, for the chosen precision and attention, of a shape met before
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
    torch_compile: bool = False  # the training step compiled (measured on CUDA in long runs: calibration.py)
    seconds_per_new_shape: float = 0.0  # what the first update of each new batch shape adds (calibration.py)
    once_seconds: float = 0.0  # what the first updates add once beyond that (a compilation's first graphs)
    predicted_seconds_per_update: float | None = None  # the run's updates, new shapes paid, over their number

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

    `sample_batches(max_tokens, count, taken)` gives that many collated training batches of that size, of shapes
    not in `taken` where the corpus has enough (added to it; for calibration);
    `updates_per_epoch(max_tokens, accumulation)` the updates in an epoch of the training split;
    `shapes_met(max_tokens, batches)` the distinct batch shapes among that many batches of the run (each costs its
    first update more: calibration.Timing); `build(preset)` a new model of another preset, to measure the recipe's
    `preset_choices` (None: the recipe's preset only)."""

    recipe: object  # ModelDataArguments
    args: object  # TransformerTrainingArguments
    model: torch.nn.Module
    sample_batches: Callable[[int, int, set], list[dict]]
    updates_per_epoch: Callable[[int, int], int]
    validation_pairs: int | None  # None: no validation split
    test_pairs: int
    started: float
    build: Callable[[str], torch.nn.Module] | None = None
    known: Measurement | None = None  # a run switched to another choice: its seconds, measured by the Trainer
    shapes_met: Callable[[int, int], float] = lambda max_tokens, batches: 0.0

    @property
    def budgeted(self) -> bool:
        return budgeted(self.recipe, self.args)

    def first_costs(self, timing: Timing, max_tokens: int, accumulation: int) -> Callable[[int], float]:
        """Seconds that `updates` updates of `accumulation` batches of `max_tokens` add to their steady time: the
        first update of every batch shape they meet, and what is paid once."""

        def cost(updates: int) -> float:
            if updates <= 0:
                return 0.0
            return timing.once + timing.per_shape * self.shapes_met(max_tokens, updates * accumulation)

        return cost


@dataclass
class BudgetFit:
    """How a measured update time fits the budget: the batch size, the updates, the seconds planned and predicted,
    the reason in words, and whether the updates reach the recipe's `min_updates` (`enough`)."""

    max_tokens: int
    max_steps: int
    seconds_per_update: float
    timing: Timing  # of one update (accumulation included)
    training_seconds: float
    decode_seconds: float
    reason: str
    enough: bool
    checkpoint_seconds: float = 0.0
    validation_seconds: float = 0.0


# ---------------------------------------------------------------------------------------------------------------------
# Arithmetic
# ---------------------------------------------------------------------------------------------------------------------


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
        # 1. Precision, attention, compilation and the time of a batch at each size, ranked by the time per update
        #    of a run of what fits the budget (new shapes paid); a smaller preset keeps the choices measured on the
        #    first. A run switched to another choice knows its time already.
        measurement = context.known or measure_choices(
            recipe, context.args, model, context.sample_batches, sizes, True, fixed, _budget_rank(context)
        )
        fixed = measurement.fixed
        prefix = f"{preset}/" if len(presets) > 1 else ""
        measured.update({prefix + name: seconds for name, seconds in measurement.measured.items()})
        reasons = reasons or measurement.reasons
        candidates += [_candidate(context, preset, size, measurement.per_size[size]) for size in sizes]
        # 2. The number of updates (and the batch size): what fits the budget.
        fit = fit_budget(context, model, sizes, measurement.per_size)
        if fit.enough or index == len(presets) - 1:
            break
    if fit.max_steps < 1:
        raise BudgetError(
            f"max_minutes={recipe.max_minutes} leaves no time to train on this machine (set-up took "
            f"{(time.time() - context.started) / 60:.1f} min, an update {fit.seconds_per_update:.2f} s); give more "
            "minutes."
        )
    reason = fit.reason
    if len(presets) > 1:
        rule = "the largest that gives" if fit.enough else "none gives"
        reason = f"the {preset} model ({', '.join(presets)}: {rule} {recipe.min_updates or 0:,} updates); {reason}"
    plan = _schedule(context, model, fit.max_steps, fit.max_tokens, measurement, [*reasons, reason], measured)
    return replace(
        plan,
        preset=preset,
        max_minutes=recipe.max_minutes,
        seconds_per_update=fit.seconds_per_update,
        seconds_per_new_shape=fit.timing.per_shape,
        once_seconds=fit.timing.once,
        predicted_seconds_per_update=_predicted_per_update(context, fit.timing, fit.max_tokens, fit.max_steps),
        planned_training_seconds=fit.training_seconds,
        predicted_decode_seconds=fit.decode_seconds,
        checkpoint_seconds=fit.checkpoint_seconds,
        validation_seconds=fit.validation_seconds,
        candidates=candidates,
    )


def _predicted_per_update(context: PlanContext, timing: Timing, max_tokens: int, updates: int) -> float:
    """Seconds per update of a run of `updates` updates (of the timing's accumulation), its new shapes paid."""
    accumulation = accumulation_for(context.recipe, context.args, max_tokens)
    first = context.first_costs(timing, max_tokens, accumulation)(updates)
    return timing.steady + first / max(1, updates)


def _budget_rank(context: PlanContext) -> Callable[[Timing, int], float]:
    """Rank the calibration's candidates by their seconds per update over the updates the budget would give them
    (capped by the epochs): the first update of each new batch shape paid, and what is paid once."""

    def rank(timing: Timing, max_tokens: int) -> float:
        accumulation = accumulation_for(context.recipe, context.args, max_tokens)
        update = timing.scaled(accumulation)
        seconds = context.recipe.max_minutes * 60 - (time.time() - context.started)
        updates = max(1, math.floor(seconds / update.steady))
        if context.recipe.max_epochs is not None:
            cap = context.recipe.max_epochs * context.updates_per_epoch(max_tokens, accumulation)
            updates = max(1, min(updates, math.floor(cap)))
        return _predicted_per_update(context, update, max_tokens, updates)

    return rank


def _candidate(context: PlanContext, preset: str, max_tokens: int, batch: Timing) -> dict:
    """A calibrated choice: its preset, batch size, accumulation, seconds per update and updates per epoch."""
    accumulation = accumulation_for(context.recipe, context.args, max_tokens)
    return {
        "preset": preset,
        "max_tokens": max_tokens,
        "accumulation": accumulation,
        "seconds_per_update": batch.steady * accumulation,
        "updates_per_epoch": context.updates_per_epoch(max_tokens, accumulation),
    }


def _given_length_plan(context: PlanContext) -> BudgetPlan:
    """The plan of a run whose length is given (`--max_steps`, or epochs): the precision, attention and compilation
    measured only where the recipe leaves them open, ranked by the time of the whole run."""
    recipe, args = context.recipe, context.args
    max_tokens = recipe.max_tokens
    accumulation = accumulation_for(recipe, args, max_tokens)
    per_epoch = context.updates_per_epoch(max_tokens, accumulation)
    max_steps = args.max_steps if args.max_steps > 0 else math.ceil(args.num_train_epochs * per_epoch)

    def rank(timing: Timing, size: int) -> float:
        return _predicted_per_update(context, timing.scaled(accumulation), size, max_steps)

    measurement = measure_choices(recipe, args, context.model, context.sample_batches, [max_tokens], False, None, rank)
    reasons = [*measurement.reasons, f"{max_steps:,} updates as given"]
    plan = _schedule(context, context.model, max_steps, max_tokens, measurement, reasons, measurement.measured)
    timing = measurement.per_size.get(max_tokens)
    if timing is None:
        return plan
    return replace(
        plan,
        seconds_per_update=timing.steady * accumulation,
        seconds_per_new_shape=timing.per_shape,
        once_seconds=timing.once,
        predicted_seconds_per_update=_predicted_per_update(context, timing.scaled(accumulation), max_tokens, max_steps),
    )


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
    accumulation = accumulation_for(recipe, args, max_tokens)
    d_model = model.config.d_model
    lr_scale = lr_scale_for(recipe, args, warmup, max_tokens * accumulation * max(1, args.world_size), d_model)
    peak = peak_learning_rate(lr_scale, d_model, warmup)
    cadence = f"warmup {warmup:,} updates to a peak learning rate of {peak:.2e}, a checkpoint every {save:,}"
    if args.eval_strategy == "steps" and evaluate:
        cadence += f", validation every {evaluate:,}"
    return BudgetPlan(
        max_steps=max_steps,
        warmup_steps=warmup,
        save_steps=save,
        eval_steps=evaluate,
        precision=measurement.precision,
        attn_implementation=measurement.attention,
        torch_compile=measurement.compiled,
        max_tokens=max_tokens,
        measured=measured,
        reasons=[_where(recipe, args), *reasons, cadence],
        gradient_accumulation_steps=accumulation,
        lr_scale=lr_scale,
    )


def _where(recipe, args) -> str:
    """Where the run trains and with which recipe, in words: the plan line's first part."""
    where = describe_device(training_device(args))
    return f"recipe {recipe.recipe} on {where}" if recipe.recipe else f"on {where}"


def fit_budget(context: PlanContext, model, sizes: list[int], per_size: dict[int, Timing]) -> BudgetFit:
    """The largest batch size of `sizes` that still gives `min_updates` updates in the budget (enough), else the
    smallest, from the measured seconds of a batch at each size."""
    recipe, args = context.recipe, context.args
    checkpoint_seconds = measure_checkpoint_seconds(model) if recipe.checkpoints_per_run else 0.0
    for max_tokens in sizes:
        accumulation = accumulation_for(recipe, args, max_tokens)
        fit = _updates_for_budget(context, max_tokens, accumulation, per_size[max_tokens], checkpoint_seconds)
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
    validation_seconds = (
        decode_seconds(pairs, args.generation_num_beams or 1, update, tokens)
        + validation_loss_seconds(pairs, update, recipe.source_check != "off")
        if validations
        else 0.0
    )
    return decode, validation_seconds, validations


def _updates_for_budget(
    context: PlanContext, max_tokens: int, accumulation: int, batch: Timing, checkpoint_seconds: float
) -> BudgetFit:
    """The updates that fit the budget at the `batch` timing (measured) for updates of `accumulation` batches of
    `max_tokens` padded tokens per side and process, once set-up so far, the checkpoints, the validations, the test
    decoding and the first update of each new batch shape are paid for."""
    recipe = context.recipe
    overhead = 1.0 if context.known else TRAINER_OVERHEAD  # a known time is the Trainer's
    timing = Timing(batch.steady * accumulation * overhead, batch.per_shape, batch.once)
    update = timing.steady
    decode, validation_seconds, validations = _finishing_seconds(context, update, max_tokens * accumulation)
    checkpoints = recipe.checkpoints_per_run or 0
    spent = time.time() - context.started
    left = (recipe.max_minutes * 60 - spent - decode - FINISHING_SECONDS) * SAFETY
    first_costs = context.first_costs(timing, max_tokens, accumulation)
    fit = updates_that_fit(left, update, checkpoints, checkpoint_seconds, validations, validation_seconds, first_costs)
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
    training = fit * update + first_costs(fit) + checkpoints * checkpoint_seconds + validations * validation_seconds
    enough = recipe.min_updates is None or fit >= recipe.min_updates
    return BudgetFit(
        max_tokens,
        fit,
        timing.steady / overhead,
        Timing(timing.steady / overhead, timing.per_shape, timing.once),
        training,
        decode,
        reason,
        enough,
        checkpoint_seconds,
        validation_seconds,
    )


# ---------------------------------------------------------------------------------------------------------------------
# What the run reads from the plan
# ---------------------------------------------------------------------------------------------------------------------


def trainer_arguments(args, plan: BudgetPlan, d_model: int, max_steps: int | None = None):
    """A copy of the user's `args` with the plan's length (or the upper bound `max_steps` of a run whose length the
    budget may re-fit: the plan's length is then kept by the budget callback), schedule, precision, accumulation and
    §5.3 learning rate (lr_scale * d_model^-0.5, which the schedule multiplies), precision and compilation: what the
    Trainer runs. `args` is left as given."""
    planned = copy.copy(args)
    planned.max_steps = max(plan.max_steps, max_steps or 0)
    planned.warmup_steps = plan.warmup_steps
    planned.save_steps = plan.save_steps
    if plan.eval_steps:
        planned.eval_steps = plan.eval_steps
    planned.bf16, planned.fp16 = plan.precision == "bf16", plan.precision == "fp16"
    planned.mixed_precision = plan.precision if plan.precision in ("bf16", "fp16") else "no"
    planned.tf32 = plan.precision == "tf32"  # as measured (TransformerTrainer.train applies it on CUDA)
    planned.torch_compile = plan.torch_compile
    if plan.torch_compile and planned.torch_compile_backend is None:
        planned.torch_compile_backend = "inductor"
    planned.gradient_accumulation_steps = plan.gradient_accumulation_steps
    planned.learning_rate = plan.lr_scale * d_model**-0.5
    return planned


def complete_recorded_plan(plan: BudgetPlan, recipe, args, d_model: int) -> BudgetPlan:
    """A plan recorded before it held the batch size, accumulation and lr_scale, with them computed as the run then
    did (a new plan: the one given is left as it is)."""
    max_tokens = plan.max_tokens or recipe.max_tokens
    accumulation = plan.gradient_accumulation_steps or accumulation_for(recipe, args, max_tokens)
    lr_scale = plan.lr_scale
    if lr_scale is None:
        tokens = max_tokens * accumulation * max(1, args.world_size)
        lr_scale = lr_scale_for(recipe, args, plan.warmup_steps, tokens, d_model)
    return replace(plan, max_tokens=max_tokens, gradient_accumulation_steps=accumulation, lr_scale=lr_scale)
