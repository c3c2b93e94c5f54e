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

from .batching import accumulation_steps


logger = logging.getLogger(__name__)

BUDGET_FILE = "budget.json"

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
    preset: str | None = None  # the model size chosen from preset_choices (None: the recipe's preset)
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
# Planning a run
# ---------------------------------------------------------------------------------------------------------------------


def updates_per_epoch(sampler, accumulation: int, world_size: int) -> int:
    return max(1, math.ceil(len(sampler) / (accumulation * max(1, world_size))))


def token_choices(recipe) -> list[int]:
    """The batch sizes (max_tokens) the planner may choose from, largest first."""
    if not recipe.max_tokens_choices:
        return [recipe.max_tokens]
    try:
        choices = sorted({int(value) for value in recipe.max_tokens_choices.split(",")}, reverse=True)
    except ValueError:
        choices = []
    if not choices or min(choices) < 1:
        raise ValueError(
            f"max_tokens_choices={recipe.max_tokens_choices!r} is invalid; expected positive token counts such as "
            "'2048,1024'."
        )
    return choices


def preset_choices(recipe) -> list[str]:
    """The model sizes the planner may choose from, largest first: `preset_choices` where the run's preset is their
    first (the recipe's own), else the run's preset alone (`--preset tiny` over the CPU recipe trains tiny)."""
    from .configuration_vanilla_transformer import PRESETS

    if not recipe.preset_choices:
        return [recipe.preset]
    choices = [name.strip() for name in recipe.preset_choices.split(",") if name.strip()]
    unknown = [name for name in choices if name not in PRESETS]
    if not choices or unknown:
        raise ValueError(
            f"preset_choices={recipe.preset_choices!r} is invalid; expected presets from {sorted(PRESETS)} "
            "separated by commas, largest first, such as 'small,compact'."
        )
    if recipe.model_name_or_path:
        raise ValueError(
            f"preset_choices={recipe.preset_choices!r} cannot apply to the saved model {recipe.model_name_or_path!r}; "
            "give one or the other."
        )
    return choices if choices[0] == recipe.preset else [recipe.preset]


def _candidates(recipe, args) -> tuple[list[str], list[str | None]]:
    """The precisions and attention implementations to measure (one each where the recipe fixed them)."""
    if recipe.precision == "auto":
        on_cpu = args.use_cpu or not torch.cuda.is_available()
        precisions = ["fp32", "bf16"] if (cpu_has_fast_bf16() or not on_cpu) else ["fp32"]
    else:
        precisions = [recipe.precision or ("bf16" if args.bf16 else "fp32")]
    attentions = ["eager", "sdpa"] if recipe.attn_implementation == "auto" else [recipe.attn_implementation]
    return precisions, attentions


def accumulation_for(recipe, args, max_tokens: int) -> int:
    """Batches per update: the given gradient accumulation, or more where `tokens_per_update` asks for it."""
    return max(
        args.gradient_accumulation_steps, accumulation_steps(recipe.tokens_per_update, max_tokens, args.world_size)
    )


