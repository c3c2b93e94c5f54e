"""What the parts of a budgeted run cost, from the time of an update measured on the machine: the test decoding, a
validation's passes, the first update of each new batch shape, and how many updates fit the time left once those are
paid for. The plan (`plan.py`) and its re-plans (`replanning.py`) count with the same figures (`BudgetRules`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from ...data.batching import evaluation_batches, inference_batches
from .schedule import EventRule


if TYPE_CHECKING:
    from .calibration import Timing


# One model of what decoding costs, for the plan and its re-plans. A greedy sentence costs about as much as training
# on this many tokens per side (an update's time over its tokens per batch): 12.7 ms a sentence at 0.26 s per
# 1,024-token update on a 2-core Xeon without AMX in fp32 (50), 14.7 ms at 0.37 s per 2,048-token update on a Zen 5
# EPYC in bf16 (81).
GREEDY_TOKENS_PER_SENTENCE = 47
# A sentence with 4 beams, against a greedy one, as the main job meets it (the choice of alpha and the test split,
# 1,752 beam-4 sentences when these were measured and the choice decoded once per alpha, 1,352 since it is one
# search: `planner.alpha_searches`; against the run's last validation): 2.33 and 2.88 on the Xeon (2026-11-25; 51.7 s
# and 63.8 s); 1.7 on the Zen 5 (2026-11-26; 43.5 s). Beam 4 from greedy's 47 tokens: 141, as 1,152 test sentences
# measured from the update's time (132 and 140 on EPYCs in fp32, 137 on a Xeon with AMX in bf16, 94 on a slower EPYC).
# Above the largest: a prediction too long ends a run a few seconds early, one too short ends it late.
BEAM4_PER_GREEDY = 3.0


# A target about this much longer than its source: how long a batch decodes, from its longest source.
TARGET_PER_SOURCE = 1.1


def decode_cost(beams: int) -> float:
    """What a sentence decoded with `beams` beams costs, in greedy sentences (on a CPU, where decoding is bound by
    the work of its matrix products)."""
    return 1.0 if beams <= 1 else BEAM4_PER_GREEDY * beams / 4


def decoding_steps(lengths: list[int], max_tokens: int = 4000, max_sentences: int = 128) -> int:
    """The decoding steps of translating sentences of `lengths` source tokens as `translate()` batches them (longest
    first, at most `max_tokens` padded tokens and `max_sentences` a batch): each batch runs until its longest target,
    about `TARGET_PER_SOURCE` of its longest source. On a GPU, where a step's time hardly depends on its batch,
    decoding costs these steps times a step's latency."""
    return batches_steps(inference_batches(lengths, max_tokens, max_sentences), lengths)


def validation_decoding_steps(lengths: list[int], sentences_per_batch: int, world_size: int = 1) -> int:
    """The decoding steps of a validation of sentences of `lengths` source tokens, batched as the Trainer's validation
    batches them (`evaluation_batches`, `sentences_per_batch` sentences of the mean length a batch), in the process
    with the most of them where `world_size` processes share the batches (accelerate gives each every N-th). A
    model that has learned where a sentence ends is assumed, as for the test; an untrained one decodes each batch to
    its length limit, which the re-plans meet as the validation's measured pause."""
    if not lengths:
        return 0
    batches = list(evaluation_batches(lengths, sentences_per_batch))
    return max(batches_steps(batches[rank::world_size], lengths) for rank in range(max(1, world_size)))


def batches_steps(batches, lengths: list[int]) -> int:
    """The steps of decoding `batches` (lists of indices into `lengths`): each runs until its longest target."""
    return sum(math.ceil(TARGET_PER_SOURCE * max(lengths[i] for i in batch)) + 1 for batch in batches)


def decode_seconds(sentences: int, beams: int, seconds_per_update: float, tokens_per_update: int) -> float:
    """Predicted time to translate `sentences` with `beams` beams, from the time of an update of
    `tokens_per_update` tokens per side of the same model on the same machine."""
    greedy = GREEDY_TOKENS_PER_SENTENCE * seconds_per_update / tokens_per_update
    return sentences * greedy * decode_cost(beams)


def validation_loss_seconds(pairs: int, seconds_per_update: float, source_check: bool) -> float:
    """The loss passes of a validation over `pairs` pairs (batches of 64 pairs, each about a tenth of an update):
    the Trainer's, and with the source check (collapse.py) the real and the shuffled sources' again."""
    return (3 if source_check else 1) * pairs / 640 * seconds_per_update


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


