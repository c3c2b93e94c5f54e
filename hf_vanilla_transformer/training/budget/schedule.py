"""The §5.3 schedule of a run of a given length, in numbers, one function per decision: the warmup (`warmup_for`),
the learning rate and the batch it was named for (`learning_rate`), the spacing of checkpoints and validations
(`event_spacing`; when each comes is the budget's callback's: `deadline.events_due`).

The rate in one place: the peak is decided here (`learning_rate`), reaches the Trainer as its `learning_rate`
(`applying.rate`), and the Trainer's scheduler is the shape of each update here (`noam_schedule`: eq. 3 normalised
to 1 at the end of warmup, with the optional cooldown), so no factor the peak holds is applied twice."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
from torch.optim.lr_scheduler import LambdaLR


@dataclass(frozen=True)
class RateRule:
    """How a recipe names its §5.3 rate: the factor `lr_scale`, or a `peak` reached by a model of width
    `owner_d_model` (None: the trained model's own) with the `warmup` given, at updates of `reference_tokens` source
    tokens (None: any); a short run's warmup is cut to at most `max_warmup_fraction` of it, climbing the same ramp
    to a lower peak, or to the same peak (`cut_keeps_peak`)."""

    lr_scale: float = 1.0
    peak: float | None = None
    owner_d_model: int | None = None
    reference_tokens: int | None = None
    warmup: float = 4000
    max_warmup_fraction: float | None = None
    cut_keeps_peak: bool = False


@dataclass(frozen=True)
class LearningRate:
    """The rate of a run: lr = lr_scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5) (§5.3, eq. 3); `peak`
    is its value at the end of warmup."""

    lr_scale: float
    peak: float


def base_rate(lr_scale: float, d_model: int) -> float:
    """Eq. 3's factor, lr_scale * d_model^-0.5 (the Trainer's rate is the peak it gives: `applying.rate`)."""
    return lr_scale * d_model**-0.5


def learning_rate(rule: RateRule, d_model: int, warmup: int, tokens_per_update: int) -> LearningRate:
    """The rate of a model of width `d_model` warmed up for `warmup` updates of `tokens_per_update` source tokens.

    1. The rule's factor: `lr_scale`, or the one that gives its `peak` to the model it names it for. The factor is
       the same for every size, so each peaks at lr_scale * d_model^-0.5 * warmup^-0.5: the rate follows the model
       (the CPU recipe's 1.98e-3 for small is 1.40e-3 for base and 0.99e-3 for big, at the update size it is named
       for), as §5.3 has it.
    2. Where the rule names the update size its rate holds at (`reference_tokens`), the square root of the update's
       tokens over it.
    3. Where a short run cut the warmup (`max_warmup_fraction`), the rate climbs the same ramp and peaks lower: a
       post-LN model needs the ramp (warmup 308 to the CPU recipe's peak of 1.98e-3 stalled at loss 4.7,
       docs/cpu_recipe.md); or, with `cut_keeps_peak`, it climbs a steeper ramp to the same peak (the GPU recipe:
       the paper's peaks are half the CPU recipe's or less, and on the H100 `small` on the lower peak's ramp,
       2.7e-4 after 1,085 updates, had learned nothing of its source by update 948: docs/gpu.md)."""
    nominal = rule.warmup if rule.warmup >= 1 else warmup
    scale = rule.lr_scale
    if rule.peak is not None:
        scale = rule.peak * ((rule.owner_d_model or d_model) * nominal) ** 0.5
    if rule.reference_tokens:
        scale *= (tokens_per_update / rule.reference_tokens) ** 0.5
    if warmup < nominal:
        scale *= (warmup / nominal) ** (0.5 if rule.cut_keeps_peak else 1.5)
    return LearningRate(scale, peak_rate(scale, d_model, warmup))


def peak_rate(lr_scale: float, d_model: int, warmup: int) -> float:
    """The §5.3 schedule's peak, at the end of warmup: lr_scale * d_model^-0.5 * warmup^-0.5."""
    return base_rate(lr_scale, d_model) * max(1, warmup) ** -0.5


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


def reached_step(steps, epochs: float):
    """The value of the last of `steps` ((epochs, value) pairs, fewest epochs first: a recipe's rule by epochs) that
    `epochs` reaches; None below the first."""
    reached = [value for least, value in steps if epochs >= least]
    return reached[-1] if reached else None


def dropout_for(steps: list[tuple[float, float]], epochs: float) -> float | None:
    """The dropout of a run predicted to train `epochs` epochs of its corpus: that of the last of `steps` (the recipe's
    `dropout_by_epochs`, (epochs, dropout) pairs, fewest epochs first) it reaches; None below the first (the model's
    own). A short run has nothing to over-fit, and dropout costs it updates; a long one passes over the same pairs
    again and again (docs/cpu_recipe.md, "The recipe at other budgets")."""
    return reached_step(steps, epochs)