def new_plan(
    recipe, args, model, train, batches_of, collator, evaluation, test_pairs, started, budgeted, build=None
) -> BudgetPlan:
    """A new plan for the run described by `recipe` and `args` (the two argument dataclasses of training.py):
    measured where the budget or an `auto` choice asks for it, then its length and schedule. `batches_of(max_tokens)`
    gives the training batch sampler of a batch size; `build(preset)` a new model of another preset, to measure
    the recipe's `preset_choices` (the model of each is thrown away)."""
    sizes = token_choices(recipe) if budgeted else [recipe.max_tokens]
    presets = preset_choices(recipe) if budgeted and build is not None else [recipe.preset]
    training_seconds = decode = chosen_preset = fixed = None
    measured, reasons = {}, []
    for index, preset in enumerate(presets):
        candidate = model if preset == recipe.preset else build(preset)
        # 1. Precision, attention and the time of a batch at each allowed size (measured, or as given); a smaller
        #    preset keeps the precision and attention measured on the first.
        precision, attention, per_size, measured_here, reasons_here = _measure_choices(
            recipe, args, candidate, train, batches_of, collator, sizes, measure_all=budgeted, fixed=fixed
        )
        fixed = (precision, attention)
        prefix = f"{preset}/" if len(presets) > 1 else ""
        measured.update({prefix + name: seconds for name, seconds in measured_here.items()})
        reasons = reasons or reasons_here
        if not budgeted:
            break
        # 2. The number of updates (and the batch size): what fits the budget.
        max_tokens, max_steps, seconds_per_update, training_seconds, decode, reason, enough = _fit_budget(
            recipe, args, candidate, batches_of, evaluation, test_pairs, sizes, per_size, started
        )
        if enough or index == len(presets) - 1:
            if len(presets) > 1:
                chosen_preset = preset
                rule = "the largest that gives" if enough else "none gives"
                reason = (
                    f"the {preset} model ({', '.join(presets)}: {rule} {recipe.min_updates or 0:,} updates); {reason}"
                )
            reasons.append(reason)
            break
    if not budgeted:
        max_tokens = sizes[0]
        seconds_per_update = per_size.get(max_tokens)
        per_epoch = updates_per_epoch(
            batches_of(max_tokens), accumulation_for(recipe, args, max_tokens), args.world_size
        )
        max_steps = args.max_steps if args.max_steps > 0 else math.ceil(args.num_train_epochs * per_epoch)
        reasons.append(f"{max_steps:,} updates as given")
    if max_steps < 1:
        raise ValueError(
            f"max_minutes={recipe.max_minutes} leaves no time to train on this machine (set-up took "
            f"{(time.time() - started) / 60:.1f} min, an update {seconds_per_update:.2f} s); give more minutes."
        )
    # 3. The schedule follows from the length.
    warmup, save, evaluate = schedule_for(
        max_steps,
        args.warmup_steps,
        recipe.checkpoints_per_run,
        recipe.evaluations_per_run,
        args.save_steps,
        args.eval_steps,
        max_warmup_fraction=recipe.max_warmup_fraction,
    )
    cadence = f"warmup {warmup:,} updates, a checkpoint every {save:,}"
    if args.eval_strategy == "steps" and evaluate:
        cadence += f", validation every {evaluate:,}"
    reasons.append(cadence)
    return BudgetPlan(
        max_steps=max_steps,
        warmup_steps=warmup,
        save_steps=save,
        eval_steps=evaluate,
        precision=precision,
        attn_implementation=attention,
        max_tokens=max_tokens,
        preset=chosen_preset,
        max_minutes=recipe.max_minutes if budgeted else None,
        seconds_per_update=seconds_per_update,
        planned_training_seconds=training_seconds,
        predicted_decode_seconds=decode,
        measured=measured,
        reasons=reasons,
    )


def _measure_choices(recipe, args, model, train, batches_of, collator, sizes, measure_all, fixed=None):
    """(precision, attention, {max_tokens: seconds per batch}, measurements, reasons). Every precision and
    attention the recipe leaves open (one pair where `fixed` gives it) is measured on real batches of the largest
    size (on copies of the model), then the fastest at the other sizes; nothing is measured where nothing is open
    and no budget asks for a time."""
    precisions, attentions = ([fixed[0]], [fixed[1]]) if fixed else _candidates(recipe, args)
    if not measure_all and len(precisions) * len(attentions) == 1:
        return precisions[0], attentions[0], {}, {}, []
    device = torch.device("cuda") if torch.cuda.is_available() and not args.use_cpu else torch.device("cpu")

    def measure(max_tokens: int, candidates: list[tuple[str, str | None]]) -> dict[str, float]:
        chosen = calibration_batches(list(iter(batches_of(max_tokens))), count=12)
        batches = [collator([{k: train[i][k] for k in ("input_ids", "labels")} for i in batch]) for batch in chosen]
        batches = [{k: v.to(device) for k, v in batch.items()} for batch in batches]
        return measure_updates(model.to(device), batches, candidates)

    candidates = [(p, a) for p in precisions for a in attentions]
    first = measure(sizes[0], candidates)
    (precision, attention), fastest = min(
        ((c, first[f"{c[0]}/{c[1] or 'default'}"]) for c in candidates), key=lambda item: item[1]
    )
    reasons = _choice_reasons(recipe, precisions, attentions, first, precision, attention)
    key = f"{precision}/{attention or 'default'}"
    per_size = {sizes[0]: fastest}
    for size in sizes[1:]:
        per_size[size] = measure(size, [(precision, attention)])[key]
    measured = {f"{name}@{sizes[0]}": value for name, value in first.items()}
    measured.update({f"{key}@{size}": per_size[size] for size in sizes[1:]})
    return precision, attention, per_size, measured, reasons


