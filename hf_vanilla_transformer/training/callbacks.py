"""The Trainer's callbacks of a run: checkpoints every few minutes (§6.1), the time budget's deadline and the plan
carried into every checkpoint, and the progress line."""

from __future__ import annotations

import dataclasses
import logging
import sys
import time

from transformers import ProgressCallback, TrainerCallback
from transformers.trainer_callback import ExportableState

from ..utils.distributed import main_process_decides, main_process_value
from ..utils.faults import moment
from .plan_record import plan_state, write_plan
from .planning import BudgetPlan
from .replanning import (
    CHANGE_AT_LEAST,
    RefitRules,
    UpdateMeter,
    better_candidate,
    predicted_decode_seconds,
    refit,
)


logger = logging.getLogger(__name__)

NEVER = 2**62  # a spacing of events that never comes


class SaveEveryCallback(TrainerCallback):
    """Save a checkpoint whenever `minutes` have passed since the last one (§6.1: every 10 minutes).

    The decision is the main process's, broadcast to the others, so that every process saves at the same step.
    """

    def __init__(self, minutes: float):
        if minutes <= 0:
            raise ValueError(f"save_minutes={minutes} is invalid; expected a positive number of minutes.")
        self.seconds = minutes * 60
        self.last = time.monotonic()

    def on_step_end(self, args, state, control, **kwargs):
        if main_process_decides(time.monotonic() - self.last >= self.seconds, args):
            control.should_save = True
        return control

    def on_save(self, args, state, control, **kwargs):
        self.last = time.monotonic()


def _near_the_end(state, spacing: int) -> bool:
    """Whether the run's last update, which saves and validates by the Trainer's own rule, is less than half an event
    `spacing` away: a spaced checkpoint or validation there would come twice at the run's end."""
    return 0 < state.max_steps - state.global_step < spacing / 2


