"""What the Trainer's own loop costs beyond the calibration's update, measured by a short run of the real Trainer.

The calibration times an update (forward, backward, the optimizer's step) on a copy of the model; the Trainer does
more each update: it fetches and collates the batch, counts its tokens, steps the §5.3 scheduler, runs its callbacks
and logs. Rather than a constant factor, the plan measures it on this machine: the real `TransformerTrainer`, built
as the run's own (same arguments, precision, accumulation, data loading), trains a copy of the model on a few of the
run's real batches, and its seconds per update over the calibration's for the same choice is the ratio the plan
corrects every calibrated choice's time by (`trainer_ratio`); its seconds less the calibration's on the same
batches, the Trainer's own work (`TrainerTrial.overhead`), are said beside it:

* on a CPU, in pairs, over one pass of batches of shapes met for the first time: after each of the Trainer's updates,
  the calibration's update of its own copy of the model on the same batches (a shape the Trainer just met: cached),
  so that a change of the machine's load falls on both alike (the median of the differences). A CPU's run meets a
  shape's cost at almost every update, not once: oneDNN keeps 1,024 primitives (a shape needs dozens) and a corpus
  has hundreds of batch shapes, so the cache rarely holds the next update's (measured on the help corpus: every
  epoch as slow as the first, 20% faster once a cache of 65,536 held them all, at 3.8 GB more memory). The
  Trainer's update on shapes it meets for the first time is then what the run pays, and the plan's ratio carries it;
* on a GPU, where the Trainer queues its kernels without waiting (a wait per update would add what the queue hides)
  and the plans of a shape are kept, two passes: the second, a window with the device synchronised at its two ends,
  against the calibration's steady update on the same batches measured before.

The trial leaves the model, the global random state and the output folder as they were.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from transformers import PrinterCallback, ProgressCallback, TrainerCallback

from ...data.collating import collate_rows, measured_batches, training_collator
from ...utils.device import synchronizer
from .applying import apply_plan
from .calibration import Candidate, _Copy, measure_updates
from .clock import BudgetError
from .plan import BudgetPlan


TRIAL_BATCHES = 24  # distinct batch shapes (times the accumulation), standing for the run's (shape_sample)
CPU_WARM = 4  # on a CPU, the Trainer's first updates not counted (its optimizer's state made, first touches)


@dataclass(frozen=True)
class TrainerTrial:
    """The Trainer's seconds per update on the trial's batches beside the calibration's on the same batches, and
    the difference the module docstring says (`difference`: in pairs, their median)."""

    trainer_seconds: float
    calibrated_seconds: float
    difference: float

    @property
    def overhead(self) -> float:
        """The Trainer's own seconds per update (below 0 where the Trainer is the faster), never less than half the
        calibration's."""
        return max(-0.5 * self.calibrated_seconds, self.difference)


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


class _Window(TrainerCallback):
    """The seconds from the end of update `first` to the end of update `last` (the device synchronised at both),
    against the calibration's `calibrated` seconds per update."""

    def __init__(self, first: int, last: int, synchronize: Callable[[], None], calibrated: float):
        self.first, self.last, self.synchronize, self.calibrated = first, last, synchronize, calibrated
        self.began = self.seconds = None

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step in (self.first, self.last):
            self.synchronize()
            now = time.perf_counter()
            if state.global_step == self.first:
                self.began = now
            else:
                self.seconds = now - self.began
        return control

    def trial(self) -> TrainerTrial:
        if self.seconds is None:
            raise RuntimeError("the Trainer's trial ended before its last update")
        trainer = self.seconds / (self.last - self.first)
        return TrainerTrial(trainer, self.calibrated, trainer - self.calibrated)


class _Pairs(TrainerCallback):
    """After each of the Trainer's updates, the calibration's update of `copy_` on the same batches (`collated`, in
    the Trainer's order, `accumulation` an update), each timed; the first `warm` updates are not counted."""

    def __init__(self, copy_, collated: list[dict], accumulation: int, warm: int, check=None):
        self.copy, self.collated, self.accumulation, self.warm = copy_, collated, accumulation, warm
        self.check = check  # after each pair: raises where the budget is spent
        self.pairs: list[tuple[float, float]] = []
        self.mark = time.perf_counter()

    def on_train_begin(self, args, state, control, **kwargs):
        self.mark = time.perf_counter()
        return control

    def on_step_end(self, args, state, control, **kwargs):
        trainer = time.perf_counter() - self.mark
        first = (state.global_step - 1) * self.accumulation
        began = time.perf_counter()
        for index in range(first, first + self.accumulation):
            self.copy.update(self.collated[index % len(self.collated)])
        if state.global_step > self.warm:
            self.pairs.append((trainer, time.perf_counter() - began))
        if self.check is not None:
            self.check()
        self.mark = time.perf_counter()
        return control

    def trial(self) -> TrainerTrial:
        if not self.pairs:
            raise RuntimeError("the Trainer's trial ended before its last update")
        trainer, calibrated = (statistics.fmean(side) for side in zip(*self.pairs, strict=True))
        return TrainerTrial(trainer, calibrated, statistics.median(t - c for t, c in self.pairs))


