"""The Trainer's callbacks of a run: checkpoints every few minutes (§6.1), the time budget's deadline and the plan
carried into every checkpoint, and the progress line."""

from __future__ import annotations

import logging
import sys
import time

from transformers import ProgressCallback, TrainerCallback
from transformers.trainer_callback import ExportableState

from ..utils.distributed import main_process_decides


logger = logging.getLogger(__name__)


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


class TimeBudgetCallback(TrainerCallback, ExportableState):
    """Carries the plan into every checkpoint's trainer state, and stops a budgeted run at its deadline should the
    machine turn slower than it measured (another job started beside it): the run then ends early, saved, rather
    than late. A resumed run has no deadline (its budget was spent by the interrupted one)."""

    def __init__(self, plan: dict, deadline_seconds: float | None = None):
        self.plan = plan
        self.deadline = time.monotonic() + deadline_seconds if deadline_seconds is not None else None
        self.stopped_early_at: int | None = None

    def state(self) -> dict:
        return {"args": {"plan": self.plan}, "attributes": {}}

    def on_step_end(self, args, state, control, **kwargs):
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


class TrainingProgressCallback(ProgressCallback):
    """The progress bar, with one readable line per log instead of a dict: update, loss, learning rate, source
    tokens per second (padding excluded, all processes), validation BLEU when there is one, time so far and left."""

    def on_train_begin(self, args, state, control, **kwargs):
        super().on_train_begin(args, state, control, **kwargs)
        now = time.monotonic()
        self.started = (now, state.global_step)  # for the time left
        self.last = (now, _tokens_seen(state))  # at the last training-loss line: for tokens/s

    def on_evaluate(self, args, state, control, **kwargs):
        super().on_evaluate(args, state, control, **kwargs)
        self.last = (time.monotonic(), _tokens_seen(state))  # tokens/s counts training time only

    def on_save(self, args, state, control, **kwargs):
        super().on_save(args, state, control, **kwargs)
        self.last = (time.monotonic(), _tokens_seen(state))

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
        last_time, last_tokens = self.last
        if now > last_time and tokens > last_tokens:
            parts.append(f"{(tokens - last_tokens) / (now - last_time):,.0f} source tok/s")
        started_time, started_step = self.started
        elapsed = now - started_time
        if step > started_step:
            left = elapsed / (step - started_step) * (state.max_steps - step)
            parts.append(f"{elapsed / 60:.1f} min, {left / 60:.1f} min left")
        if "loss" in logs:
            self.last = (now, tokens)
        self.training_bar.write(" | ".join(parts))


def _tokens_seen(state) -> int:
    return int(getattr(state, "num_input_tokens_seen", 0) or 0)
