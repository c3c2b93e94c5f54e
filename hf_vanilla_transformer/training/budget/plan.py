"""The run's plan, a value made once and read by the run: `make_plan` is the budget room's one entry point.

A recipe that counts updates keeps its promise on one kind of machine only: the CPU recipe's 5,400 updates take
26 minutes on a Xeon with AMX in bf16 and 77 on an AVX2-only EPYC in fp32. With a budget the run instead

1. measures, before training, the time of a real update on a throwaway copy of the model, for each precision,
   attention implementation, batch size and model size the recipe leaves open (`calibration.py`), keeps the
   fastest precision and attention, and the largest batch and model that still reach `min_updates`, and adds what
   the Trainer's own loop costs beyond the measured update, timed on a short run of the real Trainer
   (`trainer_speed.py`);
2. fixes the number of updates that fits what is left of the budget once set-up so far, the checkpoints, the
   validation passes and the test decoding are paid for (`planner.py`, `costs.py`, `clock.py`);
3. derives the §5.3 warmup, the learning rate, the checkpoint spacing and the validation cadence from that number
   (`schedule.py`), and records the plan in `budget.json`, in every checkpoint's trainer state and in
   `results.json` (`record.py`), so that a resumed run keeps it: a run is reproducible for a seed on a given machine.

The plan changes only by making a new one (`dataclasses.replace`: the re-plans of `replanning.py`). It never
changes the user's arguments: the Trainer gets a copy with the plan's values (`TransformerTrainingArguments.planned`, in `training/building.py`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .costs import BudgetRules


@dataclass
class BudgetPlan:
    """A run's length and what follows from it, with the reasons, as recorded in `budget.json`."""

    max_steps: int
    warmup_steps: int
    save_steps: int
    eval_steps: int | None
    precision: str  # "fp32", "bf16", and on CUDA "fp16" or "tf32" (device.py): what the run trains in
    attn_implementation: str | None
    max_tokens: int | None = None  # padded source (and target) tokens per batch
    preset: str | None = None  # the model size trained by a budgeted run (None: the recipe's preset)
    max_minutes: float | None = None  # None: the length was given (--max_steps)
    # The Trainer's seconds of an update of a shape met before, as predicted: the calibration's update
    # (`calibrated_seconds_per_update`) times what the real Trainer took over it on the run's batches (`trainer_ratio`).
    seconds_per_update: float | None = None
    planned_training_seconds: float | None = None  # updates, validation and checkpoints
    predicted_decode_seconds: float | None = None
    measured: dict[str, float] = field(default_factory=dict)  # "fp32/eager" -> seconds per update
    reasons: list[str] = field(default_factory=list)
    gradient_accumulation_steps: int | None = None  # batches per update (None in plans recorded before it)
    lr_scale: float | None = None  # the factor on the §5.3 schedule (None in plans recorded before it)
    checkpoint_seconds: float | None = None  # predicted for one checkpoint, one validation (re-plans measure them)
    validation_seconds: float | None = None
    replans: list[dict] = field(default_factory=list)  # each re-fit of the length from the run's own updates
    # Every (preset, batch size) calibrated, in the recipe's order of preference, with its seconds per update: what
    # the run may switch to when its own updates prove the calibration wrong (replanning.better_candidate).
    candidates: list[dict] = field(default_factory=list)
    switched_from: dict | None = None  # the choice a switch left, and why
    torch_compile: bool = False  # the training step compiled (measured on CUDA in long runs: calibration.py)
    seconds_per_new_shape: float = 0.0  # what the first update of each new batch shape adds (calibration.py)
    once_seconds: float = 0.0  # what the first updates add once beyond that (a compilation's first graphs)
    predicted_seconds_per_update: float | None = None  # the run's updates, new shapes paid, over their number
    peak_learning_rate: float | None = None  # the §5.3 peak, at the end of warmup
    calibrated_seconds_per_update: float | None = None  # the calibration's update, on a copy of the model
    trainer_ratio: float = 1.0  # the real Trainer's update over the calibration's (trainer_speed.py)
    trial: dict | None = None  # the Trainer's trial: its update, the calibration's on the same batches, the difference

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> BudgetPlan:
        known = {name: data[name] for name in cls.__dataclass_fields__ if name in data}
        return cls(**known)

    def summary(self) -> str:
        """One line a person reads at the start of a run: what was chosen and why."""
        return "; ".join(self.reasons)


@dataclass(frozen=True)
class Budgeted:
    """A plan, and what its re-plans count with (`BudgetRules` of the chosen update; None where the length is not
    re-fitted: a given length, or a resumed run, which keeps the plan its checkpoint recorded)."""

    plan: BudgetPlan
    rules: BudgetRules | None = None
