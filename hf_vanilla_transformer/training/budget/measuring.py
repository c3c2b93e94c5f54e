"""Measuring one model size for the plan, as values: its update's precision, attention and compilation, chosen here
from the times the calibration hands back (`calibration.py`), in stages and in the order the budget gives them
(`measure_update`), and said in words (`choice_reasons`); the chosen one's time at each batch size (`extended`), a
checkpoint's seconds, and on a GPU a decoding step's latency (`decode_speed.py`). The calibration times what it is
given; what to time next, and which time wins, is decided here."""

from __future__ import annotations

import functools
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import torch

from ...data.collating import collate_rows, measured_batches, training_collator
from .calibration import (
    COMPILE_AFTER_MINUTES,
    Calibration,
    Candidate,
    Measurement,
    Timing,
    UpdateChoices,
    candidate_key,
)
from .costs import BudgetRules, decoding_steps, validation_decoding_steps
from .decode_speed import measure_decode_step, median_batch
from .fitting import PlanInputs, rank


MAX_CROSSED = 4  # at most this many (precision, attention) pairs are measured crossed; more go in two stages


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
    return Calibration(
        settings.choices, settings.device, sample, settings.optimizer, mode, inputs.clock.check_measuring
    )


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
    sizes, calibration = inputs.settings.token_sizes, calibration_of(inputs, model)
    several = len(inputs.presets) > 1
    if screened is not None:
        measurement = extended(calibration, model, screened, sizes)
    else:
        # The choice staged at the largest batch (at the smallest where nothing is open), then the smallest (a size
        # of several is screened there), then, with one size, the others.
        nothing_open = math.prod(map(len, open_lists(inputs.settings.choices, fixed))) == 1
        first = list(dict.fromkeys((sizes[-1],) if nothing_open else (sizes[0], sizes[-1])))
        timed = first + ([] if several else [size for size in sizes if size not in first])
        order = functools.partial(rank, inputs)
        measurement = measure_update(calibration, model, timed, every_size=True, fixed=fixed, order=order)
        if several:
            return Sized(model, measurement, 0.0, None)
    return Sized(model, measurement, checkpoint_seconds(inputs, model), measure_decoding(inputs, model, measurement))


def measure_update(
    calibration: Calibration,
    model,
    sizes: list[int],
    *,
    every_size: bool,
    fixed: Candidate | None = None,
    order: Callable[[Timing, int], float] | None = None,
) -> Measurement:
    """The update of `model`: every precision, attention and compilation the calibration's choices leave open (the
    candidate `fixed` where given) timed by the calibration on real batches of the largest size `sizes[0]`, stage by
    stage (`staged`), each stage's best by `order(timing, max_tokens)`, lowest first (default: the steady time; a
    budget orders by what the run pays, `fitting.rank`); then, with `every_size`, the chosen one timed at the other
    sizes. Nothing is timed where nothing is open and no budget asks for a time (`every_size` False). A ValueError
    names the failures where no candidate could run."""
    lists = open_lists(calibration.choices, fixed)
    if not every_size and math.prod(map(len, lists)) == 1:
        return Measurement(lists[0][0], lists[1][0], lists[2][0])
    size, timings = sizes[0], {}
    order = order or (lambda timing, max_tokens: timing.steady)
    best = functools.partial(
        _best, calibration, model, size=size, order=order, every_size=every_size, timings=timings, taken=set()
    )
    chosen = staged(*lists, best)
    key = candidate_key(*chosen)
    reasons = choice_reasons(calibration.choices, calibration.device, lists, timings, chosen)
    measured = {f"{name}@{size}": timing.steady for name, timing in timings.items() if not timing.failure}
    measurement = Measurement(*chosen, measured=measured, reasons=reasons)
    if key in timings:
        measurement.per_size[size] = timings[key]
    return extended(calibration, model, measurement, sizes[1:]) if every_size else measurement


