"""Re-planning a budgeted run from its own updates.

The plan predicts the Trainer's update (the calibration's and the Trainer's own work, both measured); the Trainer's
real updates can still run faster or slower (another process busy during calibration, a machine that turns slower,
the batches met). The §5.3 schedule does not depend on the run's total number of updates, so the run re-fits its
length from what it measures while training:

1. after `first_check` updates (before the first checkpoint), from the Trainer's own seconds per update;
2. after every validation, with that validation's and the checkpoints' measured seconds, and the test decoding
   predicted anew from the validation's decoding speed.

Where the first check finds the Trainer clearly faster than planned (by `SWITCH_BELOW`), the plan's choice of model
and batch size was made on times the Trainer does not take: the same correction applied to every choice calibrated,
an earlier (larger) one may reach the recipe's `min_updates` after all. The run then stops before its first
checkpoint and starts again with that choice (`better_candidate`: a `Switch`), its time known, not measured again: a
minute of updates is the price of the model the machine can afford.

The warmup is kept; the checkpoint spacing and validation cadence follow the new length (the same number of each
per run), and so does the averaging window (a fraction of the final length). The plan's `replans` records each
change. A run given `--max_steps N` is never re-planned; a resumed run keeps the length its checkpoint recorded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .calibration import Candidate, Measurement, Timing
from .costs import BudgetRules
from .plan import BudgetPlan
from .schedule import event_spacing


REFIT_ROUNDS = 3  # the fixed costs left depend on the length: a few rounds settle it
CHANGE_AT_LEAST = 0.01  # a re-plan after a validation moves the length only if it moves it by this fraction
SWITCH_BELOW = 0.9  # measured / planned seconds per update below which a larger choice is reconsidered


def new_shapes_seconds(rules: BudgetRules, per_shape: float, since: int, until: int) -> float:
    """What the new batch shapes met from update `since` to update `until` of a planned run add to their steady time,
    at `per_shape` seconds each (the shapes met among its batches: `rules.room`)."""
    room = rules.room
    if not per_shape or room.shapes_met is None or until <= since:
        return 0.0
    return per_shape * (room.shapes_met(until * room.accumulation) - room.shapes_met(since * room.accumulation))


def refit(
    plan: BudgetPlan,
    rules: BudgetRules,
    step: int,
    seconds_per_update: float,
    usable_seconds: float,
    checkpoint_seconds: float,
    validation_seconds: float,
) -> BudgetPlan:
    """The plan with the length that fits `usable_seconds` of training after update `step` at `seconds_per_update`
    (a steady update's), once the checkpoints, the validations and the new batch shapes still to come are paid
    for, capped at `rules.room.max_updates`; its spacing follows, its warmup is kept."""
    if seconds_per_update <= 0:
        raise ValueError(f"seconds_per_update={seconds_per_update} is invalid; expected a positive measured time.")
    length = step + math.floor(usable_seconds / seconds_per_update)
    for _ in range(REFIT_ROUNDS):
        still = 1 - step / max(length, step + 1)  # the fraction of the run, and of its events, still to come
        fixed = still * (rules.checkpoints * checkpoint_seconds + rules.validations * validation_seconds)
        fixed += new_shapes_seconds(rules, plan.update.seconds_per_new_shape, step, length)
        length = step + max(1, math.floor((usable_seconds - fixed) / seconds_per_update))
    if rules.room.max_updates is not None:
        length = min(length, max(rules.room.max_updates, step + 1))
    save, evaluate = event_spacing(length, rules.events)
    return plan.but(max_steps=length, save_steps=save, eval_steps=evaluate)


@dataclass(frozen=True)
class Switch:
    """The choice a run starts again with: its model size and batch size (`preset` None: the recipe's), batches per
    update, the Trainer's seconds per update there (the calibrated ones times what the first updates measured) and
    the updates they reach; the first run's (precision, attention, compiled) update (`update`, kept), and what it
    left (`switched_from`: recorded in the new plan)."""

    preset: str | None
    max_tokens: int
    accumulation: int
    seconds_per_update: float
    max_steps: int
    update: Candidate = ("fp32", None, False)
    switched_from: dict = field(default_factory=dict)

    def describe(self) -> str:
        left = self.switched_from
        return (
            f"{left.get('steady_seconds_per_update', float('nan')):.3f} s per update measured where the plan said "
            f"{left.get('planned_seconds_per_update', float('nan')):.3f}: the {self.preset} model with batches of "
            f"{self.max_tokens:,} tokens reaches {self.max_steps:,} updates here; starting again with it"
        )

    def known(self) -> Measurement:
        """The new run's measurement: its update time, known from the first run's Trainer."""
        precision, attention, _ = self.update
        return Measurement(
            *self.update,
            per_size={self.max_tokens: Timing(self.seconds_per_update / self.accumulation)},
            reasons=[f"{precision}, {attention} attention, as calibrated"],
        )


def better_candidate(
    candidates: list[dict],
    current: tuple[str | None, int],
    rules: BudgetRules,
    ratio: float,
    usable_seconds: float,
    checkpoint_seconds: float,
    validation_seconds: float,
) -> Switch | None:
    """The choice among a plan's `candidates` (the recipe's order of preference) the run should switch to from its
    `current` (preset, batch size), or None: with every planned time multiplied by `ratio` (the Trainer's measured
    seconds per update over the plan's), the first choice before the current one whose updates in `usable_seconds`
    (the budget's time left to a run started again, less a whole run's checkpoints and validations) reach
    the updates its size must reach (`rules.least_updates`) and its epoch cap allows. Only when `ratio` is below
    `SWITCH_BELOW`."""
    if ratio >= SWITCH_BELOW or not rules.min_updates or not candidates:
        return None
    usable = usable_seconds - rules.checkpoints * checkpoint_seconds - rules.validations * validation_seconds
    for candidate in candidates:
        if (candidate["preset"], candidate["max_tokens"]) == current or (
            current[0] is None and candidate["max_tokens"] == current[1]
        ):
            return None  # nothing earlier in the order fits: keep the current choice
        seconds = candidate["seconds_per_update"] * ratio
        updates = min(math.floor(usable / seconds), _epoch_cap(rules, candidate))
        if updates >= rules.least_updates(candidate["preset"]):
            return Switch(candidate["preset"], candidate["max_tokens"], candidate["accumulation"], seconds, updates)
    return None


def _epoch_cap(rules: BudgetRules, candidate: dict) -> float:
    return math.floor(rules.max_epochs * candidate["updates_per_epoch"]) if rules.max_epochs else math.inf
