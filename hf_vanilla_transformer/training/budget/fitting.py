"""What a measured update fits into the budget, as functions of the plan's inputs (`PlanInputs`, read once from the
settled run and its prepared data): an update's time from a batch's, what a run of so many updates pays for its new
batch shapes, the updates that fit the time left once the checkpoints, validations and the test decoding are paid
for (`updates_for_budget`), the largest batch size that reaches `min_updates` (`fit`), the order the measuring
step ranks the calibration's times by (`rank`), the updates in an epoch (`updates_per_epoch`) and the most a
budgeted run may be re-planned to (`replan_bound`), which the Trainer runs to (`applying.apply_plan`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from .calibration import Timing
from .clock import BudgetClock
from .costs import BudgetFit, BudgetRules, FitSeconds, ReplanRoom, updates_that_fit


@dataclass(frozen=True)
class PlanInputs:
    """What every step of a plan reads: the settled run (`training/settings.py`: its batch sizes (`token_sizes`) and
    their updates, choices, device, rate), its prepared data (`training/run_data.py`: the batch samplers, the
    tokenized split, the held-out splits), the budget's clock, what the run counts with (`rules`; on a GPU with the
    batch a decoding step is measured on), the model sizes it chooses among, what the batches' lengths are padded to
    a multiple of, `build(preset)` for the models of the other sizes (None: the first size only) and the run's
    Trainer class for its trial (None: no trial)."""

    settings: object
    data: object
    clock: BudgetClock
    rules: BudgetRules
    presets: tuple[str, ...] = ()
    multiple: int = 1
    build: Callable[[str], object] | None = None
    trainer_class: type | None = None


def updates_per_epoch(batches: int, accumulation: int, world_size: int) -> int:
    """Updates in an epoch of `batches` batches, `accumulation` batches per update in each of `world_size`
    processes."""
    return max(1, math.ceil(batches / (accumulation * max(1, world_size))))


def replan_bound(max_steps: int, epoch_updates: int, max_epochs: float | None) -> int:
    """The most updates a budgeted run may be re-planned to: its epoch cap, else ten times its plan."""
    bound = math.floor(max_epochs * epoch_updates) if max_epochs is not None else 10 * max_steps
    return max(bound, max_steps)


def epoch_updates(inputs: PlanInputs, max_tokens: int) -> int:
    update = inputs.settings.updates[max_tokens]
    return updates_per_epoch(len(inputs.data.batches.of(max_tokens)), update.accumulation, update.world_size)


def first_costs(inputs: PlanInputs, timing: Timing, max_tokens: int, updates: int) -> float:
    """Seconds that `updates` updates of batches of `max_tokens` add to their steady time: the first update of every
    batch shape they meet, and what is paid once."""
    if updates <= 0:
        return 0.0
    batches = updates * inputs.settings.updates[max_tokens].accumulation
    return timing.once + timing.per_shape * inputs.data.batches.of(max_tokens).shapes_met(batches, inputs.multiple)


def per_update(inputs: PlanInputs, timing: Timing, max_tokens: int, updates: int) -> float:
    """Seconds per update of a run of `updates` updates, its new shapes paid."""
    return timing.steady + first_costs(inputs, timing, max_tokens, updates) / max(1, updates)


def update_timing(inputs: PlanInputs, batch: Timing, max_tokens: int, ratio: float = 1.0) -> Timing:
    """The timing of an update of batches of `max_tokens` from a batch's: its accumulation, and `ratio`, the real
    Trainer's seconds over the calibration's (`trainer_ratio`). On a CPU a ratio measured holds the cost of the shapes
    too (each update pays it: `trainer_speed.py`), so they are not paid apart."""
    shapes = batch.per_shape if ratio == 1.0 or inputs.settings.device.type != "cpu" else 0.0
    return Timing(batch.steady * inputs.settings.updates[max_tokens].accumulation * ratio, shapes, batch.once)


def rank(inputs: PlanInputs, timing: Timing, max_tokens: int, updates: int | None = None) -> float:
    """The order the measuring step ranks the calibration's times by (`measuring.measure_update`): their seconds per
    update over a run of `updates` updates (default: those the budget would give them, capped by the epochs), the
    first update of each new batch shape and what is paid once included."""
    update = update_timing(inputs, timing, max_tokens)
    if updates is None:
        updates = max(1, math.floor(inputs.clock.seconds_left(planned=True) / update.steady))
        max_epochs = inputs.settings.recipe.max_epochs
        if max_epochs is not None:
            updates = max(1, min(updates, math.floor(max_epochs * epoch_updates(inputs, max_tokens))))
    return per_update(inputs, update, max_tokens, updates)


def updates_for_budget(
    inputs: PlanInputs, max_tokens: int, timing: Timing, checkpoint_seconds: float, rules: BudgetRules
) -> BudgetFit:
    """The updates that fit the budget at `timing` (an update's, measured) once set-up so far, the checkpoints, the
    validations, the test decoding and the first update of each new batch shape are paid for, as `rules` count
    them."""
    update, clock = timing.steady, inputs.clock
    tokens = max_tokens * inputs.settings.updates[max_tokens].accumulation
    decode, validation = rules.test_decode_seconds(update, tokens), rules.validation_seconds(update, tokens)
    left = clock.seconds_left(decode, planned=True)
    fit = updates_that_fit(
        left, update, rules.checkpoints, checkpoint_seconds, rules.validations, validation,
        lambda updates: first_costs(inputs, timing, max_tokens, updates),
    )  # fmt: skip
    choosing_alpha = bool(inputs.settings.alphas) and inputs.data.evaluation is not None
    reason = (
        f"{fit:,} updates fit {left / 60:.1f} training minutes of the {inputs.settings.max_minutes:g}-minute budget "
        f"({update:.2f} s each; set-up so far {clock.spent() / 60:.1f} min, test decoding "
        f"{decode / 60:.1f} min predicted{', with the choice of alpha' if choosing_alpha else ''})"
    )
    per_epoch, max_epochs = epoch_updates(inputs, max_tokens), rules.max_epochs
    if max_epochs is not None and fit > max_epochs * per_epoch:
        fit = max(1, math.floor(max_epochs * per_epoch))
        reason += f"; capped at {fit:,} = {max_epochs:g} epochs of this corpus"
    training = fit * update + first_costs(inputs, timing, max_tokens, fit) + rules.checkpoints * checkpoint_seconds
    training += rules.validations * validation
    enough = rules.min_updates is None or fit >= rules.min_updates
    seconds = FitSeconds(training, decode, checkpoint_seconds, validation)
    return BudgetFit(max_tokens, fit, timing, seconds, reason, enough)


def fit(
    inputs: PlanInputs, per_size: dict[int, Timing], ratio: float, checkpoint_seconds: float, rules: BudgetRules
) -> BudgetFit:
    """The largest batch size that still gives `min_updates` updates in the budget (enough), else the smallest, from
    the measured seconds of a batch at each size (times `ratio`, the Trainer's over the calibration's) and of a
    checkpoint."""
    sizes = inputs.settings.token_sizes
    for max_tokens in sizes:
        timing = update_timing(inputs, per_size[max_tokens], max_tokens, ratio)
        chosen = updates_for_budget(inputs, max_tokens, timing, checkpoint_seconds, rules)
        if chosen.enough:
            break
    if len(sizes) > 1:
        listed, least = ", ".join(map(str, sizes)), rules.min_updates or 0
        said = f"the largest that gives {least:,} updates" if chosen.enough else f"none gives {least:,} updates here"
        reason = f"{chosen.reason}; batches of {chosen.max_tokens:,} tokens per side (of {listed}: {said})"
        return replace(chosen, reason=reason)
    return chosen


def may_reach(inputs: PlanInputs, per_size: dict[int, Timing], ratio: float, rules: BudgetRules | None = None) -> bool:
    """Whether a size could reach its `min_updates` (`rules`', default the run's) at its smallest batch with no
    checkpoint and no decoding step paid: a bound that spares measuring the other batches of a size too slow for the
    budget."""
    smallest, rules = inputs.settings.token_sizes[-1], rules or inputs.rules
    timing = update_timing(inputs, per_size[smallest], smallest, ratio)
    unmeasured = replace(rules, steps=replace(rules.steps, step_seconds=0.0, greedy_step_seconds=0.0))
    return updates_for_budget(inputs, smallest, timing, 0.0, unmeasured).enough


def replan_rules(inputs: PlanInputs, plan) -> BudgetRules:
    """What the re-plans of `plan` (its updates of its batches, a checkpoint every so many) count with: the rules,
    with its room to re-plan into, its first check (halfway to the first checkpoint, at most after 200 updates), its
    batch shapes and the decoding step it measured (a GPU's)."""
    samplers, multiple = inputs.data.batches, inputs.multiple
    size, max_steps, save_steps = plan.choice.max_tokens, plan.schedule.max_steps, plan.schedule.save_steps
    room = ReplanRoom(
        max_updates=replan_bound(max_steps, epoch_updates(inputs, size), inputs.rules.max_epochs),
        first_check=min(200, max(1, save_steps // 2)),
        accumulation=inputs.settings.updates[size].accumulation,
        shapes_met=lambda count: samplers.of(size).shapes_met(count, multiple),
    )
    costs = plan.costs  # the chosen size's decoding step, measured on a GPU
    steps = replace(
        inputs.rules.steps, step_seconds=costs.decode_step_seconds, greedy_step_seconds=costs.greedy_step_seconds
    )
    return replace(inputs.rules, room=room, steps=steps)
