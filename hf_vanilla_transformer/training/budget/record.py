"""The plan of a run on disk, in one place: `budget.json` in the output folder (written when the plan is made and at
each re-plan, removed when a run starts again with another choice) and the plan that every checkpoint carries in
its trainer state (the budget callback's exported state), read back when a run resumes."""

from __future__ import annotations

import json
from pathlib import Path

from ...utils.files import write_json_atomically
from .plan import BudgetPlan


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
