"""The plan of a run on disk, in one place: `budget.json` in the output folder (written when the plan is made and at
each re-plan, removed when a run starts again with another choice) and the plan that every checkpoint carries in
its trainer state (the budget callback's exported state), read back when a run resumes."""

from __future__ import annotations

import json
from pathlib import Path

from ...utils.files import write_json_atomically
from .plan import BudgetPlan
from .schedule import learning_rate, peak_rate


BUDGET_FILE = "budget.json"
CALLBACK = "TimeBudgetCallback"  # the budget callback's class (deadline.py): its name keys its state in a checkpoint


def write_plan(output_dir: str | Path, plan: BudgetPlan, at: str = "plan") -> None:
    """`budget.json`, written atomically (`at`: the fault suite's moment, "replan" for a re-plan's)."""
    write_json_atomically(Path(output_dir) / BUDGET_FILE, plan.to_dict(), at=at)


def remove_plan(output_dir: str | Path) -> None:
    (Path(output_dir) / BUDGET_FILE).unlink(missing_ok=True)


def recorded_plan(output_dir: str | Path, checkpoint: str | Path | None) -> BudgetPlan | None:
    """The plan of an interrupted run: from the checkpoint it resumes from, else from the run's `budget.json`."""
    if checkpoint is not None:
        state_file = Path(checkpoint) / "trainer_state.json"
        if state_file.exists():
            state = json.loads(state_file.read_text(encoding="utf-8"))
            saved = state.get("stateful_callbacks", {}).get(CALLBACK)
            if isinstance(saved, list):  # several instances are saved as a list
                saved = saved[0] if saved else None
            if saved:
                return BudgetPlan.from_dict(saved["args"]["plan"])
    budget_file = Path(output_dir) / BUDGET_FILE
    if budget_file.exists():
        return BudgetPlan.from_dict(json.loads(budget_file.read_text(encoding="utf-8")))
    return None


def complete_recorded_plan(plan: BudgetPlan, settings, model) -> BudgetPlan:
    """A plan recorded before it held the batch size, accumulation, lr_scale and peak, with them computed as the
    run then did for `model` (of the plan's size); what it holds is kept (a new plan: the one given is left as it
    is)."""
    update = settings.update_size(plan.choice.max_tokens or settings.token_sizes[0])
    accumulation = plan.choice.gradient_accumulation_steps or update.accumulation
    d_model, tokens = model.config.d_model, update.max_tokens * accumulation * update.world_size
    lr_scale = plan.schedule.lr_scale
    if lr_scale is None:
        lr_scale = learning_rate(settings.rate, d_model, plan.schedule.warmup_steps, tokens).lr_scale
    peak = plan.schedule.peak_learning_rate or peak_rate(lr_scale, d_model, plan.schedule.warmup_steps)
    return plan.but(
        max_tokens=update.max_tokens,
        gradient_accumulation_steps=accumulation,
        lr_scale=lr_scale,
        peak_learning_rate=peak,
    )
