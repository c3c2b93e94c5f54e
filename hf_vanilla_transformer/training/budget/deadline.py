"""The budget's callback: the one owner of a budgeted run's deadline, its re-plans and its checkpoint spacing.

After each update and each validation it decides, as typed values: a new plan (`Replan`: a new length, or the test
decoding predicted anew), a stop at the deadline (`Stop`), a start again with another choice (`replanning.Switch`).
It acts on the Trainer's state and control for the first two; the run (`training/run.py`) reads how training ended
from `TimeBudgetCallback.end()` (a `TrainingEnd`) and acts on a switch. Every process takes the main process's
decisions, at the same update. What it decides from, the Trainer's own seconds per update and its pauses, it
measures itself (`UpdateMeter`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field

from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

from ...utils.distributed import main_process_decides, main_process_value
from ...utils.faults import moment
from .clock import BudgetClock
from .costs import BudgetRules, decoding_steps_ratio
from .plan import BudgetPlan
from .record import write_plan
from .replanning import CHANGE_AT_LEAST, Switch, better_candidate, new_shapes_seconds, refit


logger = logging.getLogger(__name__)

NEVER = 2**62  # a spacing of events that never comes
WARM_UPDATES = 5  # the first updates after the start (or a resume) are not measured: first shapes, first touches


@dataclass(frozen=True)
class Replan:
    """The plan from now on: a re-fitted length (`change`, the entry recorded in its `replans`) or, with `change`
    None, only the test decoding predicted anew."""

    plan: BudgetPlan
    change: dict | None = None

    def describe(self) -> str:
        change, new = self.change or {}, self.plan
        validation = f", validation every {new.schedule.eval_steps:,}" if new.schedule.eval_steps else ""
        return (
            f"re-planned after {change.get('after')}: {change.get('seconds_per_update', float('nan')):.3f} s per update "
            f"measured ({new.update.seconds_per_update or float('nan'):.3f} s planned): {change.get('was', 0):,} -> "
            f"{new.schedule.max_steps:,} updates, a checkpoint every {new.schedule.save_steps:,}{validation}"
        )


@dataclass(frozen=True)
class Stop:
    """The deadline passed at update `at`: training stops there, saved."""

    at: int


@dataclass(frozen=True)
class TrainingEnd:
    """How training ended: the plan as it ended (re-plans included), the Trainer's own seconds per update (validation
    and checkpoint pauses, warm updates and new shapes apart), where the deadline stopped it, the choice to start
    again with (a switch: no checkpoint was kept), and whether the epoch cap bound before the budget."""

    plan: BudgetPlan
    measured_seconds_per_update: float | None = None
    stopped_early_at: int | None = None
    switch: Switch | None = None
    capped_by_epochs: bool = False


def near_the_end(step: int, end: int, spacing: int) -> bool:
    """Whether the run's last update `end`, which saves and validates by the Trainer's own rule, is less than half an
    event `spacing` away from `step`: a spaced checkpoint or validation there would come twice at the run's end."""
    return 0 < end - step < spacing / 2


def events_due(
    step: int, end: int, since_save: int, since_validation: int, save: int, evaluate: int | None, validates: bool
) -> tuple[bool, bool]:
    """(checkpoint, validation) after update `step` of a run ending at `end`, `since_save` and `since_validation`
    updates after the last of each: a checkpoint once the spacing `save` has passed since the last one; a validation
    with it once its own spacing `evaluate` has (nearly) passed, or on its own where validations come more often than
    checkpoints. Spaced from the last event, not at multiples of the spacing (a re-plan that changed the spacing
    would add events there); never near the end (`near_the_end`): a re-planned length once put a checkpoint and a
    validation one update before the last, and the average took the run's end twice."""
    if step >= end:
        return False, False
    saving = since_save >= save and not near_the_end(step, end, save)
    if not evaluate or not validates:
        return saving, False
    due = since_validation >= (evaluate - save / 2 if evaluate >= save else evaluate)
    alone = evaluate < save and not near_the_end(step, end, evaluate)
    return saving, due and (saving or alone)


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

    def latest_pause(self, kind: str, estimate: float) -> float:
        """The last measured seconds of a `kind` pause, or `estimate` before the first one: a validation's decoding
        shortens as the model learns to end its sentences (the first, of a model that ends none, is the longest)."""
        measured = self.pauses[kind]
        return measured[-1] if measured else estimate


