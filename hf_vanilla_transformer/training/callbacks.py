"""The Trainer's callbacks of a run beside the budget's (`budget/deadline.py`): checkpoints every few minutes (§6.1),
the set-up clock's first update, and the progress line."""

from __future__ import annotations

import sys
import time

from transformers import ProgressCallback, TrainerCallback

from ..utils.distributed import main_process_decides
from .collapse import JUDGED_AFTER_EPOCHS


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
        if main_process_decides(time.monotonic() - self.last >= self.seconds, args.device):
            control.should_save = True
        return control

    def on_save(self, args, state, control, **kwargs):
        self.last = time.monotonic()


class PlateauCallback(TrainerCallback):
    """Stops training once `patience` validations in a row have not raised the best validation BLEU: the model has
    stopped improving, and the minutes left go to the averaging and the test instead of to updates that change
    nothing (the recipe's `plateau_validations`; an epoch cap stopped runs by a count instead). `stopped_at` the
    update it stopped after, `best` the best validation's update and BLEU; the decision is the main process's.

    Validations within the first `JUDGED_AFTER_EPOCHS` of the corpus count for the best but not against it, as the
    source check judges (`collapse.py`): every batch is new there, and a model that has not begun to translate has
    not stopped improving (a 6-minute run on a Zen 4 was stopped at 396 of its 659 updates, 0.43 epochs, by
    validation BLEU of 0.038 / 0.030 / 0.015 / 0.008: test BLEU 0.02, 1.7 minutes unspent; 2026-12-03)."""

    def __init__(self, patience: int):
        if patience < 1:
            raise ValueError(f"plateau_validations={patience} is invalid; expected at least 1.")
        self.patience, self.best, self.since, self.stopped_at = patience, None, 0, None

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if not metrics or "eval_bleu" not in metrics or self.stopped_at is not None:
            return control
        bleu = float(metrics["eval_bleu"])
        if self.best is None or bleu > self.best[1]:
            self.best, self.since = (state.global_step, bleu), 0
        elif state.epoch is None or state.epoch >= JUDGED_AFTER_EPOCHS:
            self.since += 1
        last = control.should_training_stop or state.global_step >= state.max_steps
        if main_process_decides(self.since >= self.patience and not last, args.device):
            self.stopped_at = state.global_step
            control.should_training_stop = control.should_save = True
            # Said here, not by a helper of its own: a slow machine's plateau would add its file to the run's walk.
            best, bleu = self.best
            said = (
                f"validation BLEU has not risen in {self.patience} validations, its best {bleu:.2f} at update {best:,}"
            )
            print(f"Stopped at update {self.stopped_at:,}: {said}.", flush=True)
        return control

    def record(self) -> dict:
        """What results.json keeps: the rule, where it stopped (None: it did not) and the best validation."""
        best = {"step": self.best[0], "bleu": self.best[1]} if self.best else None
        return {"patience": self.patience, "stopped_at": self.stopped_at, "best": best}


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