STEPS_MARGIN = 1.1  # a trained model's longest translation in a batch over the batch's longest reference, about
# A validation whose translations stop before half their references' length (a model that has not begun to
# translate ends each at once: on the 2-core Zen 3, 10 steps where the references take 293, at update 44 of a
# 6-minute run) says nothing of the trained model's decoding: scaled up by its steps, its seconds predicted a test
# decoding of 24 minutes and the run stopped at 45 of its 258 updates (2026-12-02).
FEWEST_STEPS = 0.5


def decoding_steps_ratio(metrics: dict, prefix: str = "eval") -> float | None:
    """The decoding steps a validation would have taken with translations about as long as their references, over
    those it took (the Trainer's `<prefix>_reference_steps` and `_decoding_steps`), or None where not counted; 0
    where its translations stopped short of `FEWEST_STEPS` of their references' (nothing to predict from)."""
    taken, reference = metrics.get(f"{prefix}_decoding_steps"), metrics.get(f"{prefix}_reference_steps")
    if not taken or not reference:
        return None
    if taken < FEWEST_STEPS * reference:
        return 0.0
    return STEPS_MARGIN * reference / taken


@dataclass(frozen=True)
class HeldOut:
    """The held-out work a budgeted run predicts: the validation pairs and the sentences decoded after training (the
    test pairs, and the validation pairs once for the choice of alpha: `planner.alpha_searches`), the beams of each,
    and whether a validation runs the source check's two more loss passes."""

    validation_pairs: int = 0
    test_sentences: int = 0
    test_beams: int = 4
    validation_beams: int = 1
    source_check: bool = False


@dataclass(frozen=True)
class DecodeSteps:
    """On a GPU, decoding is bound by the latency of its steps: the steps of the test decoding (and the choice of
    alpha) and of a validation's, and a step's seconds with the test's beams and greedy, measured there (0: a CPU's
    throughput model), and the batch a step is measured on."""

    test_steps: int = 0
    validation_steps: int = 0
    step_seconds: float = 0.0
    greedy_step_seconds: float = 0.0
    batch: dict | None = field(default=None, compare=False)  # the test's median batch a step is measured on


@dataclass(frozen=True)
class ReplanRoom:
    """What a planned run re-plans within: the most updates (`max_updates`; None: no bound), the update of its first
    check, its batches per update, and the distinct batch shapes met among so many batches (`shapes_met`; None: not
    counted)."""

    max_updates: int | None = None
    first_check: int = 200
    accumulation: int = 1
    shapes_met: Callable[[int], float] | None = None


