"""The plan's decisions applied, in one place: the Trainer's arguments and the model a plan trains are set here and
nowhere else (the run's Trainer, `training/building.py`, and the Trainer's trial, `trainer_speed.py`, both call
`apply_plan`; the Trainer's state follows the plan in the budget's callback, `deadline.py`).

The §5.3 rate reaches the Trainer as the plan's peak (`learning_rate`) and its warmup: the Trainer's schedule
(`schedule.noam_schedule`) is the shape of eq. 3 normalised to 1 at the end of warmup, so no factor is applied twice.

Each decision is a rule (`RULES`): a function of the plan that sets what it decides on the Trainer's copy of the
arguments and, where given, on the model. A new decision is one rule and its line in `RULES` (docs/layout.md,
"Adding a decision").
"""

from __future__ import annotations

import copy
from collections.abc import Callable

from .plan import BudgetPlan


def length(plan: BudgetPlan, args, model) -> None:
    """The updates, the §5.3 warmup, and the checkpoint and validation spacing where the plan spaces them."""
    schedule = plan.schedule
    args.max_steps, args.warmup_steps = schedule.max_steps, schedule.warmup_steps
    if schedule.save_steps:
        args.save_steps = schedule.save_steps
    if schedule.eval_steps:
        args.eval_steps = schedule.eval_steps


def rate(plan: BudgetPlan, args, model) -> None:
    """The plan's peak, which the §5.3 schedule reaches at the end of warmup (the schedule's shape peaks at 1)."""
    if plan.schedule.peak_learning_rate is None:
        raise ValueError("the plan holds no peak learning rate; expected one (record.complete_recorded_plan)")
    args.learning_rate = plan.schedule.peak_learning_rate


def precision(plan: BudgetPlan, args, model) -> None:
    """`bf16`/`fp16` autocast, `tf32` matrix products (TransformerTrainer.train applies it on CUDA), or `fp32`; the
    step compiled or eager."""
    chosen = plan.choice.precision
    args.bf16, args.fp16, args.tf32 = chosen == "bf16", chosen == "fp16", chosen == "tf32"
    args.mixed_precision = chosen if chosen in ("bf16", "fp16") else "no"
    args.torch_compile = plan.choice.torch_compile
    if plan.choice.torch_compile and args.torch_compile_backend is None:
        args.torch_compile_backend = "inductor"


def batches(plan: BudgetPlan, args, model) -> None:
    """The batches per update (the batch itself is the Trainer's sampler's: `training/building.py`)."""
    args.gradient_accumulation_steps = plan.choice.gradient_accumulation_steps or 1


def attention(plan: BudgetPlan, args, model) -> None:
    """The attention implementation the plan measured fastest (none: the model's own)."""
    if model is not None and plan.choice.attn_implementation:
        model.set_attn_implementation(plan.choice.attn_implementation)


def dropout(plan: BudgetPlan, args, model) -> None:
    """The dropout the plan chose for the run's predicted epochs (None: the model's own)."""
    if model is None or plan.choice.dropout is None:
        return
    model.config.dropout = plan.choice.dropout  # §5.4's: embeddings and sub-layer outputs (not attention, not FFN)
    for module in model.modules():
        if isinstance(getattr(module, "dropout", None), float):
            module.dropout = plan.choice.dropout


# The plan's decisions, in the order they are applied: (plan, the Trainer's arguments, the model or None) -> None.
RULES: tuple[Callable[[BudgetPlan, object, object], None], ...] = (length, rate, precision, batches, attention, dropout)


def apply_plan(plan: BudgetPlan, args, model=None, runs_to: int | None = None):
    """A copy of the Trainer's arguments `args` with `plan`'s decisions (`RULES`), and `model` (where given) with
    those of the model; the user's arguments are left as given, and the copy holds no secret (`without_secrets`).
    The Trainer runs to `runs_to` where the budget may re-plan beyond the plan's length (its bound); the budget's
    callback holds it to the plan's."""
    planned = copy.copy(args)
    for rule in RULES:
        rule(plan, planned, model)
    planned.max_steps = max(planned.max_steps, runs_to or 0)
    return planned.without_secrets()  # last: the run's walk enters arguments.py once, on its way back