class TimeBudgetCallback(TrainerCallback, ExportableState):
    """The budgeted run's length (see the module docstring): carries the plan into every checkpoint's trainer
    state, re-plans the length from the run's own updates (`replanning.py`: after `rules.room.first_check` updates and
    after every validation), spaces its checkpoints and validations from the last one (`events_due`), and
    stops the run at its deadline should the machine turn slower than it measured: the run then ends early, saved,
    rather than late. A callback without a `clock` (a given length, or a resumed run rebuilt from its checkpoint
    with the plan alone, whose budget was spent by the interrupted run) keeps its plan's length and spacing."""

    def __init__(self, plan: BudgetPlan | dict, clock: BudgetClock | None = None, rules: BudgetRules | None = None):
        self.plan = plan if isinstance(plan, BudgetPlan) else BudgetPlan.from_dict(plan)  # (dict: from a checkpoint)
        self.clock = clock if clock is not None and clock.seconds is not None else None
        self.rules = rules if self.clock is not None else None
        self.meter = UpdateMeter(clock=self.clock.now) if self.clock is not None else UpdateMeter()
        self.ending: Stop | Switch | None = None  # the decision that ended training early, if one did
        self.checked = False  # the first check done
        self.last = {"checkpoint": 0, "validation": 0}  # the updates of the last of each
        self.args = None  # the Trainer's (its device, where its processes decide together; its folder)

    @property
    def stopped_early_at(self) -> int | None:
        return self.ending.at if isinstance(self.ending, Stop) else None

    @property
    def switch(self) -> Switch | None:
        return self.ending if isinstance(self.ending, Switch) else None

    @property
    def device(self):
        return self.args.device if self.args is not None else None

    @property
    def record_to(self) -> str | None:
        """The folder of budget.json: the main process's output folder, else None."""
        return self.args.output_dir if self.args is not None and self.args.should_save else None

    def state(self) -> dict:
        """What a checkpoint carries of the callback (`ExportableState`): the plan that rebuilds it
        (`record.recorded_plan` reads it back)."""
        return {"args": {"plan": self.plan.to_dict()}, "attributes": {}}

    def end(self) -> TrainingEnd:
        rules = self.rules
        bound = rules is not None and rules.max_epochs is not None
        capped = bound and self.plan.schedule.max_steps >= rules.room.max_updates
        return TrainingEnd(self.plan, self.meter.seconds_per_update, self.stopped_early_at, self.switch, capped)

    # --- the Trainer's events ------------------------------------------------------------------------------------------

    def on_train_begin(self, args, state, control, **kwargs):
        self.args = args
        # The Trainer runs to an upper bound (`applying.apply_plan`); the plan's length is the one that counts.
        self._apply(state)
        self.meter.start(state.global_step)
        return control

    def on_step_end(self, args, state, control, **kwargs):
        moment("update")
        self.meter.step(state.global_step)
        if self.rules is not None:
            since = (state.global_step - self.last["checkpoint"], state.global_step - self.last["validation"])
            spacing, validates = (self.plan.schedule.save_steps, self.plan.schedule.eval_steps), self.rules.validates
            due = events_due(state.global_step, state.max_steps, *since, *spacing, validates)
            control.should_save, control.should_evaluate = (
                control.should_save or due[0],
                control.should_evaluate or due[1],
            )
        for decision in self.after_update(state):
            self._act(decision, state, control)
        return control

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        seconds = self.meter.pause("validation")
        self.last["validation"] = state.global_step
        finished = control.should_training_stop or state.global_step >= state.max_steps  # the run's last validation
        if self.rules is None or self.meter.seconds_per_update is None or finished:
            return control
        self._act(self.after_validation(state, seconds, metrics or {}), state, control)
        if near_the_end(state.global_step, state.max_steps, self.plan.schedule.save_steps):  # the last update saves
            control.should_save = False
        return control

    def on_save(self, args, state, control, **kwargs):
        self.meter.pause("checkpoint")
        self.last["checkpoint"] = state.global_step
        return control

    # --- the decisions -------------------------------------------------------------------------------------------------

    def after_update(self, state) -> list[Replan | Stop | Switch]:
        """What follows update `state.global_step`: at the first check a switch, else a re-plan; a stop once the
        deadline passed (the main process decides: every process stops at the same update)."""
        decisions = []
        rules = self.rules
        checking = rules is not None and not self.checked and state.global_step >= rules.room.first_check
        if checking and self.meter.updates:
            self.checked = True  # (a short run checks once it has measured an update)
            switch = self.better_choice(state)
            if switch is not None:
                return [switch]  # before any checkpoint of this choice: the run starts again with the switch
            if state.global_step < state.max_steps:  # (at the last update the length is what was trained)
                decisions.append(self.replan(state, "its first updates", always=True))
        if self.clock is not None and state.global_step < state.max_steps:
            late = self.clock.seconds_left(self.plan.costs.predicted_decode_seconds or 0.0) <= 0
            if main_process_decides(late, self.device):
                decisions.append(Stop(state.global_step))
        return [decision for decision in decisions if decision is not None]

    def after_validation(self, state, seconds: float, metrics: dict) -> Replan:
        """The test decoding predicted anew from this validation's decoding speed (which moves the deadline), and
        the length re-fitted to it; the prediction kept where the model has not begun to translate (its
        translations stop short of their references: `decoding_steps_ratio` 0)."""
        check, prediction = metrics.get("eval_source_check_seconds"), metrics.get("eval_prediction_seconds")
        steps, decode = decoding_steps_ratio(metrics), self.plan.costs.predicted_decode_seconds
        if steps != 0.0:
            decode = self.rules.predicted_decode_seconds(
                seconds, self.meter.seconds_per_update, check, prediction, steps
            )
        after = f"the validation at update {state.global_step:,}"
        return self.replan(state, after, decode) or Replan(self.plan.but(predicted_decode_seconds=decode))

    def better_choice(self, state) -> Switch | None:
        """A better choice of model and batch size where the first updates prove the planned one wrong enough
        (`replanning.better_candidate`); every process takes the main process's answer. A run that started again
        keeps its choice (its length is re-planned as any run's)."""
        rate, planned = self.steady_rate(state.global_step), self.plan.update.seconds_per_update
        if rate is None or not planned or self.plan.history.switched_from:  # a run starts again once at most
            return None
        usable = self.clock.seconds_left(self.plan.costs.predicted_decode_seconds or 0.0, restart=True, planned=True)
        checkpoint, validation = self.plan.costs.checkpoint_seconds or 0.0, self.plan.costs.validation_seconds or 0.0
        current = (self.plan.choice.preset, self.plan.choice.max_tokens)
        choice = better_candidate(
            self.plan.record.candidates, current, self.rules, rate / planned, usable, checkpoint, validation
        )
        choice = main_process_value(choice)
        if choice is None:
            return None
        left = {"preset": self.plan.choice.preset, "max_tokens": self.plan.choice.max_tokens, "at": state.global_step}
        left |= {"planned_seconds_per_update": planned, "measured_seconds_per_update": self.meter.seconds_per_update}
        left["steady_seconds_per_update"] = rate
        kept = (self.plan.choice.precision, self.plan.choice.attn_implementation, self.plan.choice.torch_compile)
        return dataclasses.replace(choice, update=kept, switched_from=left)

    def steady_rate(self, step: int) -> float | None:
        """The Trainer's seconds per update of shapes met before: the meter's, less what the new batch shapes met
        while it counted cost (on a GPU most of them come early: the first check would charge them to every update
        still to come)."""
        rate = self.meter.seconds_per_update
        if rate is None or self.rules is None:
            return rate
        paid = new_shapes_seconds(self.rules, self.plan.update.seconds_per_new_shape, self.meter.counted_from, step)
        return max(0.5 * rate, (self.meter.seconds - paid) / self.meter.updates)

    def replan(self, state, after: str, decode: float | None = None, always: bool = False) -> Replan | None:
        """The plan's length re-fitted from the measured speed (the test decoding predicted to take `decode` seconds
        where given; every process takes the main process's), or None where it moves by less than
        `CHANGE_AT_LEAST` (unless `always`)."""
        rate = self.steady_rate(state.global_step)
        if rate is None:
            return None
        step, meter, plan = state.global_step, self.meter, self.plan
        if decode is not None:
            plan = plan.but(predicted_decode_seconds=decode)
        checkpoint = meter.typical_pause("checkpoint", plan.costs.checkpoint_seconds or 0.0)
        validation = meter.latest_pause("validation", plan.costs.validation_seconds or 0.0)
        usable = self.clock.seconds_left(plan.costs.predicted_decode_seconds or 0.0, planned=True)
        new = main_process_value(refit(plan, self.rules, step, rate, usable, checkpoint, validation))
        was, now = plan.schedule.max_steps, new.schedule.max_steps
        if not always and abs(now - was) < CHANGE_AT_LEAST * was:
            return None
        change = {"at": step, "after": after, "seconds_per_update": rate, "max_steps": now, "was": was}
        return Replan(new.but(replans=[*plan.history.replans, change]), change)

    # --- acting on them ------------------------------------------------------------------------------------------------

    def _act(self, decision: Replan | Stop | Switch, state, control) -> None:
        """Follow `decision`: a switch stops training unsaved (the run starts again), a stop ends it saved, a new plan
        sets the Trainer's length (the main process's `budget.json` records a new length)."""
        if isinstance(decision, Switch):
            self.ending = decision
            logger.warning("%s", decision.describe())
            control.should_training_stop = True
            control.should_save = control.should_evaluate = False
        elif isinstance(decision, Stop):
            self.ending = decision
            logger.warning(
                "the time budget's deadline passed at update %d of %d (the machine is slower than it measured): "
                "stopping here and saving",
                decision.at,
                state.max_steps,
            )
            control.should_training_stop = control.should_save = True
        else:
            self.plan = decision.plan
            self._apply(state)
            if decision.change is not None:
                logger.warning("%s", decision.describe())
                if self.record_to is not None:
                    write_plan(self.record_to, decision.plan, at="replan")

    def _apply(self, state) -> None:
        """The plan's length, and its spacing where the callback does not space the events itself, on the Trainer's
        state."""
        state.max_steps = self.plan.schedule.max_steps
        if self.rules is not None:  # spaced by `events_due`: the Trainer's multiples never come
            state.save_steps, state.eval_steps = 0, NEVER
            return
        state.save_steps = self.plan.schedule.save_steps
        if self.plan.schedule.eval_steps:
            state.eval_steps = self.plan.schedule.eval_steps
