"""A training run, from the command line to the model folder:

cli.py          scripts/train.py and scripts/main.py: parse, train, report
recipes.py      recipe files (configs/recipes/*.yaml) as the flags' defaults
arguments.py    the run's arguments (model, data, recipe; the paper's Adam) and every check of them
run.py          the whole run: prepare -> train -> average -> choose alpha -> test -> results, plots, card
preparation.py  corpus -> tokenizer -> model -> plan -> Trainer
calibration.py  measuring an update on this machine before training
planning.py     the run's plan (length, schedule, precision, batch and model size) from those measurements
trainer.py      the Trainer: §5.3 schedule, token-budget batches, checkpoints marked complete
callbacks.py    checkpoints every few minutes, the budget's deadline, the progress line
checkpoints.py  checkpoint folders and the `.complete` protocol
averaging.py    checkpoint choice and averaging (§6.1)
results.py      results.json
allocator.py    the mimalloc allocator for CPU training
"""