@dataclass(frozen=True)
class BudgetRules:
    """What a budgeted run counts with beside an update's time: its events (`EventRule`) and whether it validates,
    the held-out work to predict (`HeldOut`), a GPU's decoding steps (`DecodeSteps`), the updates a choice must reach
    and the epoch cap; and, once planned, the room it re-plans within (`ReplanRoom`)."""

    events: EventRule
    validates: bool
    held_out: HeldOut = HeldOut()
    steps: DecodeSteps = DecodeSteps()
    room: ReplanRoom = ReplanRoom()
    min_updates: int | None = None
    max_epochs: float | None = None
    # Sizes that need more updates than `min_updates` before the plan takes them (the recipe's `size_min_updates`).
    size_min_updates: tuple[tuple[str, int], ...] = ()

    def least_updates(self, preset: str | None) -> int | None:
        """The updates model size `preset` must reach to be chosen: its own where `size_min_updates` names it, else
        `min_updates`."""
        return dict(self.size_min_updates).get(preset, self.min_updates)

    def for_size(self, preset: str | None) -> BudgetRules:
        """These rules as they judge model size `preset` (`least_updates` as its `min_updates`)."""
        return replace(self, min_updates=self.least_updates(preset))

    @property
    def checkpoints(self) -> int:
        return self.events.checkpoints_per_run or 0

    @property
    def validations(self) -> int:
        return (self.events.evaluations_per_run or 0) if self.validates else 0

    def test_decode_seconds(self, seconds_per_update: float, tokens_per_update: int) -> float:
        """The test decoding (with the choice of alpha) predicted from an update's time, or from the latency of a
        decoding step where that is measured and longer (a GPU)."""
        held_out, steps = self.held_out, self.steps
        throughput = decode_seconds(held_out.test_sentences, held_out.test_beams, seconds_per_update, tokens_per_update)
        return max(throughput, steps.test_steps * steps.step_seconds)

    @property
    def beam_cost(self) -> float:
        """What a sentence decoded with the test's beams costs against one decoded with the validation's: the ratio
        of their measured steps where measured (a GPU), else of `decode_cost`."""
        steps, held_out = self.steps, self.held_out
        if steps.step_seconds and steps.greedy_step_seconds and held_out.validation_beams <= 1:
            return steps.step_seconds / steps.greedy_step_seconds
        return decode_cost(held_out.test_beams) / decode_cost(held_out.validation_beams)

    def validation_seconds(self, seconds_per_update: float, tokens_per_update: int) -> float:
        """One validation (its decoding and its loss passes) predicted from an update's time, its decoding from the
        latency of a decoding step where that is measured and longer (a GPU, where an update's time put 500
        validation pairs at 0.2 s); 0 where none come."""
        if not self.validations:
            return 0.0
        pairs = self.held_out.validation_pairs
        decoding = decode_seconds(pairs, self.held_out.validation_beams, seconds_per_update, tokens_per_update)
        decoding = max(decoding, self.steps.validation_steps * self.validation_step_seconds)
        return decoding + validation_loss_seconds(pairs, seconds_per_update, self.held_out.source_check)

    @property
    def validation_step_seconds(self) -> float:
        """A validation's decoding step, from the measured greedy step and the step with the test's beams: the one
        measured where the validation's beams are those, else between them in proportion to the beams."""
        greedy, step = self.steps.greedy_step_seconds, self.steps.step_seconds
        beams, test_beams = self.held_out.validation_beams, self.held_out.test_beams
        if beams <= 1 or test_beams <= 1:
            return greedy if beams <= 1 else max(greedy, step)
        return greedy + (step - greedy) * (beams - 1) / (test_beams - 1)

    def predicted_decode_seconds(
        self,
        validation_seconds: float,
        seconds_per_update: float,
        source_check_seconds: float | None = None,
        prediction_seconds: float | None = None,
        steps_ratio: float | None = None,
    ) -> float:
        """The test decoding (and the choice of alpha) predicted from a validation pass on this machine: its
        decoding of `validation_pairs` pairs with `validation_beams` beams, scaled to `test_sentences` decoded with
        `test_beams` beams by their relative cost per sentence (`beam_cost`). The decoding is the Trainer's
        prediction steps less their loss (`prediction_seconds`, where measured; a loss pass costs about one of the
        source check's two), else the whole pass less its loss passes. `steps_ratio` (`decoding_steps_ratio`) scales
        the validation's decoding to that of translations about as long as their references, as the trained model's
        test decoding will be: an early validation's model decodes every batch to its length limit (on the H100 a
        3.5-minute run re-planned from 1,715 to 524 updates after its first validation, and ended with a third of
        its budget unused)."""
        held_out = self.held_out
        if prediction_seconds is not None and source_check_seconds is not None:
            decoding = prediction_seconds - 0.5 * source_check_seconds
        elif source_check_seconds is not None:
            decoding = validation_seconds - 1.5 * source_check_seconds
        else:
            decoding = validation_seconds - validation_loss_seconds(
                held_out.validation_pairs, seconds_per_update, held_out.source_check
            )
        per_sentence = max(0.0, decoding) / max(1, held_out.validation_pairs) * (steps_ratio or 1.0)
        return held_out.test_sentences * per_sentence * self.beam_cost


@dataclass(frozen=True)
class FitSeconds:
    """The seconds a fit plans and predicts: its training (updates, new shapes, checkpoints, validations), the test
    decoding, one checkpoint and one validation."""

    training: float
    decode: float
    checkpoint: float = 0.0
    validation: float = 0.0


@dataclass(frozen=True)
class BudgetFit:
    """How a measured update time fits the budget: the batch size, the updates, an update's timing, the seconds
    planned and predicted, the reason in words, and whether the updates reach the recipe's `min_updates`
    (`enough`)."""

    max_tokens: int
    max_steps: int
    timing: Timing  # of one update (accumulation and the Trainer's own work included)
    seconds: FitSeconds
    reason: str
    enough: bool
