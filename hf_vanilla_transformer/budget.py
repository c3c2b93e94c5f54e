"""Training to a time budget (`--max_minutes`): measure an update on this machine, then fix the run's length.

A recipe that counts updates keeps its promise on one kind of machine only: the CPU recipe's 5,400 updates take
26 minutes on a Xeon with AMX in bf16 and 77 on an AVX2-only EPYC in fp32. With a budget the run instead

1. measures, before training, the time of a real update (forward, backward, Adam) on a throwaway copy of the
   model, for each precision and attention implementation the recipe leaves open (`precision: auto` tries bf16
   only where the CPU has bf16 matrix units; `attn_implementation: auto` tries eager and SDPA), and keeps the fastest;
2. fixes the number of updates that fits what is left of the budget once set-up so far, the checkpoints, the
   validation passes and the test decoding are paid for;
3. derives the §5.3 warmup, the checkpoint spacing and the validation cadence from that number (fractions of the
   run), and records the plan in `budget.json`, in every checkpoint's trainer state and in `results.json`, so that
   a resumed run keeps it: a run is reproducible for a seed on a given machine.

The calibration runs on a copy, so the run itself is exactly the one `--max_steps N` would give with the same N.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import statistics
import tempfile
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState


logger = logging.getLogger(__name__)

BUDGET_FILE = "budget.json"

# Decoding one test sentence with beam 4 costs about as much as training on this many tokens per side (an update's
# time divided by its tokens per batch): 1,152 sentences took 64 s at 0.86 s per 2,048-token update (EPYC, AVX2,
# fp32: 132 tokens), 75 s at 0.48 s per 1,024-token update (EPYC, fp32: 140), 22.4 s at 0.29 s per 2,048-token
# update (Xeon, AMX, bf16: 137); greedy validation about half. Rounded up for a margin.
DECODE_TOKENS_PER_SENTENCE = {1: 90, 4: 160}
# What the planner keeps back: Trainer's own work per update (collation, scheduler, logging, token counting, the
# first touches of memory in a new process), measured as real updates against the calibration's on the EPYC (fp32):
# 0.835 s against 0.75 s with 2,048-token batches, 0.51 s against 0.42 s with 1,024 (validation and checkpoints
# apart); and the averaging, plots and model card after training.
TRAINER_OVERHEAD = 1.15
FINISHING_SECONDS = 30.0
SAFETY = 0.97  # of the training time left, for the noise of a shared machine


def cpu_has_fast_bf16() -> bool:
    """True on CPUs with native bf16 matrix units (AMX or AVX512-BF16), where bf16 autocast may speed training up."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " amx_bf16" in flags or " avx512_bf16" in flags


@dataclass
class BudgetPlan:
    """A run's length and what follows from it, with the reasons, as recorded in `budget.json`."""

    max_steps: int
    warmup_steps: int
    save_steps: int
    eval_steps: int | None
    precision: str  # "bf16" or "fp32"
    attn_implementation: str | None
    max_tokens: int | None = None  # padded source (and target) tokens per batch
    max_minutes: float | None = None  # None: the length was given (--max_steps)
    seconds_per_update: float | None = None  # measured, for the chosen precision and attention
    planned_training_seconds: float | None = None  # updates, validation and checkpoints
    predicted_decode_seconds: float | None = None
    measured: dict[str, float] = field(default_factory=dict)  # "fp32/eager" -> seconds per update
    reasons: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> BudgetPlan:
        known = {name: data[name] for name in cls.__dataclass_fields__ if name in data}
        return cls(**known)

    def summary(self) -> str:
        """One line a person reads at the start of a run: what was chosen and why."""
        return "; ".join(self.reasons)


# ---------------------------------------------------------------------------------------------------------------------
# Arithmetic
# ---------------------------------------------------------------------------------------------------------------------


