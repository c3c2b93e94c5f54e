"""What the Trainer's own loop costs beyond the calibration's update, measured by a short run of the real Trainer.

The calibration times an update (forward, backward, the optimizer's step) on a copy of the model; the Trainer does
more each update: it fetches and collates the batch, counts its tokens, steps the §5.3 scheduler, runs its callbacks
and logs. Rather than a constant factor, the plan measures it on this machine: the chosen candidate's update is
timed again on a few of the run's real batches (the calibration's way), then the real `TransformerTrainer`, built
as the run's own (same arguments, precision, accumulation, data loading), trains a copy of the model on those same
batches for a few rounds; its steady seconds per update less the calibration's is the Trainer's own work
(`TrainerTrial.overhead`), added to every calibrated choice's update.

The trial leaves the model, the global random state and the output folder as they were.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import random
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from transformers import PrinterCallback, ProgressCallback, TrainerCallback

from ..trainer import TransformerTrainer
from .calibration import Candidate, measure_updates
from .device import synchronizer


TRIAL_BATCHES = 6  # distinct batch shapes timed (times the accumulation)
TRIAL_ROUNDS = 3  # passes of the Trainer over them: the first meets them in the new model's loop, the others count


@dataclass(frozen=True)
class TrainerTrial:
    """The Trainer's steady seconds per update on the trial's batches beside the calibration's on the same
    batches; `overhead` is the difference (never below 0)."""

    trainer_seconds: float
    calibrated_seconds: float

    @property
    def overhead(self) -> float:
        """The Trainer's seconds beyond the calibration's (below 0 where the Trainer is the faster: a copy the
        calibration timed in a worse moment), never less than half the calibration's."""
        return max(-0.5 * self.calibrated_seconds, self.trainer_seconds - self.calibrated_seconds)


class _FixedBatches:
    """A batch sampler that serves the same index batches every epoch, `rounds` times over."""

    batch_size = None
    drop_last = False

    def __init__(self, batches: list[list[int]], rounds: int):
        self.batches = [batch for _ in range(rounds) for batch in batches]

    def __iter__(self):
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)

    def set_epoch(self, epoch: int) -> None:
        pass


class _Stopwatch(TrainerCallback):
    """The seconds from the end of update `first` to the end of update `last` (the device synchronised at both)."""

    def __init__(self, first: int, last: int, synchronize: Callable[[], None], clock: Callable[[], float]):
        self.first, self.last, self.synchronize, self.clock = first, last, synchronize, clock
        self.began = self.seconds = None

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step in (self.first, self.last):
            self.synchronize()
            now = self.clock()
            if state.global_step == self.first:
                self.began = now
            else:
                self.seconds = now - self.began
        return control


def trainer_trial(
    model: torch.nn.Module, candidate: Candidate, batches: list[list[int]], data, args, accumulation: int, optimizer
) -> TrainerTrial:
    """The trial of the module docstring for `candidate` (precision, attention, compiled) on `batches` (index lists
    of the training split of `data`, a `PreparedData`; `accumulation` of them per update), with the run's Trainer
    arguments `args` and the calibration's `optimizer` factory. A ValueError or RuntimeError of the trial (out of
    memory) is the caller's to handle."""
    device, (precision, attention, compiled) = torch.device(args.device), candidate
    # 1. The calibration's update on these batches (which meets their shapes first).
    collator = data.collator(model.config, device)
    collated = [{k: v.to(device) for k, v in batch.items()} for batch in data.collate(batches, collator)]
    mode = getattr(args, "torch_compile_mode", None)
    calibrated = next(
        iter(measure_updates(model, collated, [candidate], optimizer, device, compile_mode=mode).values())
    )
    if calibrated.failure:
        raise RuntimeError(calibrated.failure)
    # 2. The Trainer, as the run builds it, on a copy of the model over the same batches: its updates after the
    #    first round, the device synchronised at both ends.
    updates = len(batches) // accumulation
    if updates < 1:
        raise RuntimeError(f"{len(batches)} batches of a distinct shape make no update of {accumulation}")
    trial = copy.deepcopy(model).train()
    if attention:
        trial.set_attn_implementation(attention)
    trial_args = args.planned(
        max_steps=updates * TRIAL_ROUNDS,
        warmup_steps=updates * TRIAL_ROUNDS,
        save_steps=None,
        eval_steps=None,
        precision=precision,
        compiled=compiled,
        accumulation=accumulation,
        learning_rate=1e-6,
    )
    stopwatch = _Stopwatch(updates, updates * TRIAL_ROUNDS, synchronizer(device), time.perf_counter)
    with _random_state_kept(), tempfile.TemporaryDirectory() as folder:
        trial_args.output_dir, trial_args.report_to = folder, []
        trial_args.save_strategy = trial_args.eval_strategy = "no"
        trainer = TransformerTrainer(
            model=trial,
            args=trial_args,
            train_dataset=data.train,
            data_collator=collator,
            batch_sampler=_FixedBatches(batches, TRIAL_ROUNDS),
            callbacks=[stopwatch],
        )
        trainer.pop_callback(PrinterCallback)
        trainer.pop_callback(ProgressCallback)
        try:
            trainer.train()
        finally:
            trainer.accelerator.free_memory()
            del trainer, trial
            gc.collect()
            if compiled:
                torch._dynamo.reset()  # the trial's graphs go: the Trainer's compile starts afresh
    if stopwatch.seconds is None:
        raise RuntimeError("the Trainer's trial ended before its last update")
    return TrainerTrial(stopwatch.seconds / (updates * (TRIAL_ROUNDS - 1)), calibrated.steady * accumulation)


@contextlib.contextmanager
def _random_state_kept():
    """Python's, NumPy's and torch's random states as they were after the block (the Trainer seeds all three)."""
    python, generator = random.getstate(), np.random.get_state()
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=devices):
        try:
            yield
        finally:
            random.setstate(python)
            np.random.set_state(generator)
