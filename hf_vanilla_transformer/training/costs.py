"""What the parts of a budgeted run cost, from the time of an update measured on the machine: the test decoding,
a validation's loss passes, and how many updates fit the time left once those and the first update of each new batch
shape are paid for. The planner (`planning.py`) and the re-planning from the run's own updates (`replanning.py`)
count with the same figures."""

from __future__ import annotations

import math
from collections.abc import Callable


# One model of what decoding costs, for the plan and its re-plans. A greedy sentence costs about as much as training
# on this many tokens per side (an update's time over its tokens per batch): 12.7 ms a sentence at 0.26 s per
# 1,024-token update on a 2-core Xeon without AMX in fp32 (50), 14.7 ms at 0.37 s per 2,048-token update on a Zen 5
# EPYC in bf16 (81).
GREEDY_TOKENS_PER_SENTENCE = 47
# A sentence with 4 beams, against a greedy one, as the main job meets it (the choice of alpha and the test split,
# 1,752 beam-4 sentences, against the run's last validation): 2.33 and 2.88 on the Xeon (2026-11-25; 51.7 s and
# 63.8 s); 1.7 on the Zen 5 (2026-11-26; 43.5 s). Beam 4 from greedy's 47 tokens: 141, as 1,152 test sentences
# measured from the update's time (132 and 140 on EPYCs in fp32, 137 on a Xeon with AMX in bf16, 94 on a slower EPYC).
# Above the largest: a prediction too long ends a run a few seconds early, one too short ends it late.
BEAM4_PER_GREEDY = 3.0


def decode_cost(beams: int) -> float:
    """What a sentence decoded with `beams` beams costs, in greedy sentences."""
    return 1.0 if beams <= 1 else BEAM4_PER_GREEDY * beams / 4


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
    greedy = GREEDY_TOKENS_PER_SENTENCE * seconds_per_update / tokens_per_update
    return sentences * greedy * decode_cost(beams)


def validation_loss_seconds(pairs: int, seconds_per_update: float, source_check: bool) -> float:
    """The loss passes of a validation over `pairs` pairs (batches of 64 pairs, each about a tenth of an update):
    the Trainer's, and with the source check (collapse.py) the real and the shuffled sources' again."""
    return (3 if source_check else 1) * pairs / 640 * seconds_per_update
