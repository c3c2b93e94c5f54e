"""The run's plan, a frozen value made once and read by the run (`planner.make_plan`).

A recipe that counts updates keeps its promise on one kind of machine only: the CPU recipe's 5,400 updates take
26 minutes on a Xeon with AMX in bf16 and 77 on an AVX2-only EPYC in fp32. With a budget the run instead

1. measures, before training, the time of a real update on a throwaway copy of the model, for each precision,
   attention implementation, batch size and model size the recipe leaves open (`calibration.py`, `measuring.py`),
   keeps the fastest precision and attention, and the largest batch and model that still reach `min_updates`, and
   adds what the Trainer's own loop costs beyond the measured update, timed on a short run of the real Trainer
   (`trainer_speed.py`);
2. fixes the number of updates that fits what is left of the budget once set-up so far, the checkpoints, the
   validation passes and the test decoding are paid for (`fitting.py`, `costs.py`, `clock.py`);
3. derives the §5.3 warmup, the learning rate, the checkpoint spacing and the validation cadence from that number
   (`schedule.py`), and records the plan in `budget.json`, in every checkpoint's trainer state and in
   `results.json` (`record.py`), so that a resumed run keeps it: a run is reproducible for a seed on a given machine.

A plan holds its decisions (`Choice`: what trains; `Schedule`: how long, at what rate, with what events), what was
predicted (`UpdateTime`, `Costs`), what was measured and why (`Record`) and its re-plans (`History`). It changes only
by making a new one (`BudgetPlan.but`: the re-plans of `replanning.py`). On disk it is one flat mapping of the names
below (`to_dict`, `from_dict`): `budget.json`, the checkpoints' and `results.json`'s "plan", as before the split.
The user's arguments are never changed: the Trainer gets a copy with the decisions (`applying.apply_plan`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from .costs import BudgetRules


@dataclass(frozen=True)
class Choice:
    """What trains (decided): the model size (None: the recipe's), the batch (`max_tokens` padded source and target
    tokens), the batches per update (None in plans recorded before it), the precision ("fp32", "bf16", and on CUDA
    "fp16" or "tf32": utils/device.py), the attention implementation, whether the step is compiled, and the dropout
    the run's predicted epochs ask for (None: the model's own; `schedule.dropout_for`), and the checkpoints they would
    average (None: the recipe's; `averaging.averaging_for`: the plan's time for the averaging, the end decides again
    on the epochs made, `finishing.averaging_of_run`)."""

    preset: str | None = None
    max_tokens: int | None = None
    gradient_accumulation_steps: int | None = None
    precision: str = "fp32"
    attn_implementation: str | None = None
    torch_compile: bool = False
    dropout: float | None = None
    average_last: int | None = None


@dataclass(frozen=True)
class Schedule:
    """How long and at what rate (decided): the updates, the §5.3 warmup, the checkpoint and validation spacing, the
    peak rate at the end of warmup and the factor on the §5.3 schedule (None in plans recorded before them)."""

    max_steps: int = 0
    warmup_steps: int = 1
    save_steps: int = 0
    eval_steps: int | None = None
    peak_learning_rate: float | None = None
    lr_scale: float | None = None


@dataclass(frozen=True)
class UpdateTime:
    """An update's time as predicted: the Trainer's seconds of an update of a shape met before (the calibration's
    update times `trainer_ratio`, what the real Trainer took over it on the run's batches), what a new batch shape
    and the first updates add, and the run's seconds per update with its new shapes paid."""

    seconds_per_update: float | None = None
    calibrated_seconds_per_update: float | None = None
    trainer_ratio: float = 1.0
    seconds_per_new_shape: float = 0.0
    once_seconds: float = 0.0
    predicted_seconds_per_update: float | None = None


@dataclass(frozen=True)
class Costs:
    """The run's other seconds as predicted: its training (updates, validation and checkpoints), the test decoding,
    one checkpoint and one validation (re-plans measure the last two); on a GPU, a decoding step's measured latency
    with the test's beams and greedy."""

    planned_training_seconds: float | None = None
    predicted_decode_seconds: float | None = None
    checkpoint_seconds: float | None = None
    validation_seconds: float | None = None
    decode_step_seconds: float = 0.0  # on a GPU, a decoding step's latency with the test's beams (0: a CPU)
    greedy_step_seconds: float = 0.0  # and greedy (the re-plans predict the decoding with them)


@dataclass(frozen=True)
class Record:
    """What the plan was made from: the budget (None: the length was given), every choice measured
    ("fp32/eager" -> seconds per update), the reasons in words, every (preset, batch size) calibrated in the recipe's
    order with its seconds per update (what a switch may choose: `replanning.better_candidate`), the Trainer's
    trial (its update, the calibration's on the same batches, the difference), and the recipe's rules that decided
    something in this plan (`{"rule": the recipe's value, "said": in words}`: the size, the dropout, a cut warmup,
    the averaging)."""

    max_minutes: float | None = None
    measured: dict[str, float] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)
    candidates: list[dict] = field(default_factory=list)
    trial: dict | None = None
    rules: list[dict] = field(default_factory=list)


