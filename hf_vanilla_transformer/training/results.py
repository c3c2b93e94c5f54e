"""`results.json`: what a finished run records about itself. `recipe` is what the user asked for, `plan` what the
plan chose (and whether the deadline stopped the run early), side by side; then the model, the data, the training,
the test scores and a few translations. The model card is rendered from it (`sharing/model_card.py`)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..utils.machine import describe_machine
from ..utils.redact import private_paths, public_command, publishable
from .checkpoints import checkpoint_step
from .preparation import PreparedRun


@dataclass
class RunOutcome:
    """What the run produced after training: the averaged checkpoints, the test scores and texts, the choice of
    alpha, and its clock (process start, training and decoding seconds, the checkpoint it resumed from)."""

    started: float
    train_seconds: float
    resumed_at: str | None = None
    command: str = ""
    examples: int = 5
    averaged: list[Path] = field(default_factory=list)
    scores: dict = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)
    references: list[str] = field(default_factory=list)
    hypotheses: list[str] = field(default_factory=list)
    decode_seconds: float = 0.0
    length_penalty: float | None = None
    alpha_choice: dict | None = None


def describe_parameters(model) -> str:
    count = sum(p.numel() for p in model.parameters())
    return f"{count / 1e6:.2f}M" if count >= 1e5 else f"{count / 1e3:.1f}k"


def epochs_for(max_steps: int, trainer) -> float:
    """Epochs of the training split in `max_steps` updates (every process takes its share of the batches)."""
    args = trainer.args
    per_epoch = max(1, math.ceil(len(trainer.batch_sampler) / (args.gradient_accumulation_steps * args.world_size)))
    return max_steps / per_epoch


def run_results(run: PreparedRun, model, outcome: RunOutcome) -> dict:
    """The `results.json` of a finished run (see the module docstring), publishable: no token, no local path but
    its name (utils/redact.py), test examples of the user's own files only where asked (`publishes_examples`)."""
    results = {
        "name": Path(run.args.output_dir).name,
        "parameters": describe_parameters(model),
        "model": model.config.to_dict(),
        "data": _data(run),
        "recipe": requested(run.recipe, run.args),
        "training": _training(run, outcome),
        "plan": _plan(run),
        "setup": run.clock.stages,
        "averaged_checkpoints": [path.name for path in outcome.averaged],
        "test": _test(run, outcome),
        "examples": [
            {"source": source, "reference": reference, "translation": hypothesis}
            for source, reference, hypothesis in list(
                zip(outcome.sources, outcome.references, outcome.hypotheses, strict=True)
            )[: outcome.examples if publishes_examples(run.recipe) else 0]
        ],
        "hardware": describe_machine(run.trainer.args.device),
        "command": public_command(outcome.command, run.args.output_dir),
        "wall_seconds": time.time() - outcome.started,
    }
    if outcome.alpha_choice:
        results["length_penalty_choice"] = outcome.alpha_choice
    if run.source_check is not None:
        results["source_check"] = run.source_check.record()
    return publishable(results, private_paths(run.recipe, run.args), run.args.output_dir)


def publishes_examples(recipe) -> bool:
    """Whether the model folder shows test sentences (examples, attention maps): those of a public corpus, and of the
    user's own files (`--data_files`) only with `--publish_examples`."""
    return recipe.publish_examples or not recipe.data_files


