"""The time budget of a run (`--max_minutes`), in a room of its own: what the run's length, schedule, precision,
attention, batch and model size are, measured on this machine and fitted to the time left.

clock.py          the budget's clock: the one formula of the time left, with its named margins
device.py         where and how an update runs: the device, each precision's context, the clock's synchronisation
calibration.py    an update measured before training, for every choice the recipe leaves open
trainer_speed.py  the Trainer's own work per update beyond it, on a short run of the real Trainer
decode_speed.py   a decoding step's latency on a GPU, where decoding is bound by it
costs.py          what a run's parts cost (decoding, validation, new shapes) and how many updates fit
schedule.py       the §5.3 schedule in numbers: warmup, learning rate, event spacing, the Trainer's length
plan.py           the plan (BudgetPlan), a value
planner.py        make_plan, the room's entry point: the plan from the settled run and its prepared data
replanning.py     the length re-fitted from the Trainer's own updates; a switch to another choice; the meter
deadline.py       the budget's callback: the deadline, the re-plans and the spacing, as decisions it returns
record.py         the plan on disk: budget.json and the plan in each checkpoint
"""
