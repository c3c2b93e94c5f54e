"""The Trainer of the paper's recipe: the §5.3 learning-rate schedule, token-budget batches (§5.1), checkpoints marked
complete, and the progress line."""

from __future__ import annotations

import contextlib
import copy
import logging
import sys
import time
from functools import partial
from pathlib import Path

import torch
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data import DataLoader
from transformers import (
    ProgressCallback,
    Seq2SeqTrainer,
    TrainerCallback,
)
from transformers.utils import logging as hf_logging

from .batching import TokenBudgetBatchSampler
from .budget import (
    cpu_has_fast_bf16,  # noqa: F401 (its import path before budget.py)
)
from .checkpoints import mark_complete


logger = logging.getLogger(__name__)


def noam_factor(step: int, warmup_steps: int) -> float:
    """min(step^-0.5, step * warmup^-1.5) for the optimizer's `step`-th update (1-based), §5.3 eq. 3."""
    step = max(step, 1)
    return min(step**-0.5, step * warmup_steps**-1.5)


def noam_schedule(optimizer: torch.optim.Optimizer, warmup_steps: int) -> LambdaLR:
    """LambdaLR whose factor at scheduler step s (0 before the first update) is that of update s + 1."""
    if warmup_steps < 1:
        raise ValueError(f"warmup_steps={warmup_steps} is invalid; the §5.3 schedule needs at least 1.")
    return LambdaLR(optimizer, partial(_noam_lambda, warmup_steps=int(warmup_steps)))


def _noam_lambda(step: int, warmup_steps: int) -> float:
    return noam_factor(step + 1, warmup_steps)


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
        due = time.monotonic() - self.last >= self.seconds
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            flag = torch.tensor([int(due)], device=args.device)
            torch.distributed.broadcast(flag, src=0)
            due = bool(flag.item())
        if due:
            control.should_save = True
        return control

    def on_save(self, args, state, control, **kwargs):
        self.last = time.monotonic()


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


@contextlib.contextmanager
def _without_nested_bars():
    """No transformers progress bars (such as save_pretrained's "Writing model shards") inside the training bar when
    the output is a log file: placed one line below it, they move the cursor up and leave "\x1b[A" behind."""
    if sys.stderr.isatty() or not hf_logging.is_progress_bar_enabled():
        yield
        return
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.enable_progress_bar()


def _tokens_seen(state) -> int:
    return int(getattr(state, "num_input_tokens_seen", 0) or 0)


class TransformerTrainer(Seq2SeqTrainer):
    """`Seq2SeqTrainer` with token-budget batches (§5.1) and the §5.3 learning-rate schedule.

    `batch_sampler` (a `TokenBudgetBatchSampler`) replaces the fixed batch size for training; evaluation batches
    are sorted by length too, so that beam search wastes little on padding.
    """

    def __init__(self, *args, batch_sampler: TokenBudgetBatchSampler | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.batch_sampler = batch_sampler

    def get_train_dataloader(self) -> DataLoader:
        if self.batch_sampler is None:
            return super().get_train_dataloader()
        dataset = self._remove_unused_columns(self.train_dataset, description="Training")
        loader = DataLoader(
            dataset,
            batch_sampler=self.batch_sampler,
            collate_fn=self.data_collator,
            num_workers=self.args.dataloader_num_workers,
            pin_memory=self.args.dataloader_pin_memory and torch.cuda.is_available(),
        )
        # accelerate gives each process every num_processes-th batch; Trainer calls set_epoch on our sampler.
        return self.accelerator.prepare(loader)

    def get_eval_dataloader(self, eval_dataset=None) -> DataLoader:
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if isinstance(dataset, str) or dataset is None or "input_ids" not in dataset.column_names:
            return super().get_eval_dataloader(eval_dataset)
        dataset = self._remove_unused_columns(dataset, description="Evaluation")
        lengths = [len(ids) for ids in dataset["input_ids"]]
        budget = self.args.per_device_eval_batch_size * max(1, int(sum(lengths) / len(lengths)))
        sampler = TokenBudgetBatchSampler(lengths, lengths, max_tokens=budget, shuffle=False)
        loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=self.data_collator)
        return self.accelerator.prepare(loader)

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None, **gen_kwargs):
        # Seq2SeqTrainer fills the model's generation config with transformers' global defaults (max_length 20, ...)
        # in place; every checkpoint would then carry them. Evaluate on a copy and keep the model's own config.
        generation_config = copy.deepcopy(self.model.generation_config)
        try:
            return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys, **gen_kwargs)
        finally:
            self.model.generation_config = generation_config

    def _save_checkpoint(self, model, trial) -> None:
        """`Trainer`'s checkpoint, then a `.complete` marker once every process has written its part, so that a
        checkpoint interrupted at any moment (SIGKILL included) is never mistaken for a complete one."""
        with _without_nested_bars():
            super()._save_checkpoint(model, trial)
        folder = Path(self._get_output_dir(trial=trial)) / f"checkpoint-{self.state.global_step}"
        self.accelerator.wait_for_everyone()
        if self.args.should_save:
            mark_complete(folder, self.state.global_step)
        self.accelerator.wait_for_everyone()

    def create_scheduler(self, num_training_steps: int, optimizer: torch.optim.Optimizer | None = None):
        if self.lr_scheduler is None:
            optimizer = optimizer if optimizer is not None else self.optimizer
            self.lr_scheduler = noam_schedule(optimizer, int(self.args.warmup_steps))
            self._created_lr_scheduler = True
        return self.lr_scheduler