@dataclass(frozen=True)
class History:
    """The plan's changes: each re-fit of the length from the run's own updates, and the choice a switch left."""

    replans: list[dict] = field(default_factory=list)
    switched_from: dict | None = None


PARTS = {"choice": Choice, "schedule": Schedule, "update": UpdateTime, "costs": Costs, "record": Record}
PARTS["history"] = History
# What every version of the package recorded of a plan: a mapping without them is no plan of a run.
RECORDED = ("max_steps", "warmup_steps", "save_steps", "eval_steps", "precision", "attn_implementation")
PART_OF = {item.name: part for part, kind in PARTS.items() for item in fields(kind)}  # a flat name -> its part


@dataclass(frozen=True)
class BudgetPlan:
    """A run's plan (see the module docstring): its decisions (`choice`, `schedule`), its predictions (`update`,
    `costs`), its `record` and its `history`."""

    choice: Choice
    schedule: Schedule
    update: UpdateTime = field(default_factory=UpdateTime)
    costs: Costs = field(default_factory=Costs)
    record: Record = field(default_factory=Record)
    history: History = field(default_factory=History)

    @classmethod
    def of(cls, **values) -> BudgetPlan:
        """The plan of flat `values` (the names of `to_dict`); a name no part holds is a TypeError."""
        unknown = sorted(set(values) - set(PART_OF))
        if unknown:
            raise TypeError(f"a plan holds no {', '.join(unknown)}; expected names among {sorted(PART_OF)}")
        grouped: dict[str, dict] = {part: {} for part in PARTS}
        for name, value in values.items():
            grouped[PART_OF[name]][name] = value
        return cls(**{part: PARTS[part](**grouped[part]) for part in PARTS})

    def but(self, **changes) -> BudgetPlan:
        """A new plan with the flat `changes` (as `of` names them); this one is left as it is."""
        return BudgetPlan.of(**{**self.to_dict(), **changes})

    def to_dict(self) -> dict:
        """The plan as one flat mapping (`budget.json`, a checkpoint's, `results.json`'s "plan")."""
        return {name: value for part in PARTS for name, value in asdict(getattr(self, part)).items()}

    @classmethod
    def from_dict(cls, data: dict) -> BudgetPlan:
        """The plan of a flat mapping (`to_dict`'s, or one recorded by an older version: names it lacks take their
        defaults, names it no longer has are left out); a ValueError where it lacks one of `RECORDED`, the names
        every version recorded."""
        missing = [name for name in RECORDED if name not in data]
        if missing:
            raise ValueError(f"a recorded plan lacks {', '.join(missing)}; expected every one of {', '.join(RECORDED)}")
        return cls.of(**{name: value for name, value in data.items() if name in PART_OF})

    def summary(self) -> str:
        """One line a person reads at the start of a run: what was chosen and why."""
        return "; ".join(self.record.reasons)


@dataclass(frozen=True)
class Budgeted:
    """A plan, and what its re-plans count with (`BudgetRules` of the chosen update; None where the length is not
    re-fitted: a given length, or a resumed run, which keeps the plan its checkpoint recorded)."""

    plan: BudgetPlan
    rules: BudgetRules | None = None