def requested(recipe, args) -> dict:
    """What the user asked for (recipe file and flags), before any plan: the sizes, the batch and its choices, the
    schedule, the precision and attention (`auto` where the plan measures them), the length."""
    return {
        "preset": recipe.preset,
        "preset_choices": recipe.preset_choices,
        "max_tokens": recipe.max_tokens,
        "max_tokens_choices": recipe.max_tokens_choices,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "tokens_per_update": recipe.tokens_per_update,
        "lr_scale": recipe.lr_scale,
        "peak_learning_rate": recipe.peak_learning_rate,
        "peak_learning_rate_preset": recipe.peak_learning_rate_preset,
        "lr_reference_tokens": recipe.lr_reference_tokens,
        "compile_training": recipe.compile_training,
        "warmup_steps": args.warmup_steps,
        "max_length": recipe.max_length,
        "seed": args.seed,
        "precision": recipe.precision or ("bf16" if args.bf16 else "fp32"),
        "attn_implementation": recipe.attn_implementation,
        "recipe_file": recipe.recipe,
        "publish_examples": recipe.publish_examples,
        "max_minutes": recipe.max_minutes,
        "max_steps": args.max_steps,
    }


def _plan(run: PreparedRun) -> dict:
    """The plan as the run ended it (re-planned lengths included), with the update time it planned beside the one
    the Trainer measured (validation and checkpoint pauses apart), and where the deadline stopped it, if it did."""
    budget = run.budget
    return {
        **budget.plan.to_dict(),
        "measured_seconds_per_update": budget.meter.seconds_per_update,
        "stopped_early_at": budget.stopped_early_at,
        "ended_by": _ended_by(run),
    }


def _ended_by(run: PreparedRun) -> str:
    """Why training ended: "source collapse" (the source check stopped it), "deadline" (the budget's), "epochs" (the
    epoch cap bound before the budget: the run ends early), else "updates" (the length planned or given)."""
    check = run.source_check
    if check is not None and check.collapsed_at is not None and check.mode == "stop":
        return "source collapse"
    budget = run.budget
    if budget.stopped_early_at is not None:
        return "deadline"
    rules = budget.rules
    if rules is not None and rules.max_epochs is not None and budget.plan.max_steps >= rules.max_updates:
        return "epochs"
    return "updates"


def _data(run: PreparedRun) -> dict:
    recipe, corpus = run.recipe, run.corpus
    test = corpus["test"] if "test" in corpus else corpus["validation"]
    return {
        "dataset": "local files" if recipe.data_files else recipe.dataset,
        "source_lang": recipe.source_lang,
        "target_lang": recipe.target_lang,
        "train_pairs": len(run.trainer.train_dataset),
        "validation_pairs": len(corpus["validation"]) if "validation" in corpus else 0,
        "test_pairs": len(test),
        # local files: the lines of each that were no sentence pair, by reason (data/corpora.py)
        "skipped_lines": run.clock.stages.get("corpus", {}).get("skipped_lines", {}),
    }


def _training(run: PreparedRun, outcome: RunOutcome) -> dict:
    trainer = run.trainer
    steps = trainer.state.global_step
    trained = steps - (checkpoint_step(outcome.resumed_at) if outcome.resumed_at else 0)
    update_seconds = run.budget.meter.seconds_per_update
    return {
        "steps": steps,
        "epochs": epochs_for(steps, trainer),
        "seconds": outcome.train_seconds,
        "seconds_per_update": outcome.train_seconds / max(1, trained),
        "final_loss": next((e["loss"] for e in reversed(trainer.state.log_history) if "loss" in e), None),
        # The updates' own speed (validation and checkpoints apart), in real target tokens of every process: what
        # `scripts/benchmark.py` reports of a training step of the same model, batch size and precision.
        "target_tokens_per_second": (
            trainer.target_tokens_seen / trained / update_seconds
            if trainer.target_tokens_seen and update_seconds
            else None
        ),
    }


def _test(run: PreparedRun, outcome: RunOutcome) -> dict:
    scores = outcome.scores
    return {
        "bleu": scores["score"],
        "bleu_signature": scores["signature"],
        "chrf": scores["chrf"],
        "chrf_signature": scores["chrf_signature"],
        "tokenized_bleu": scores.get("tokenized_bleu"),
        "pairs": len(outcome.sources),
        "beams": run.recipe.test_beams,
        "decode_seconds": outcome.decode_seconds,
        "length_penalty": outcome.length_penalty,
    }
