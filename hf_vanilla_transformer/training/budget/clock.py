"""The budget's clock: when the run started, how long it may take, and the one formula of the time left to train.

Every part of a budgeted run that asks how much time is left (the set-up's check, the plan, the ranking of the
calibration's times, the deadline, the re-plans, a switch to another choice) asks `BudgetClock.seconds_left`, with
the margins named here: what finishing the folder takes, what starting again costs, and the share of the rest that
is planned into (the noise of a shared machine).

What finishing takes is kept at `FINISHING_SECONDS` until the plan has measured a checkpoint of the model it chose;
from then on it is that model's own (`finishing_seconds`): the averaging reads its last checkpoints and the folder
writes it once more, each a part of a checkpoint's bytes, besides the plots, whose attention maps grow with the
model's layers and heads. On the 2-core Xeon the whole of it took 2.4-3.6 s for `small` and `compact` (3 layers of
4 heads) against 30 s kept (docs/budget_curve.md).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace


FINISHING_SECONDS = 30.0  # averaging, the model folder, plots and card: after the test decoding, where not measured
FOLDER_SECONDS = 10.0  # the folder's plots, card and tokenizer, and attention maps of up to ...
FOLDER_MAP_PANELS = 12  # ... 12 panels a map (layers x heads): 2.1-3.3 s measured for 3 x 4 on a 2-core Xeon
RESTART_SECONDS = 20.0  # what starting again with another choice costs (the data is cached): a model, a Trainer
SAFETY = 0.97  # of the training time left, planned into: the rest is for the noise of a shared machine


def finishing_seconds(
    checkpoint_seconds: float | None, average_last: int, map_panels: int = FOLDER_MAP_PANELS
) -> float:
    """The seconds kept after the test decoding for a model whose checkpoint (weights and an Adam state) took
    `checkpoint_seconds` to write and whose attention maps have `map_panels` panels (its layers times its heads):
    `FOLDER_SECONDS` for each `FOLDER_MAP_PANELS` panels (at least once), and one checkpoint's time for each of the
    `average_last` checkpoints the averaging reads and for the averaged model written, each about a third of a
    checkpoint's bytes (a stop at the deadline saves its checkpoint out of this too). `FINISHING_SECONDS` where no
    checkpoint was measured (None or 0: a run whose checkpoints are not spaced per run, a plan recorded before the
    plan measured them)."""
    if not checkpoint_seconds:
        return FINISHING_SECONDS
    folder = FOLDER_SECONDS * max(1.0, map_panels / FOLDER_MAP_PANELS)
    return folder + (max(1, average_last) + 1) * checkpoint_seconds


class BudgetError(ValueError):
    """A time budget that leaves no time to train on this machine; the message says how much set-up took."""


@dataclass(frozen=True)
class BudgetClock:
    """A run's budget of `seconds` (None: no budget), counted from `origin` on the monotonic clock `now`, with
    `finishing` seconds kept after the test decoding, and `final_check` more where a fine-tuning run measures its
    model again at the end."""

    origin: float
    seconds: float | None
    now: Callable[[], float] = field(default=time.monotonic, compare=False)
    finishing: float = FINISHING_SECONDS
    final_check: float = 0.0

    @classmethod
    def starting(cls, started: float, minutes: float | None) -> BudgetClock:
        """The clock of a budget of `minutes` that started at `started` (time.time(): a process's start, interpreter
        start-up included)."""
        origin = time.monotonic() - max(0.0, time.time() - started)
        return cls(origin, minutes * 60 if minutes is not None else None)

    def with_final_check(self, seconds: float) -> BudgetClock:
        """This clock with `seconds` more kept at the end: a fine-tuning run's second measurement of its model on the
        validation pairs (`training/start.py`)."""
        return replace(self, final_check=self.final_check + max(0.0, seconds))

    def with_finishing(self, seconds: float) -> BudgetClock:
        """This clock with `seconds` kept for the averaging and the folder (`finishing_seconds` of the model the plan
        chose) in place of `FINISHING_SECONDS`; a final check's seconds stay kept."""
        return replace(self, finishing=max(0.0, seconds))

    def spent(self) -> float:
        return self.now() - self.origin

    def seconds_left(self, decode_seconds: float = 0.0, restart: bool = False, planned: bool = False) -> float:
        """The training seconds left: the budget less what is spent, the test decoding still to come
        (`decode_seconds`), `finishing` and `final_check`, and for a run that starts again `RESTART_SECONDS` and at
        least `FINISHING_SECONDS`; with `planned`, the `SAFETY` share of that (never below 0) that a plan fills.
        Without a budget: infinite."""
        if self.seconds is None:
            return math.inf
        kept = self.finishing + self.final_check
        if restart:  # another model, unmeasured: the plan's margin before it had one (or this model's, if larger)
            kept += max(0.0, FINISHING_SECONDS - self.finishing) + RESTART_SECONDS
        left = self.seconds - self.spent() - decode_seconds - kept
        return max(0.0, left) * SAFETY if planned else left

    def check_measuring(self) -> None:
        """A BudgetError once measuring the update has left no time to train (`seconds_left`: the budget less what is
        spent and the finishing kept; called before each update it times):
        on a machine busy with another process every measured update is slower, and the budget is kept all the same;
        nothing where there is no budget."""
        if self.seconds is None or self.seconds_left() > 0:
            return
        raise BudgetError(
            f"max_minutes={self.seconds / 60:g} leaves no time to train on this machine: the budget was spent while "
            f"measuring the update ({self.spent() / 60:.1f} min in all; slower than the machine's own when another "
            "process is busy on it); give more minutes, or run it alone."
        )

    def check_setup(self, stages: dict) -> None:
        """A BudgetError once the set-up (`stages`: the set-up clock's, with their seconds; none at the run's start,
        before the corpus is read) has spent the whole budget, naming what it took: the planner would find no time
        left, but only after the rest of the set-up."""
        if self.seconds_left() > 0:
            return
        spent = self.spent() / 60
        if stages:
            took = ", ".join(f"{name} {facts['seconds']:.0f} s" for name, facts in stages.items())
            why = f"the set-up alone took {spent:.1f} min ({took}); give more minutes (the set-up is faster from the "
            why += "data cache)"
        else:
            why = f"{spent:.1f} min went before the set-up began; give more minutes"
        raise BudgetError(f"max_minutes={self.seconds / 60:g} leaves no time to train: {why}.")
