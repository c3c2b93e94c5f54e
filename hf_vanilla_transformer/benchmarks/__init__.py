"""Benchmarks, package code with a script in front of each: `speed` (this model against MarianMTModel, side by side),
`deploy` (every export engine on a trained model), `scale` (a WMT-sized corpus through the data pipeline), `curve`
(the recipe at a list of budgets, a run each: BLEU against minutes), `finetune` (a model adapted beside its start
and scratch), and the
timing and memory helpers they share (`measure`). Every figure names its machine (`utils.machine`). `gpu_check` runs
the gpu tests, a short main job and `speed` as subprocesses and `gpu_check_table` makes their one table."""