def warmup_for(max_steps: int, warmup: float, max_fraction: float | None = None) -> int:
    """Warmup updates: `warmup` itself when >= 1, else that fraction of the run; never more than `max_fraction` of
    the run where given; at least 1 update."""
    if warmup <= 0:
        raise ValueError(f"warmup_steps={warmup} is invalid; expected updates (>= 1) or a fraction of the run (0, 1).")
    updates = int(warmup) if warmup >= 1 else round(max_steps * warmup)
    if max_fraction is not None:
        if not 0 < max_fraction <= 1:
            raise ValueError(f"max_warmup_fraction={max_fraction} is invalid; expected a fraction in (0, 1].")
        updates = min(updates, round(max_steps * max_fraction))
    return max(1, updates)


def spacing_for(max_steps: int, per_run: int) -> int:
    """Updates between two of `per_run` evenly spaced events (checkpoints, validations) over `max_steps`."""
    if per_run < 1:
        raise ValueError(f"{per_run} events per run is invalid; expected at least 1.")
    return max(1, math.ceil(max_steps / per_run))


def updates_that_fit(
    seconds: float,
    seconds_per_update: float,
    checkpoints: int = 0,
    seconds_per_checkpoint: float = 0.0,
    validations: int = 0,
    seconds_per_validation: float = 0.0,
) -> int:
    """How many updates fit `seconds` of training, once `checkpoints` saves and `validations` passes are paid for
    (their number is fixed per run: their spacing grows with the run)."""
    if seconds_per_update <= 0:
        raise ValueError(f"seconds_per_update={seconds_per_update} is invalid; expected a positive measured time.")
    left = seconds - checkpoints * seconds_per_checkpoint - validations * seconds_per_validation
    return max(0, math.floor(left / seconds_per_update))


def decode_seconds(sentences: int, beams: int, seconds_per_update: float, tokens_per_update: int) -> float:
    """Predicted time to translate `sentences` with `beams` beams, from the time of an update of
    `tokens_per_update` tokens per side of the same model on the same machine."""
    per_token = seconds_per_update / tokens_per_update
    if beams <= 1:
        return sentences * DECODE_TOKENS_PER_SENTENCE[1] * per_token
    return sentences * DECODE_TOKENS_PER_SENTENCE[4] * max(1, beams) / 4 * per_token


def schedule_for(
    max_steps: int,
    warmup: float,
    checkpoints_per_run: int | None,
    evaluations_per_run: int | None,
    save_steps: float,
    eval_steps: float | None,
    max_warmup_fraction: float | None = None,
) -> tuple[int, int, int | None]:
    """(warmup, checkpoint spacing, validation spacing) for a run of `max_steps` updates: fractions of the run where
    the recipe gives them per run, else the fixed spacings given."""
    save = spacing_for(max_steps, checkpoints_per_run) if checkpoints_per_run else max(1, int(save_steps))
    if evaluations_per_run:
        evaluate = spacing_for(max_steps, evaluations_per_run)
        if checkpoints_per_run and evaluations_per_run <= checkpoints_per_run:
            evaluate = save * max(1, round(evaluate / save))  # validate where a checkpoint is saved
    else:
        evaluate = int(eval_steps) if eval_steps else None
    return warmup_for(max_steps, warmup, max_warmup_fraction), save, evaluate


# ---------------------------------------------------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------------------------------------------------


def calibration_batches(batches: list[list[int]], count: int) -> list[list[int]]:
    """`count` batches spread evenly over the sizes of `batches` (sorted by their number of pairs times their
    order): a sample whose mean update time is close to the epoch's, whatever the length distribution."""
    if len(batches) <= count:
        return list(batches)
    ranked = sorted(batches, key=len)
    return [ranked[round(i * (len(ranked) - 1) / (count - 1))] for i in range(count)] if count > 1 else ranked[:1]