def _fit_budget(recipe, args, model, batches_of, evaluation, test_pairs, sizes, per_size, started):
    """(max_tokens, updates, seconds per update, planned training seconds, predicted decoding seconds, reason,
    enough): the largest batch size that still gives `min_updates` updates in the budget (enough), else the
    smallest."""
    checkpoint_seconds = measure_checkpoint_seconds(model) if recipe.checkpoints_per_run else 0.0
    for max_tokens in sizes:
        accumulation = accumulation_for(recipe, args, max_tokens)
        seconds_per_update = per_size[max_tokens] * accumulation
        per_epoch = updates_per_epoch(batches_of(max_tokens), accumulation, args.world_size)
        max_steps, training_seconds, decode, reason = _updates_for_budget(
            recipe,
            args,
            evaluation,
            test_pairs,
            per_epoch,
            seconds_per_update,
            max_tokens * accumulation,
            checkpoint_seconds,
            started,
        )
        enough = recipe.min_updates is None or max_steps >= recipe.min_updates
        if enough:
            break
    if len(sizes) > 1:
        listed = ", ".join(map(str, sizes))
        reason += f"; batches of {max_tokens:,} tokens per side (of {listed}: " + (
            f"the largest that gives {recipe.min_updates:,} updates)"
            if enough
            else f"none gives {recipe.min_updates or 0:,} updates here)"
        )
    return max_tokens, max_steps, seconds_per_update, training_seconds, decode, reason, enough


def _choice_reasons(recipe, precisions, attentions, measured, precision, attention) -> list[str]:
    def seconds(p, a):
        return measured[f"{p}/{a or 'default'}"]

    reasons = []
    if recipe.precision == "auto" and len(precisions) == 1:
        reasons.append("fp32: no bf16 matrix units in this CPU (AMX or AVX512-BF16)")
    elif len(precisions) > 1:
        other = next(p for p in precisions if p != precision)
        reasons.append(
            f"{precision}: {seconds(precision, attention):.2f} s per update against "
            f"{seconds(other, attention):.2f} s in {other}"
        )
    else:
        reasons.append(f"{precision} as given")
    if len(attentions) > 1:
        other = next(a for a in attentions if a != attention)
        reasons.append(
            f"{attention} attention: {seconds(precision, attention):.2f} s per update against "
            f"{seconds(precision, other):.2f} s with {other}"
        )
    return reasons


