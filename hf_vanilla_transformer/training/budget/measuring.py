"""Measuring one model size for the plan, as values: its update's precision, attention and compilation and the time of
a batch at each batch size (`calibration.py`), a checkpoint's seconds, and on a GPU a decoding step's latency
(`decode_speed.py`)."""

from __future__ import annotations

import functools
import os
import tempfile
import time
from dataclasses import replace
from typing import NamedTuple

import torch

from ...data.collating import collate_rows, measured_batches, training_collator
from .calibration import Calibration, Candidate, Measurement
from .costs import BudgetRules, decoding_steps, validation_decoding_steps
from .decode_speed import measure_decode_step, median_batch
from .fitting import PlanInputs, rank


class Sized(NamedTuple):
    """A model size measured: its model, its measurement, a checkpoint's seconds, and its decoding steps' seconds
    with the test's beams and greedy (None: screened at its smallest batch only)."""

    model: object
    measurement: Measurement
    checkpoint_seconds: float
    decoding: tuple[float, float] | None


def calibration_of(inputs: PlanInputs, model) -> Calibration:
    """The calibration of `model`'s updates on real training batches of the run."""
    settings, data, multiple = inputs.settings, inputs.data, inputs.multiple
    collator = training_collator(data.tokenizer, model.config, settings.device)

    def sample(max_tokens: int, count: int, taken: set) -> list[dict]:
        return collate_rows(data.train, measured_batches(data.batches.of(max_tokens), count, multiple, taken), collator)

    mode = getattr(settings.args, "torch_compile_mode", None)
    return Calibration(settings.choices, settings.device, sample, settings.optimizer, mode)


def measure_size(
    inputs: PlanInputs,
    model,
    known: Measurement | None,
    fixed: Candidate | None,
    screened: Measurement | None = None,
) -> Sized:
    """One model size measured. The first size measured chooses the precision, attention and compilation at the
    largest batch (at the smallest, a launch-bound update, tf32 beat bf16 on the H100: docs/gpu.md); the others keep
    that choice (`fixed`). With several sizes, first at the smallest batch only (its most updates: one that cannot
    reach `min_updates` there goes no further), then, given that `screened` measurement, at the others with a
    checkpoint and a decoding step. A restart knows its time (`known`)."""
    if known is not None:
        return Sized(model, known, checkpoint_seconds(inputs, model), measure_decoding(inputs, model, known))
    sizes = inputs.settings.token_sizes
    if screened is None:
        calibration, choices = calibration_of(inputs, model), inputs.settings.choices
        if fixed is not None or len(choices.precisions) * len(choices.attentions) * len(choices.compiles) == 1:
            screened = calibration.measure(model, sizes[-1:], every_size=True, fixed=fixed)
        else:
            screened = calibration.measure(model, sizes[:1], every_size=True, rank=functools.partial(rank, inputs))
            screened = calibration.extend(model, screened, sizes[-1:])
        if len(inputs.presets) > 1:
            return Sized(model, screened, 0.0, None)
    measurement = calibration_of(inputs, model).extend(model, screened, sizes)
    return Sized(model, measurement, checkpoint_seconds(inputs, model), measure_decoding(inputs, model, measurement))


def checkpoint_seconds(inputs: PlanInputs, model) -> float:
    """A checkpoint's seconds where the run spaces its checkpoints per run (which the plan pays), else 0."""
    return measure_checkpoint_seconds(model) if inputs.rules.events.checkpoints_per_run else 0.0


def measure_checkpoint_seconds(model: torch.nn.Module) -> float:
    """Seconds to write the model and an Adam state of its size, as a checkpoint does."""
    state = {name: (torch.zeros_like(p), torch.zeros_like(p)) for name, p in model.named_parameters()}
    with tempfile.TemporaryDirectory() as folder:
        began = time.perf_counter()
        model.save_pretrained(folder)
        torch.save(state, os.path.join(folder, "optimizer.pt"))
        return time.perf_counter() - began


def measure_decoding(inputs: PlanInputs, model, measurement: Measurement) -> tuple[float, float]:
    """On a GPU, a decoding step's latency for `model` in the measured precision and attention, with the test's beams
    and greedy (the validation's); (0, 0) on a CPU (its decoding is predicted from the update's time)."""
    batch = inputs.rules.steps.batch
    if batch is None:
        return 0.0, 0.0
    precision, attention, beams = measurement.precision, measurement.attention, inputs.rules.held_out.test_beams
    device = inputs.settings.device
    step = measure_decode_step(model, batch, beams, precision, attention, device)
    if beams == 1:
        return step, step
    return step, measure_decode_step(model, batch, 1, precision, attention, device)


def decoding_on_gpu(rules: BudgetRules, data, alphas: int, device, eval_batch: int, world_size: int) -> BudgetRules:
    """The rules with a GPU's decoding steps: the test split's with the validation's once per alpha, a validation's
    in the Trainer's batches of `eval_batch` sentences over `world_size` processes, and the batch on `device` a
    step's latency is measured on."""
    batch, test = median_batch(data.tokenizer, list(data.test["source"]), device)
    validation = [len(ids) for ids in data.evaluation["input_ids"]] if data.evaluation is not None else []
    steps = decoding_steps(test) + alphas * decoding_steps(validation)
    during = validation_decoding_steps(validation, eval_batch, world_size)
    return replace(rules, steps=replace(rules.steps, test_steps=steps, validation_steps=during, batch=batch))