class TimeBudgetCallback(TrainerCallback, ExportableState):
    """The budgeted run's length: carries the plan into every checkpoint's trainer state, re-plans the run's length
    from its own updates (`replanning.py`: after `rules.first_check` updates and after every validation), and stops
    the run at its deadline should the machine turn slower than it measured (another job started beside it): the
    run then ends early, saved, rather than late. Its checkpoints and validations are spaced from the last one (the
    Trainer's own come at multiples of the spacing: after a re-plan changed it, those would add events). A resumed
    run (rebuilt from its checkpoint with the plan alone) keeps the length its checkpoint recorded and has no
    deadline (its budget was spent by the interrupted one)."""

    def __init__(
        self,
        plan: BudgetPlan | dict,
        deadline_seconds: float | None = None,
        rules: RefitRules | None = None,
    ):
        self.plan = plan if isinstance(plan, BudgetPlan) else BudgetPlan.from_dict(plan)  # (dict: from a checkpoint)
        now = time.monotonic()
        self.deadline = now + deadline_seconds if deadline_seconds is not None else None
        self.rules = rules if self.deadline is not None else None
        self.meter = UpdateMeter(clock=time.monotonic)
        self.stopped_early_at: int | None = None
        self.checked = False
        self.switch: dict | None = None  # a better choice of model and batch size, for run.py to start again with
        self.last_save = self.last_evaluation = 0  # the updates of the last checkpoint and validation

    def state(self) -> dict:
        return plan_state(self.plan)

    def on_train_begin(self, args, state, control, **kwargs):
        # The Trainer runs to an upper bound (planning.trainer_arguments); the plan's length is the one that counts.
        self._apply(state)
        self.meter.start(state.global_step)
        return control

    def on_step_end(self, args, state, control, **kwargs):
        moment("update")
        self.meter.step(state.global_step)
        if self.rules is not None:
            self._space_events(state, control)
        first_check = self.rules is not None and not self.checked and state.global_step >= self.rules.first_check
        if first_check and self.meter.updates > 0:  # (a short run checks once it has measured an update)
            self.checked = True
            if self._switch(args, state):
                # Before any checkpoint of this choice: run.py starts again with the switch.
                control.should_training_stop = True
                control.should_save = control.should_evaluate = False
                return control
            if not control.should_training_stop:
                self._replan(args, state, "its first updates", always=True)
        if self.deadline is None or state.global_step >= state.max_steps:
            return control
        # The main process decides: every process stops at the same update.
        if main_process_decides(time.monotonic() >= self.deadline, args):
            self.stopped_early_at = state.global_step
            logger.warning(
                "the time budget's deadline passed at update %d of %d (the machine is slower than it measured): "
                "stopping here and saving",
                state.global_step,
                state.max_steps,
            )
            control.should_training_stop = True
            control.should_save = True
        return control

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        seconds = self.meter.pause("validation")
        self.last_evaluation = state.global_step
        finished = control.should_training_stop or state.global_step >= state.max_steps  # the run's last validation
        if self.rules is not None and self.meter.seconds_per_update is not None and not finished:
            # The test decoding, predicted anew from this validation's decoding speed, moves the deadline.
            measured = metrics or {}
            check, prediction = measured.get("eval_source_check_seconds"), measured.get("eval_prediction_seconds")
            decode = predicted_decode_seconds(self.rules, seconds, self.meter.seconds_per_update, check, prediction)
            self.deadline += (self.plan.predicted_decode_seconds or 0.0) - decode
            self.plan = dataclasses.replace(self.plan, predicted_decode_seconds=decode)
            self._replan(args, state, f"the validation at update {state.global_step:,}")
            if _near_the_end(state, self.plan.save_steps):  # re-planned to end that close: the last update saves
                control.should_save = False
        return control

    def on_save(self, args, state, control, **kwargs):
        self.meter.pause("checkpoint")
        self.last_save = state.global_step
        return control

    def _apply(self, state) -> None:
        state.max_steps = self.plan.max_steps
        if self.rules is not None:  # spaced by `_space_events`: the Trainer's multiples never come
            state.save_steps, state.eval_steps = 0, NEVER
            return
        state.save_steps = self.plan.save_steps
        if self.plan.eval_steps:
            state.eval_steps = self.plan.eval_steps

    def _space_events(self, state, control) -> None:
        """A checkpoint once the plan's spacing has passed since the last one; a validation with it once its own
        spacing has (nearly) passed, or on its own where validations come more often than checkpoints. The run's
        last update saves and validates through the Trainer's own rule, so neither comes near it (`_near_the_end`):
        a re-planned length once put a checkpoint and a validation one update before the last, and the average took
        the run's end twice."""
        step, save, evaluate = state.global_step, self.plan.save_steps, self.plan.eval_steps
        if step >= state.max_steps:
            return
        saving = step - self.last_save >= save and not _near_the_end(state, save)
        control.should_save = control.should_save or saving
        if evaluate and self.rules.validates:
            due = step - self.last_evaluation >= (evaluate - save / 2 if evaluate >= save else evaluate)
            alone = evaluate < save and not _near_the_end(state, evaluate)
            control.should_evaluate = control.should_evaluate or (due and (saving or alone))

    def _switch(self, args, state) -> bool:
        """Whether the first updates prove the calibrated choice of model and batch size wrong enough to start
        again with a better one (`replanning.better_candidate`); every process takes the main process's answer. A
        run that started again already keeps its choice (its length is re-planned as any run's)."""
        rate, planned = self._steady_rate(state.global_step), self.plan.seconds_per_update
        if rate is None or not planned or self.plan.switched_from:  # a run starts again once at most
            return False
        checkpoint = self.plan.checkpoint_seconds or 0.0
        validation = self.plan.validation_seconds or 0.0
        left = self.deadline - time.monotonic()
        choice = better_candidate(self.plan, self.rules, rate / planned, left, checkpoint, validation)
        self.switch = main_process_value(choice)
        if self.switch is not None:
            logger.warning(
                "%.3f s per update measured where the calibration said %.3f: the %s model with batches of %s tokens "
                "reaches %s updates here; starting again with it",
                rate,
                planned,
                self.switch["preset"],
                f"{self.switch['max_tokens']:,}",
                f"{self.switch['max_steps']:,}",
            )
        return self.switch is not None

    def _steady_rate(self, step: int) -> float | None:
        """The Trainer's seconds per update of shapes met before: the meter's, less what the new batch shapes met
        while it counted cost (on a GPU most of them come early: the first check would charge them to every update
        still to come)."""
        rate = self.meter.seconds_per_update
        if rate is None or self.rules is None:
            return rate
        paid = self.rules.first_costs(self.plan, self.meter.counted_from, step)
        return max(0.5 * rate, (self.meter.seconds - paid) / self.meter.updates)

    def _replan(self, args, state, after: str, always: bool = False) -> None:
        """Re-fit the length from the measured speed (every process takes the main process's new plan)."""
        rate = self._steady_rate(state.global_step)
        if rate is None:
            return
        step = state.global_step
        checkpoint = self.meter.typical_pause("checkpoint", self.plan.checkpoint_seconds or 0.0)
        validation = self.meter.typical_pause("validation", self.plan.validation_seconds or 0.0)
        new = refit(self.plan, self.rules, step, rate, self.deadline - time.monotonic(), checkpoint, validation)
        new = main_process_value(new)
        old = self.plan.max_steps
        if not always and abs(new.max_steps - old) < CHANGE_AT_LEAST * old:
            return
        change = {"at": step, "after": after, "seconds_per_update": rate, "max_steps": new.max_steps, "was": old}
        self.plan = dataclasses.replace(new, replans=[*self.plan.replans, change])
        self._apply(state)
        logger.warning(
            "re-planned after %s: %.3f s per update measured (%.3f s planned): %s -> %s updates, a checkpoint every "
            "%s%s",
            after,
            rate,
            self.plan.seconds_per_update or float("nan"),
            f"{old:,}",
            f"{new.max_steps:,}",
            f"{new.save_steps:,}",
            f", validation every {new.eval_steps:,}" if new.eval_steps else "",
        )
        if args.should_save:
            write_plan(args.output_dir, self.plan, at="replan")