def extended(calibration: Calibration, model, measurement: Measurement, sizes: list[int]) -> Measurement:
    """`measurement` with its chosen candidate timed at each of `sizes` it has no time for yet, each size a stage of
    one on batches of shapes of its own (`Calibration.measure_stage`)."""
    candidate = measurement.fixed
    key = candidate_key(*candidate)
    for size in [size for size in sizes if size not in measurement.per_size]:
        timing = calibration.measure_stage(model, size, [candidate], set())[key]
        measurement.per_size[size] = timing
        measurement.measured[f"{key}@{size}"] = timing.steady
    return measurement


def open_lists(choices: UpdateChoices, fixed: Candidate | None) -> tuple[list, list, list]:
    """(precisions, attentions, compilations) to choose among: those `choices` leave open, else the one `fixed`."""
    if fixed is not None:
        return [fixed[0]], [fixed[1]], [fixed[2]]
    return list(choices.precisions), list(choices.attentions), list(choices.compiles)


def runs_in(precision: str, attention: str | None) -> bool:
    """Whether `attention` runs in `precision`: flash attention has 16-bit kernels only."""
    return attention != "flash_attention_2" or precision in ("bf16", "fp16")


def _best(
    calibration: Calibration,
    model,
    candidates: list[Candidate],
    *,
    size: int,
    order: Callable[[Timing, int], float],
    every_size: bool,
    timings: dict[str, Timing],
    taken: set,
) -> Candidate:
    """The best of one stage's `candidates` by `order`, those not yet in `timings` timed first (on shapes not in
    `taken`); a lone candidate is timed only `every_size`."""
    candidates = [c for c in candidates if runs_in(c[0], c[1])]
    missing = [c for c in candidates if candidate_key(*c) not in timings]
    if missing and (len(candidates) > 1 or every_size):
        timings.update(calibration.measure_stage(model, size, missing, taken))
    if len(candidates) == 1:
        return candidates[0]
    choice = min(candidates, key=lambda c: order(timings[candidate_key(*c)], size))
    if timings[candidate_key(*choice)].failure:
        failures = "; ".join(f"{candidate_key(*c)}: {timings[candidate_key(*c)].failure}" for c in candidates)
        raise ValueError(f"no training update runs on {calibration.device}: {failures}.")
    return choice


def staged(precisions, attentions, compiles, best: Callable[[list[Candidate]], Candidate]) -> Candidate:
    """The candidate `best` picks in stages: 1. the precision and attention, crossed where few, else the precision
    first (with sdpa) and then the attention; 2. the compilation, for the chosen precision and attention."""
    if len(precisions) * len(attentions) <= MAX_CROSSED:
        precision, attention, _ = best([(p, a, compiles[0]) for p in precisions for a in attentions])
    else:
        preferred = "sdpa" if "sdpa" in attentions else attentions[0]
        precision = best([(p, preferred, compiles[0]) for p in precisions])[0]
        attention = best([(precision, a, compiles[0]) for a in attentions])[1]
    return best([(precision, attention, c) for c in compiles])


def checkpoint_seconds(inputs: PlanInputs, model) -> float:
    """A checkpoint's seconds where the run spaces its checkpoints per run (which the plan pays), else 0."""
    args = inputs.settings.args
    if not inputs.rules.events.checkpoints_per_run or not args.should_save:  # only the process that writes them
        return 0.0
    return measure_checkpoint_seconds(model, args.output_dir)


TIMED_CHECKPOINT = ".timed-checkpoint-"  # the prefix of the plan's timed checkpoint's temporary folder