def trainer_trial(
    model: torch.nn.Module,
    candidate: Candidate,
    batches: list[list[int]],
    data,
    args,
    accumulation: int,
    optimizer,
    trainer_class: type,
    check=None,
) -> TrainerTrial:
    """The trial of the module docstring for `candidate` (precision, attention, compiled) on `batches` (index lists
    of the training split of `data`, a `PreparedData`; `accumulation` of them per update), with the run's Trainer
    (`trainer_class`, given by the run: the budget imports nothing of the run's), its arguments `args` and the
    calibration's `optimizer` factory; `check()` after each update may end it with a BudgetError (on a CPU). A
    ValueError or RuntimeError of the trial (out of memory) is the caller's to handle."""
    device, (precision, attention, compiled) = torch.device(args.device), candidate
    updates, mode = len(batches) // accumulation, getattr(args, "torch_compile_mode", None)
    if updates <= CPU_WARM:
        raise RuntimeError(f"{len(batches)} batches of distinct shapes make too few updates of {accumulation}")
    collator = training_collator(data.tokenizer, model.config, device)
    collated = [{k: v.to(device) for k, v in batch.items()} for batch in collate_rows(data.train, batches, collator)]
    watch, rounds = _watch(model, candidate, collated, accumulation, optimizer, mode, check)
    loop = {"train_dataset": data.train, "data_collator": collator, "batch_sampler": _FixedBatches(batches, rounds)}
    trial = copy.deepcopy(model).train()
    # The trial's plan: the candidate, its length all warmup at a rate too small to move the copy, no events.
    length, update = updates * rounds, {"precision": precision, "attn_implementation": attention}
    plan = BudgetPlan.of(max_steps=length, warmup_steps=length, gradient_accumulation_steps=accumulation, **update)
    trial_args = apply_plan(plan.but(torch_compile=compiled, peak_learning_rate=1e-6), args, trial)
    with _random_state_kept(), tempfile.TemporaryDirectory() as folder:
        trial_args.output_dir, trial_args.report_to = folder, []
        trial_args.save_strategy = trial_args.eval_strategy = "no"
        _train(trainer_class, compiled, model=trial, args=trial_args, callbacks=[watch], **loop)
        del trial
        gc.collect()
    return watch.trial()


def _train(trainer_class: type, compiled: bool, **arguments) -> None:
    """The trial's Trainer (`trainer_class` built with `arguments`) trained without its printed progress, and freed
    after (and a compiled step's graphs)."""
    trainer = trainer_class(**arguments)
    trainer.pop_callback(PrinterCallback)
    trainer.pop_callback(ProgressCallback)
    try:
        trainer.train()
    finally:
        trainer.accelerator.free_memory()
        if compiled:
            torch._dynamo.reset()  # the trial's graphs go: the Trainer's compile starts afresh


def _watch(model, candidate: Candidate, collated: list[dict], accumulation: int, optimizer, mode, check=None) -> tuple:
    """(what times the trial's Trainer, the passes it makes over its batches): on a GPU the window of its second
    pass against the calibration's update measured here; on a CPU the calibration's update beside each of its own."""
    device, updates = collated[0]["input_ids"].device, len(collated) // accumulation
    if device.type != "cuda":
        copy_ = _Copy(model, candidate, device, optimizer, mode)
        return _Pairs(copy_, collated, accumulation, warm=CPU_WARM, check=check), 1
    timing = next(iter(measure_updates(model, collated, [candidate], optimizer, device, compile_mode=mode).values()))
    if timing.failure:
        raise RuntimeError(timing.failure)
    return _Window(updates, updates * 2, synchronizer(device), timing.steady * accumulation), 2


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


def trainer_ratio(inputs, sized, fit) -> tuple[float, list[str], TrainerTrial | None]:
    """(the real Trainer's seconds per update of the `sized` model (a `measuring.Sized`) at `fit`'s batch size on
    the run's batches over the calibration's, the words that say so, the trial); 1 where the trial cannot run, or
    under several processes: each would time its own choice in a Trainer of collectives it shares with the others
    (the first check re-plans from the Trainer's own updates there). `inputs`: the plan's (`fitting.PlanInputs`)."""
    settings = inputs.settings
    if settings.world_size > 1 or inputs.trainer_class is None:
        why = "under several processes" if settings.world_size > 1 else "(no Trainer given to the plan)"
        return 1.0, [f"the Trainer's update not measured before training {why}"], None
    accumulation = settings.updates[fit.max_tokens].accumulation
    sampler = inputs.data.batches.of(fit.max_tokens)
    batches = measured_batches(sampler, TRIAL_BATCHES * accumulation, inputs.multiple, set())
    try:
        trial = trainer_trial(
            sized.model, sized.measurement.fixed, batches, inputs.data, settings.args, accumulation,
            settings.optimizer, inputs.trainer_class, inputs.clock.check_measuring,
        )  # fmt: skip
    except BudgetError:
        raise  # the budget is spent: the trial did not fail
    except (RuntimeError, ValueError) as error:
        return 1.0, [f"the Trainer's update not measured before training ({str(error).splitlines()[0][:200]})"], None
    ratio = trial.trainer_seconds / fit.timing.steady
    said = (
        f"the Trainer's own update {trial.trainer_seconds:.3f} s on {len(batches)} of the run's batches ("
        f"{ratio:.2f} of the calibration's {fit.timing.steady:.3f} s; its own work "
        f"{trial.overhead * 1000:.1f} ms an update)"
    )
    return ratio, [said], trial
