"""What the parts of a budgeted run cost, from the time of an update measured on the machine: the test decoding,
a validation's loss passes, and how many updates fit the time left once those and the first update of each new batch
shape are paid for. The planner (`planning.py`) and the re-planning from the run's own updates (`replanning.py`)
count with the same figures."""

from __future__ import annotations

import math
from collections.abc import Callable


# Decoding one test sentence with beam 4 costs about as much as training on this many tokens per side (an update's
# time divided by its tokens per batch): 1,152 sentences took 64 s at 0.86 s per 2,048-token update (EPYC, AVX2,
# fp32: 132 tokens), 75 s at 0.48 s per 1,024-token update (EPYC, fp32: 140), 22.4 s at 0.29 s per 2,048-token
# update (Xeon, AMX, bf16: 137), 57 s at 0.54 s per 1,024-token update (a slower EPYC, fp32: 94); greedy validation
# about half. The largest of them.
DECODE_TOKENS_PER_SENTENCE = {1: 90, 4: 140}


# What the planner keeps back: Trainer's own work per update (collation, scheduler, logging, token counting, the
# first touches of memory in a new process), measured as real updates against the calibration's (validation and
# checkpoints apart): on an EPYC (fp32) 0.835 s against 0.75 s with 2,048-token batches, 0.51 s against 0.42 s with
# 1,024; on a slower EPYC 0.517 s against 0.485 s and 0.563 s against 0.518 s with 1,024 (runs A and C of
# docs/cpu_recipe.md). Planning near the low end leaves less of the budget unused; a run that turns out slower
# stops at the deadline, saved, and averages its end.
TRAINER_OVERHEAD = 1.08
FINISHING_SECONDS = 30.0  # averaging, the model folder, plots and card
SAFETY = 0.97  # of the training time left, for the noise of a shared machine


def updates_that_fit(
    seconds: float,
    seconds_per_update: float,
    checkpoints: int = 0,
    seconds_per_checkpoint: float = 0.0,
    validations: int = 0,
    seconds_per_validation: float = 0.0,
    first_costs: Callable[[int], float] | None = None,
) -> int:
    """How many updates fit `seconds` of training, once `checkpoints` saves and `validations` passes are paid for
    (their number is fixed per run: their spacing grows with the run), and what `first_costs(updates)` adds to that
    many updates (new batch shapes: it grows with the updates, so the largest that fits is searched for)."""
    if seconds_per_update <= 0:
        raise ValueError(f"seconds_per_update={seconds_per_update} is invalid; expected a positive measured time.")
    left = seconds - checkpoints * seconds_per_checkpoint - validations * seconds_per_validation
    most = max(0, math.floor(left / seconds_per_update))
    if first_costs is None:
        return most
    low, high = 0, most  # the time of n updates grows with n: the largest n whose time fits
    while low < high:
        middle = (low + high + 1) // 2
        if middle * seconds_per_update + first_costs(middle) <= left:
            low = middle
        else:
            high = middle - 1
    return low


def decode_seconds(sentences: int, beams: int, seconds_per_update: float, tokens_per_update: int) -> float:
    """Predicted time to translate `sentences` with `beams` beams, from the time of an update of
    `tokens_per_update` tokens per side of the same model on the same machine."""
    per_token = seconds_per_update / tokens_per_update
    if beams <= 1:
        return sentences * DECODE_TOKENS_PER_SENTENCE[1] * per_token
    return sentences * DECODE_TOKENS_PER_SENTENCE[4] * max(1, beams) / 4 * per_token


def validation_loss_seconds(pairs: int, seconds_per_update: float, source_check: bool) -> float:
    """The loss passes of a validation over `pairs` pairs (batches of 64 pairs, each about a tenth of an update):
    the Trainer's, and with the source check (collapse.py) the real and the shuffled sources' again."""
    return (3 if source_check else 1) * pairs / 640 * seconds_per_update
