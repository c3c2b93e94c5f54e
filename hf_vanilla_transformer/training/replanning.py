"""Re-planning a budgeted run from its own updates.

Calibration measures an update before training, on a copy of the model; the Trainer's real updates can run faster
or slower than that (first-shape effects, another process busy during calibration, a machine that turns slower).
The §5.3 schedule does not depend on the run's total number of updates, so the run re-fits its length from what it
measures while training:

1. after `first_check` updates (before the first checkpoint), from the Trainer's own seconds per update;
2. after every validation, with that validation's and the checkpoints' measured seconds, and the test decoding
   predicted anew from the validation's decoding speed.

Where the first check finds the Trainer clearly faster than calibrated (by `SWITCH_BELOW`), the calibration's
choice of model and batch size was made on times the Trainer does not take: the same correction applied to every
choice calibrated, an earlier (larger) one may reach the recipe's `min_updates` after all. The run then stops
before its first checkpoint and starts again with that choice (`better_candidate`), its time known, not measured
again: a minute of updates is the price of the model the machine can afford.

The warmup is kept; the checkpoint spacing and validation cadence follow the new length (the same number of each
per run), and so does the averaging window (a fraction of the final length). The plan's `replans` records each
change. A run given `--max_steps N` is never re-planned; a resumed run keeps the length its checkpoint recorded.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .costs import SAFETY, decode_cost, validation_loss_seconds
from .planning import BudgetPlan
from .schedule import schedule_for


REFIT_ROUNDS = 3  # the fixed costs left depend on the length: a few rounds settle it
CHANGE_AT_LEAST = 0.01  # a re-plan after a validation moves the length only if it moves it by this fraction
SWITCH_BELOW = 0.9  # measured / calibrated seconds per update below which a larger choice is reconsidered
RESTART_SECONDS = 20.0  # what starting again costs (the data is cached): a model, a Trainer, the first updates
WARM_UPDATES = 5  # the first updates after the start (or a resume) are not measured: first shapes, first touches


@dataclass
class RefitRules:
    """What re-fitting a run's length reads beside its plan: the recipe's per-run counts and fixed spacings, the
    epoch cap, the held-out work to predict, and when to check first."""

    checkpoints_per_run: int | None
    evaluations_per_run: int | None
    save_steps: float
    eval_steps: float | None
    validates: bool
    max_updates: int | None  # the max_epochs cap, in updates, or the Trainer's upper bound
    first_check: int
    validation_pairs: int = 0
    test_sentences: int = 0  # decoded after training: the test pairs, and the validation pairs once per alpha
    test_beams: int = 4
    validation_beams: int = 1
    min_updates: int | None = None  # what a choice of model and batch size must reach (the recipe's)
    max_epochs: float | None = None  # the recipe's cap, for the other choices' epochs
    source_check: bool = False  # each validation also measures the source's worth (collapse.py)
    accumulation: int = 1  # batches per update
    # The expected distinct batch shapes among that many batches of the run (each costs its first update more:
    # `seconds_per_new_shape` of the plan); None: not counted.
    shapes_met: Callable[[int], float] | None = None

    def first_costs(self, plan: BudgetPlan, since: int, until: int) -> float:
        """What the new batch shapes met from update `since` to update `until` add to their steady time."""
        per_shape = plan.seconds_per_new_shape or 0.0
        if not per_shape or self.shapes_met is None or until <= since:
            return 0.0
        return per_shape * (self.shapes_met(until * self.accumulation) - self.shapes_met(since * self.accumulation))


def refit(
    plan: BudgetPlan,
    rules: RefitRules,
    step: int,
    seconds_per_update: float,
    seconds_left: float,
    checkpoint_seconds: float,
    validation_seconds: float,
) -> BudgetPlan:
    """The plan with the length that fits `seconds_left` of training after update `step` at `seconds_per_update` (a
    steady update's), once the checkpoints, the validations and the new batch shapes still to come are paid for
    (`SAFETY` kept back), capped at `rules.max_updates`; its spacing follows, its warmup is kept."""
    if seconds_per_update <= 0:
        raise ValueError(f"seconds_per_update={seconds_per_update} is invalid; expected a positive measured time.")
    usable = max(0.0, seconds_left) * SAFETY
    length = step + math.floor(usable / seconds_per_update)
    checkpoints = rules.checkpoints_per_run or 0
    validations = (rules.evaluations_per_run or 0) if rules.validates else 0
    for _ in range(REFIT_ROUNDS):
        still = 1 - step / max(length, step + 1)  # the fraction of the run, and of its events, still to come
        fixed = still * (checkpoints * checkpoint_seconds + validations * validation_seconds)
        fixed += rules.first_costs(plan, step, length)
        length = step + max(1, math.floor((usable - fixed) / seconds_per_update))
    if rules.max_updates is not None:
        length = min(length, max(rules.max_updates, step + 1))
    _, save, evaluate = schedule_for(
        length,
        plan.warmup_steps,
        rules.checkpoints_per_run,
        rules.evaluations_per_run,
        rules.save_steps,
        rules.eval_steps,
    )
    return dataclasses.replace(plan, max_steps=length, save_steps=save, eval_steps=evaluate)


def better_candidate(
    plan: BudgetPlan,
    rules: RefitRules,
    ratio: float,
    seconds_left: float,
    checkpoint_seconds: float,
    validation_seconds: float,
) -> dict | None:
    """The calibrated choice the run should switch to, or None: with every calibrated time multiplied by `ratio`
    (the Trainer's measured seconds per update over the calibration's), the first choice of the recipe's order of
    preference, before the current one, whose updates in `seconds_left` (less `RESTART_SECONDS`, a whole run's
    checkpoints and validations) reach `rules.min_updates` and its epoch cap allows. Only when `ratio` is below
    `SWITCH_BELOW`."""
    if ratio >= SWITCH_BELOW or not rules.min_updates or not plan.candidates:
        return None
    current = (plan.preset, plan.max_tokens)
    usable = (seconds_left - RESTART_SECONDS) * SAFETY
    usable -= (rules.checkpoints_per_run or 0) * checkpoint_seconds
    usable -= ((rules.evaluations_per_run or 0) if rules.validates else 0) * validation_seconds
    for candidate in plan.candidates:
        if (candidate["preset"], candidate["max_tokens"]) == current or (
            current[0] is None and candidate["max_tokens"] == current[1]
        ):
            return None  # nothing earlier in the order fits: keep the current choice
        seconds = candidate["seconds_per_update"] * ratio
        updates = min(math.floor(usable / seconds), _epoch_cap(rules, candidate))
        if updates >= rules.min_updates:
            return {**candidate, "seconds_per_update": seconds, "max_steps": updates}
    return None


def _epoch_cap(rules: RefitRules, candidate: dict) -> float:
    return math.floor(rules.max_epochs * candidate["updates_per_epoch"]) if rules.max_epochs else math.inf


def predicted_decode_seconds(
    rules: RefitRules,
    validation_seconds: float,
    seconds_per_update: float,
    source_check_seconds: float | None = None,
    prediction_seconds: float | None = None,
) -> float:
    """The test decoding (and the choice of alpha) predicted from a validation pass on this machine: its decoding of
    `validation_pairs` pairs with `validation_beams` beams, scaled to `test_sentences` decoded with `test_beams` beams
    by their relative cost per sentence (`costs.decode_cost`). The decoding is the Trainer's prediction steps less
    their loss (`prediction_seconds`, where measured; a loss pass costs about one of the source check's two), else
    the whole pass less its loss passes."""
    if prediction_seconds is not None and source_check_seconds is not None:
        decoding = prediction_seconds - 0.5 * source_check_seconds
    elif source_check_seconds is not None:
        decoding = validation_seconds - 1.5 * source_check_seconds
    else:
        decoding = validation_seconds - validation_loss_seconds(
            rules.validation_pairs, seconds_per_update, rules.source_check
        )
    per_sentence = max(0.0, decoding) / max(1, rules.validation_pairs)
    return rules.test_sentences * per_sentence * decode_cost(rules.test_beams) / decode_cost(rules.validation_beams)


@dataclass
class UpdateMeter:
    """The Trainer's own seconds per update, apart from validation and checkpoint pauses, and each pause's seconds.

    `step()` at every update's end, `pause(kind)` at the end of a validation or a checkpoint (both run between one
    update's end and the next update). The first `WARM_UPDATES` after `start()` are not counted."""

    clock: object = time.monotonic
    first: int = 0
    mark: float = 0.0
    seconds: float = 0.0
    updates: int = 0
    pauses: dict = field(default_factory=lambda: {"validation": [], "checkpoint": []})

    @property
    def counted_from(self) -> int:
        """The update after which the meter counts (the warm ones apart)."""
        return self.first + WARM_UPDATES

    def start(self, step: int) -> None:
        self.first, self.mark, self.seconds, self.updates = step, self.clock(), 0.0, 0

    def step(self, step: int) -> None:
        now = self.clock()
        if step > self.first + WARM_UPDATES:
            self.seconds += now - self.mark
            self.updates += 1
        self.mark = now

    def pause(self, kind: str) -> float:
        now = self.clock()
        self.pauses[kind].append(now - self.mark)
        self.mark = now
        return self.pauses[kind][-1]

    @property
    def seconds_per_update(self) -> float | None:
        return self.seconds / self.updates if self.updates else None

    def typical_pause(self, kind: str, estimate: float) -> float:
        """The mean measured seconds of a `kind` pause, or `estimate` before the first one."""
        measured = self.pauses[kind]
        return sum(measured) / len(measured) if measured else estimate
