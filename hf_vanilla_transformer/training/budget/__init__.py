"""The time budget of a run (`--max_minutes`), in a room of its own: what the run's length, schedule, precision,
attention, batch and model size are, measured on this machine and fitted to the time left.

One way in: the rest of the package imports the names below from this module, never a module of the room (a test
holds it: tests/test_budget_room.py), and the room imports nothing of `training/` outside itself (the Trainer class
the trial runs is handed in by the run).

clock.py          the budget's clock: the one formula of the time left, with its named margins
calibration.py    an update measured before training, for every choice the recipe leaves open: times, handed back
trainer_speed.py  the Trainer's own work per update beyond it, on a short run of the real Trainer
decode_speed.py   a decoding step's latency on a GPU, where decoding is bound by it
costs.py          what a run's parts cost (decoding, validation, new shapes) and how many updates fit
schedule.py       the §5.3 schedule in numbers: warmup, learning rate, event spacing; the Trainer's scheduler
plan.py           the plan (BudgetPlan), a value
planner.py        make_plan: the plan from the settled run and its data, in steps that return values:
measuring.py        measure: one model size's update (its choices staged, ranked and said), checkpoint, decoding step
fitting.py          fit: what a measured update fits into the budget, from the plan's inputs (PlanInputs);
                    the epoch's updates, the re-plans' bound
applying.py       the plan's decisions on the Trainer's arguments and the model: their one place
replanning.py     the length re-fitted from the Trainer's own updates, the new batch shapes they meet paid; a
                  switch to another choice
deadline.py       the budget's callback: the deadline, the re-plans and the spacing, as decisions it returns;
                  the Trainer's own updates and pauses it measures (UpdateMeter)
record.py         the plan on disk: budget.json and the plan in each checkpoint

(Where and how an update runs, the device and each precision's context, is the package's: `utils/device.py`.)
"""

from .applying import apply_plan
from .calibration import COMPILE_AFTER_MINUTES, COMPILE_AFTER_UPDATES, UpdateChoices, trainer_optimizer
from .clock import BudgetClock, BudgetError, finishing_seconds
from .deadline import TimeBudgetCallback, TrainingEnd
from .fitting import updates_per_epoch
from .plan import Budgeted, BudgetPlan
from .planner import make_plan
from .record import remove_plan
from .replanning import Switch
from .schedule import RateRule, check_cooldown_fraction, noam_schedule, reached_step


__all__ = [
    "COMPILE_AFTER_MINUTES",
    "COMPILE_AFTER_UPDATES",
    "BudgetClock",
    "BudgetError",
    "BudgetPlan",
    "Budgeted",
    "RateRule",
    "Switch",
    "TimeBudgetCallback",
    "TrainingEnd",
    "UpdateChoices",
    "apply_plan",
    "check_cooldown_fraction",
    "finishing_seconds",
    "make_plan",
    "noam_schedule",
    "reached_step",
    "remove_plan",
    "trainer_optimizer",
    "updates_per_epoch",
]
