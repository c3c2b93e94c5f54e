"""A training run, from the command line to the model folder; `run.py` reads top to bottom:

recipes.py      recipe files (configs/recipes/*.yaml) as the flags' defaults; `parse_run` parses and settles
arguments.py    the run's arguments (model, data, recipe; the paper's Adam), every check, the Trainer's planned copy
choices.py      the lists a run chooses from (sizes, batches, alphas), settled against the command line
settings.py     the run settled once: a frozen RunSettings of every decision its arguments alone make
run.py          the whole run: settle -> data -> plan -> Trainer -> train -> finish
run_data.py     corpus -> tokenizer -> tokenized split -> batches, the test split (PreparedData), once
models.py       the model trained: a preset's new one, or a saved one to fine-tune
building.py     the Trainer of a plan with its callbacks
trainer.py      the Trainer: the §5.3 schedule (the budget's), token-budget batches, checkpoints marked complete
callbacks.py    checkpoints every few minutes, the set-up clock's first update, the progress line, the plateau's stop
collapse.py     the guard against a model that stopped using its source
checkpoints.py  checkpoint folders and the `.complete` protocol
averaging.py    checkpoint choice and averaging (§6.1)
finishing.py    after training, the main process: average -> alpha -> test -> the model folder
results.py      results.json
budget/         the time budget: clock, calibration, the Trainer's own speed, costs, schedule, the plan and its
                entry point, re-planning, the deadline's callback, the plan on disk (budget/__init__.py maps it)
"""