def _updates_for_budget(
    recipe, args, evaluation, test_pairs, per_epoch, seconds_per_update, tokens, checkpoint_seconds, started
):
    """(updates, planned training seconds, predicted test decoding seconds, the reason in words), for updates of
    `tokens` padded tokens per side and process."""
    update = seconds_per_update * TRAINER_OVERHEAD
    decode = decode_seconds(test_pairs, recipe.test_beams, update, tokens)
    from .arguments import length_penalty_choices  # (arguments.py imports this module)

    alphas = len(length_penalty_choices(recipe)) if evaluation is not None else 0
    decode += alphas * decode_seconds(len(evaluation), recipe.test_beams, update, tokens) if alphas else 0.0
    checkpoints = recipe.checkpoints_per_run or 0
    validates = args.eval_strategy == "steps" and evaluation is not None
    validations = (recipe.evaluations_per_run or 0) if validates else 0
    # A validation pass: greedy decoding of its pairs, and their loss (batches of 64 pairs, ~1/10 of an update each).
    validation_seconds = (
        decode_seconds(len(evaluation), args.generation_num_beams or 1, update, tokens) + len(evaluation) / 640 * update
        if validations
        else 0.0
    )
    spent = time.time() - started
    budget = recipe.max_minutes * 60
    left = (budget - spent - decode - FINISHING_SECONDS) * SAFETY
    fit = updates_that_fit(left, update, checkpoints, checkpoint_seconds, validations, validation_seconds)
    with_alpha = ", with the choice of alpha" if alphas else ""
    reason = (
        f"{fit:,} updates fit {left / 60:.1f} training minutes of the {recipe.max_minutes:g}-minute budget "
        f"({update:.2f} s each; set-up so far {spent / 60:.1f} min, test decoding {decode / 60:.1f} min predicted{with_alpha})"
    )
    if recipe.max_epochs is not None and fit > recipe.max_epochs * per_epoch:
        fit = max(1, math.floor(recipe.max_epochs * per_epoch))
        reason += f"; capped at {fit:,} = {recipe.max_epochs:g} epochs of this corpus"
    training = fit * update + checkpoints * checkpoint_seconds + validations * validation_seconds
    return fit, training, decode, reason


def apply_plan(plan: BudgetPlan, recipe, args, model) -> None:
    """Set the run's length, schedule, precision and attention from `plan`, and the §5.3 learning rate."""
    nominal_warmup = args.warmup_steps
    args.max_steps = plan.max_steps
    if plan.max_tokens:
        recipe.max_tokens = plan.max_tokens
    args.warmup_steps = plan.warmup_steps
    args.save_steps = plan.save_steps
    if plan.eval_steps:
        args.eval_steps = plan.eval_steps
    args.bf16 = plan.precision == "bf16"
    args.mixed_precision = "bf16" if args.bf16 else ("fp16" if args.fp16 else "no")
    if plan.attn_implementation:
        model.set_attn_implementation(plan.attn_implementation)
    # The §5.3 schedule: peak lr_scale * d_model^-0.5 * warmup^-0.5 at the end of warmup. A recipe that names its
    # peak gets the lr_scale that reaches it; where a short run cut the warmup (max_warmup_fraction), the rate climbs
    # the same ramp and peaks lower: a post-LN model needs the ramp (warmup 308 to the full peak stalled at loss 4.7
    # on the CPU recipe, docs/cpu_recipe.md).
    if recipe.peak_learning_rate is not None:
        peak = recipe.peak_learning_rate
        if nominal_warmup >= 1 and plan.warmup_steps < nominal_warmup:
            peak *= plan.warmup_steps / nominal_warmup
        recipe.lr_scale = peak * (model.config.d_model * plan.warmup_steps) ** 0.5
    args.learning_rate = recipe.lr_scale * model.config.d_model**-0.5


# ---------------------------------------------------------------------------------------------------------------------
# Recording and keeping the plan
# ---------------------------------------------------------------------------------------------------------------------


class TimeBudgetCallback(TrainerCallback, ExportableState):
    """Carries the plan into every checkpoint's trainer state, and stops a budgeted run at its deadline should the
    machine turn slower than it measured (another job started beside it): the run then ends early, saved, rather
    than late. A resumed run has no deadline (its budget was spent by the interrupted one)."""

    def __init__(self, plan: dict, deadline_seconds: float | None = None):
        self.plan = plan
        self.deadline = time.monotonic() + deadline_seconds if deadline_seconds is not None else None
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