class SetupClockCallback(TrainerCallback):
    """Records, in the run's set-up clock (`utils/stages.py`), when the first update ends, and writes the clock of
    this process into the output folder."""

    def __init__(self, clock, output_dir):
        self.clock, self.output_dir = clock, output_dir

    def on_step_end(self, args, state, control, **kwargs):
        if "first update" not in self.clock.stages:
            self.clock.first_update()
            self.clock.write(self.output_dir)
        return control


class TrainingProgressCallback(ProgressCallback):
    """The progress bar, with one readable line per log instead of a dict: update, loss, learning rate, source
    tokens per second (padding excluded, all processes), seconds per update (beside the plan's, where a budget
    planned it), validation BLEU when there is one, time so far and left."""

    def __init__(self, planned_seconds_per_update: float | None = None):
        super().__init__()
        self.planned = planned_seconds_per_update

    def on_train_begin(self, args, state, control, **kwargs):
        super().on_train_begin(args, state, control, **kwargs)
        now = time.monotonic()
        self.started = (now, state.global_step)  # for the time left
        self.last = (now, _tokens_seen(state), state.global_step)  # at the last training-loss line: for the rates

    def on_step_end(self, args, state, control, **kwargs):
        super().on_step_end(args, state, control, **kwargs)
        if self.training_bar is not None and self.training_bar.total != state.max_steps:  # a re-planned length
            self.training_bar.total = state.max_steps
            self.training_bar.refresh()

    def on_evaluate(self, args, state, control, **kwargs):
        super().on_evaluate(args, state, control, **kwargs)
        self.last = (time.monotonic(), _tokens_seen(state), state.global_step)  # the rates count training time only

    def on_save(self, args, state, control, **kwargs):
        super().on_save(args, state, control, **kwargs)
        self.last = (time.monotonic(), _tokens_seen(state), state.global_step)

    def on_prediction_step(self, args, state, control, eval_dataloader=None, **kwargs):
        # Under the training bar, the validation bar is drawn one line below and erased when done by moving the
        # cursor up; in a log file (no terminal) that leaves "\x1b[A" behind, so there validation runs without one.
        if self.training_bar is not None and not sys.stderr.isatty():
            return
        super().on_prediction_step(args, state, control, eval_dataloader=eval_dataloader, **kwargs)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or self.training_bar is None or not logs:
            return
        now, step, tokens = time.monotonic(), state.global_step, _tokens_seen(state)
        parts = [f"update {step}/{state.max_steps}"]
        if "loss" in logs:
            parts.append(f"loss {logs['loss']:.3f}")
        if "learning_rate" in logs:
            parts.append(f"lr {logs['learning_rate']:.2e}")
        if "eval_bleu" in logs:
            parts.append(f"validation BLEU {logs['eval_bleu']:.1f} (loss {logs.get('eval_loss', float('nan')):.3f})")
        last_time, last_tokens, last_step = self.last
        if now > last_time and tokens > last_tokens:
            parts.append(f"{(tokens - last_tokens) / (now - last_time):,.0f} source tok/s")
        if now > last_time and step > last_step:
            planned = f" ({self.planned:.3f} planned)" if self.planned else ""
            parts.append(f"{(now - last_time) / (step - last_step):.3f} s/update{planned}")
        started_time, started_step = self.started
        elapsed = now - started_time
        if step > started_step:
            left = elapsed / (step - started_step) * (state.max_steps - step)
            parts.append(f"{elapsed / 60:.1f} min, {left / 60:.1f} min left")
        if "loss" in logs:
            self.last = (now, tokens, step)
        self.training_bar.write(" | ".join(parts))


def _tokens_seen(state) -> int:
    return int(getattr(state, "num_input_tokens_seen", 0) or 0)