def measure_checkpoint_seconds(model: torch.nn.Module, near: str | os.PathLike | None = None) -> float:
    """Seconds to write the model and an Adam state of its size, as a checkpoint does: in a temporary folder inside
    `near` (the run's output folder, where its checkpoints go: the same disk), removed after; the system's temporary
    folder where `near` is None or no folder (a memory-backed /tmp would time a slow disk's checkpoint too short)."""
    state = {name: (torch.zeros_like(p), torch.zeros_like(p)) for name, p in model.named_parameters()}
    place = near if near is not None and os.path.isdir(near) else None
    if place is not None:  # one a killed run left behind (never a link: nothing is followed)
        for stale in Path(place).glob(f"{TIMED_CHECKPOINT}*"):
            if stale.is_dir() and not stale.is_symlink():
                shutil.rmtree(stale)
    with tempfile.TemporaryDirectory(dir=place, prefix=TIMED_CHECKPOINT) as folder:
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


def decoding_on_gpu(rules: BudgetRules, data, searches: int, device, eval_batch: int, world_size: int) -> BudgetRules:
    """The rules with a GPU's decoding steps: the test split's with the validation's `searches` times (the choice of
    alpha's: `planner.alpha_searches`), a validation's
    in the Trainer's batches of `eval_batch` sentences over `world_size` processes, and the batch on `device` a
    step's latency is measured on."""
    batch, test = median_batch(data.tokenizer, list(data.test["source"]), device)
    validation = [len(ids) for ids in data.evaluation["input_ids"]] if data.evaluation is not None else []
    steps = decoding_steps(test) + searches * decoding_steps(validation)
    during = validation_decoding_steps(validation, eval_batch, world_size)
    return replace(rules, steps=replace(rules.steps, test_steps=steps, validation_steps=during, batch=batch))


def choice_reasons(choices: UpdateChoices, device, lists, timings, chosen: Candidate) -> list[str]:
    """The choice `chosen` (made by `measure_update` among `lists`) in words: each open one with its time against the
    others measured in `timings`, and the candidates left out with their failures."""
    precisions, attentions, compiles = lists
    precision, attention, compiled = chosen

    def against(name: str, others: list[Candidate], label: Callable[[Candidate], str]) -> str:
        mine = timings[candidate_key(*chosen)]
        measured = {key for key, timing in timings.items() if not timing.failure}
        rest = [c for c in others if c != chosen and candidate_key(*c) in measured]
        return f"{name}: {_seconds(mine)} per update against " + ", ".join(
            f"{_seconds(timings[candidate_key(*c)])} {label(c)}" for c in rest
        )

    reasons = [f"{key} left out: {timing.failure}" for key, timing in timings.items() if timing.failure]
    if choices.precision_open and len(precisions) == 1 and device.type == "cpu":
        reasons.append("fp32: no bf16 matrix units in this CPU (AMX or AVX512-BF16)")
    elif len(precisions) > 1:
        reasons.append(against(precision, [(p, attention, compiled) for p in precisions], lambda c: f"in {c[0]}"))
    else:
        reasons.append(f"{precision} as given")
    if len(attentions) > 1:
        reasons.append(
            against(f"{attention} attention", [(precision, a, compiled) for a in attentions], lambda c: f"with {c[1]}")
        )
    if len(compiles) > 1:
        name = "a compiled training step" if compiled else "an eager training step"
        reasons.append(
            against(name, [(precision, attention, c) for c in compiles], lambda c: "compiled" if c[2] else "eager")
        )
    elif choices.compile_open and device.type == "cuda" and not compiled:
        reasons.append(
            f"an eager training step (a compiled one is measured in runs of {COMPILE_AFTER_MINUTES}+ minutes)"
        )
    return reasons


def _seconds(timing: Timing) -> str:
    """`0.35 s`, with what a new batch shape adds where it is worth saying (a tenth of an update or more)."""
    text = f"{timing.steady:.2f} s" if timing.steady >= 0.1 else f"{timing.steady * 1000:.1f} ms"
    if timing.per_shape >= 0.1 * timing.steady and timing.per_shape >= 0.001:
        text += f" (+{timing.per_shape:.2f} s a new batch shape)"
    if timing.once >= 1.0:
        text += f" (+{timing.once:.0f} s once)"
    return text