@dataclass(frozen=True)
class EventRule:
    """How a run spaces its checkpoints and validations: so many per run (a fraction of its length), else every
    `save_steps` and `eval_steps` updates."""

    checkpoints_per_run: int | None = None
    evaluations_per_run: int | None = None
    save_steps: float = 1000
    eval_steps: float | None = None


def spacing_for(max_steps: int, per_run: int) -> int:
    """Updates between two of `per_run` evenly spaced events (checkpoints, validations) over `max_steps`."""
    if per_run < 1:
        raise ValueError(f"{per_run} events per run is invalid; expected at least 1.")
    return max(1, math.ceil(max_steps / per_run))


def event_spacing(max_steps: int, rule: EventRule) -> tuple[int, int | None]:
    """(checkpoint spacing, validation spacing) of a run of `max_steps` updates: fractions of the run where the rule
    gives them per run (validations then at checkpoints where they come less often), else its fixed spacings."""
    per_run = rule.checkpoints_per_run
    save = spacing_for(max_steps, per_run) if per_run else max(1, int(rule.save_steps))
    if rule.evaluations_per_run:
        evaluate = spacing_for(max_steps, rule.evaluations_per_run)
        if per_run and rule.evaluations_per_run <= per_run:
            evaluate = save * max(1, round(evaluate / save))  # validate where a checkpoint is saved
    else:
        evaluate = int(rule.eval_steps) if rule.eval_steps else None
    return save, evaluate


def check_cooldown_fraction(fraction: float) -> None:
    """The schedule's cooldown is a fraction of the run in [0, 1) (`noam_schedule`); else a ValueError."""
    if not 0 <= fraction < 1:
        raise ValueError(f"cooldown_fraction={fraction} is invalid; expected a fraction of the run in [0, 1).")


def noam_shape(step: int, warmup_steps: int) -> float:
    """The §5.3 schedule's shape for the optimizer's `step`-th update (1-based), 1 at the end of warmup:
    min((warmup / step)^0.5, step / warmup). Eq. 3 is the peak d_model^-0.5 * warmup^-0.5 times it; the Trainer's
    `learning_rate` is that peak (the plan's, `applying.rate`), so the schedule applies no factor of its own."""
    step = max(step, 1)
    return min((warmup_steps / step) ** 0.5, step / warmup_steps)


class NoamSchedule(LambdaLR):
    """The §5.3 schedule: at scheduler step s (0 before the first update) the rate is the optimizer's initial rate
    (the peak) times the shape of update s + 1. A checkpoint's state gives it its step, never its rate: a run resumed
    from a checkpoint written when the Trainer's rate was eq. 3's factor d_model^-0.5 rather than the peak keeps
    the rate its plan holds."""

    def load_state_dict(self, state_dict: dict) -> None:
        base_lrs = list(self.base_lrs)
        super().load_state_dict(state_dict)
        self.base_lrs = base_lrs


def noam_schedule(
    optimizer: torch.optim.Optimizer,
    warmup_steps: int,
    cooldown_fraction: float = 0.0,
    last_update: Callable[[], int] | None = None,
) -> NoamSchedule:
    """The §5.3 schedule (`NoamSchedule`) over `optimizer`, whose rate is the peak, reached after `warmup_steps`;
    with `cooldown_fraction`, the rate decays linearly to 0 over that last fraction of the updates to
    `last_update()` (read at every step: the budget's plan moves the run's end when it re-plans; the Trainer sets
    an update's rate when it steps the one before, so a re-plan after update k reaches the rate from update k + 2;
    one that moves the end later during the cooldown lifts the rate to the new, later line)."""
    if warmup_steps < 1:
        raise ValueError(f"warmup_steps={warmup_steps} is invalid; the §5.3 schedule needs at least 1.")
    check_cooldown_fraction(cooldown_fraction)
    if cooldown_fraction and last_update is None:
        raise ValueError("cooldown_fraction needs the run's last update (last_update); none was given.")
    shape = partial(_noam_lambda, warmup_steps=int(warmup_steps), cooldown_fraction=cooldown_fraction, end=last_update)
    return NoamSchedule(optimizer, shape)


def cooldown_shape(step: int, last: int, fraction: float) -> float:
    """1 until the last `fraction` of `last` updates, then falling linearly to 0 after update `last` (1-based
    `step`): the rate of update s is scaled by (last - s + 1) / (fraction * last) there."""
    span = fraction * last
    if not fraction or last <= 0 or span < 1:
        return 1.0
    return min(1.0, max(last - step + 1, 0) / span)


def _noam_lambda(step: int, warmup_steps: int, cooldown_fraction: float = 0.0, end=None) -> float:
    shape = noam_shape(step + 1, warmup_steps)
    if cooldown_fraction:
        shape *= cooldown_shape(step + 1, int(end()), cooldown_fraction)
    return shape