def measure_updates(
    model: torch.nn.Module,
    batches: Iterable[dict],
    candidates: list[tuple[str, str | None]],
    learning_rate: float = 1e-5,
    warmup: int = 2,
    rounds: int = 2,
) -> dict[str, float]:
    """Mean seconds of an update (forward, backward, Adam step) for each (precision, attention) candidate, measured
    on copies of `model`, which is left untouched, as is the global random state. The candidates take turns over
    `rounds` rounds so that a change in the machine's load falls on all of them alike."""
    batches = list(batches)
    copies = {}
    for precision, attention in candidates:
        clone = copy.deepcopy(model).train()
        if attention:
            clone.set_attn_implementation(attention)
        optimizer = torch.optim.Adam(clone.parameters(), lr=learning_rate, betas=(0.9, 0.98), eps=1e-9)
        copies[(precision, attention)] = (clone, optimizer)
    times: dict[tuple[str, str | None], list[float]] = {key: [] for key in copies}
    with torch.random.fork_rng(devices=[]):
        for key, (clone, optimizer) in copies.items():  # the first updates of each copy allocate; not timed
            for batch in batches[:warmup]:
                _update(clone, optimizer, batch, key[0])
        per_round = max(1, math.ceil(len(batches) / rounds))
        for start in range(0, len(batches), per_round):
            for key, (clone, optimizer) in copies.items():
                for batch in batches[start : start + per_round]:
                    began = time.perf_counter()
                    _update(clone, optimizer, batch, key[0])
                    times[key].append(time.perf_counter() - began)
    return {
        f"{precision}/{attention or 'default'}": statistics.fmean(times[(precision, attention)])
        for precision, attention in candidates
    }


def _update(model, optimizer, batch: dict, precision: str) -> None:
    device_type = next(model.parameters()).device.type
    with torch.autocast(device_type, dtype=torch.bfloat16, enabled=precision == "bf16"):
        loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def measure_checkpoint_seconds(model: torch.nn.Module) -> float:
    """Seconds to write the model and an Adam state of its size, as a checkpoint does."""
    state = {name: (torch.zeros_like(p), torch.zeros_like(p)) for name, p in model.named_parameters()}
    with tempfile.TemporaryDirectory() as folder:
        began = time.perf_counter()
        model.save_pretrained(folder)
        torch.save(state, os.path.join(folder, "optimizer.pt"))
        return time.perf_counter() - began


# ---------------------------------------------------------------------------------------------------------------------
# Recording and keeping the plan
# ---------------------------------------------------------------------------------------------------------------------


class TimeBudgetCallback(TrainerCallback, ExportableState):
    """Carries the plan into every checkpoint's trainer state, and stops a budgeted run at its deadline should the
    machine turn slower than it measured (another job started beside it): the run then ends early, saved, rather
    than late. A resumed run has no deadline (its budget was spent by the interrupted one)."""

    def __init__(self, plan: dict, deadline_seconds: float | None = None):
        self.plan = plan
        self.deadline = time.monotonic() + deadline_seconds if deadline_seconds else None
        self.stopped_early_at: int | None = None

    def state(self) -> dict:
        return {"args": {"plan": self.plan}, "attributes": {}}

    def on_step_end(self, args, state, control, **kwargs):
        if self.deadline is None or state.global_step >= state.max_steps:
            return control
        due = time.monotonic() >= self.deadline
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            flag = torch.tensor([int(due)], device=args.device)
            torch.distributed.broadcast(flag, src=0)  # the main process decides: every process stops at one update
            due = bool(flag.item())
        if due:
            self.stopped_early_at = state.global_step
            logger.warning(
                "the time budget's deadline passed at update %d of %d (the machine is slower than it measured): "
                "stopping here and saving",
                state.global_step,
                state.max_steps,
            )
            control.should_training_stop = True
            control.should_save = True
        return control


def recorded_plan(output_dir: str | Path, checkpoint: str | Path | None) -> BudgetPlan | None:
    """The plan of an interrupted run: from the checkpoint it resumes from, else from the run's `budget.json`."""
    if checkpoint is not None:
        state_file = Path(checkpoint) / "trainer_state.json"
        if state_file.exists():
            state = json.loads(state_file.read_text(encoding="utf-8"))
            saved = state.get("stateful_callbacks", {}).get(TimeBudgetCallback.__name__)
            if isinstance(saved, list):  # several instances are saved as a list
                saved = saved[0] if saved else None
            if saved:
                return BudgetPlan.from_dict(saved["args"]["plan"])
    budget_file = Path(output_dir) / BUDGET_FILE
    if budget_file.exists():
        return BudgetPlan.from_dict(json.loads(budget_file.read_text(encoding="utf-8")))
    return None
