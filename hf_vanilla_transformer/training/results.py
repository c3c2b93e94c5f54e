"""`results.json`: what a finished run records about itself. `recipe` is what the user asked for, `plan` what the
plan chose (and whether the deadline stopped the run early), side by side; then the model, the data, the training,
the test scores and a few translations. The model card is rendered from it (`sharing/model_card.py`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from ..utils.machine import describe_machine
from ..utils.redact import private_paths, public_command, publishable
from .budget import TrainingEnd, updates_per_epoch
from .checkpoints import checkpoint_step
from .collapse import SOURCE_GAIN_AT_LEAST


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
    set_up_seconds: float = 0.0  # from the process's start to training's (corpus, tokenizer, plan, Trainer)
    finishing: dict = field(default_factory=dict)  # seconds of each step after training (`finishing.finish_run`)
    length_penalty: float | None = None
    alpha_choice: dict | None = None
    start: dict | None = None  # a fine-tuning run's starting model on validation (training/start.py)
    kept: dict | None = None  # ... and which model the folder kept: "trained" or "start", with both scores
    averaging: dict | None = None  # the averaging rule as the end applied it (`finishing.averaging_of_run`), or None

    @property
    def decode_seconds(self) -> float:
        """The choice of alpha and the test decoding, together (`finishing`'s two steps)."""
        return self.finishing.get("alpha", 0.0) + self.finishing.get("test", 0.0)


def describe_parameters(model) -> str:
    count = sum(p.numel() for p in model.parameters())
    return f"{count / 1e6:.2f}M" if count >= 1e5 else f"{count / 1e3:.1f}k"


def run_results(settings, data, training, end: TrainingEnd, model, outcome: RunOutcome) -> dict:
    """The `results.json` of a finished run (see the module docstring): `settings` the settled run, `data` its
    prepared data, `training` its Trainer and callbacks, `end` how training ended; publishable: no token, no local
    path but its name (utils/redact.py), test examples of the user's own files only where asked
    (`RunSettings.publishes_examples`)."""
    # The callbacks' records first: the run's walk returns to their files before it leaves this one (the test).
    callbacks = {"source_check": training.source_check, "plateau": training.plateau}
    records = {name: callback.record() for name, callback in callbacks.items() if callback is not None}
    corpus, asked = settings.corpus_name, settings.asked()
    results = {
        "name": Path(settings.output_dir).name,
        "parameters": describe_parameters(model),
        "model": model.config.to_dict(),
        "data": _data(data, corpus, len(training.trainer.train_dataset)),
        "recipe": asked,
        "training": _training(training.trainer, end.measured_seconds_per_update, end.plan.choice.precision, outcome),
        "plan": {
            **end.plan.to_dict(),
            # the update time it planned beside the one the Trainer measured (validation and checkpoint pauses apart)
            "measured_seconds_per_update": end.measured_seconds_per_update,
            "stopped_early_at": end.stopped_early_at,
            "ended_by": _ended_by(end.stopped_early_at, end.capped_by_epochs, training.source_check, training.plateau),
        },
        "setup": data.clock.stages,
        "averaged_checkpoints": [path.name for path in outcome.averaged],
        "test": _test(outcome, settings.recipe.test_beams),
        "examples": [
            {"source": source, "reference": reference, "translation": hypothesis}
            for source, reference, hypothesis in list(
                zip(outcome.sources, outcome.references, outcome.hypotheses, strict=True)
            )[: outcome.examples if settings.publishes_examples else 0]
        ],
        "hardware": describe_machine(training.trainer.args.device),
        "command": public_command(outcome.command, settings.output_dir),
        "wall_seconds": time.time() - outcome.started,
    }
    results["time"] = time_spent(
        results["wall_seconds"], settings.max_minutes, outcome, training.trainer.state.log_history
    )
    if outcome.alpha_choice:
        results["length_penalty_choice"] = outcome.alpha_choice
    if outcome.kept:
        results["kept"] = outcome.kept
    results |= records
    results["rules"] = fired_rules(end.plan, results, outcome.averaging)
    return publishable(results, private_paths(settings.recipe, settings.args), settings.output_dir)


def time_spent(wall_seconds: float, max_minutes: float | None, outcome: RunOutcome, log: list[dict]) -> dict:
    """Where this process's seconds went, in the order spent: the set-up (corpus, tokenizer, plan, Trainer), training
    (its validations among them, from `log`: after a switch to another choice, the second Trainer's only), then each
    step after it (`RunOutcome.finishing`: averaging, a fine-tuning run's check of its start, the choice of alpha,
    the test decoding, the log and plots), and of a budget what was left unspent when `results.json` was written:
    what the budget's margins and predictions left idle. None without a budget, and for a resumed run (its budget
    was the first process's; this one spent only its own part of it)."""
    resumed = checkpoint_step(outcome.resumed_at) if outcome.resumed_at else 0  # this process's validations only
    spent = {
        "set_up": outcome.set_up_seconds,
        "training": outcome.train_seconds,
        "validations": sum(entry.get("eval_runtime", 0.0) for entry in log if entry.get("step", 0) > resumed),
        **outcome.finishing,
    }
    budget = max_minutes * 60 if max_minutes is not None else None
    return {
        "budget_seconds": budget,
        **{f"{name}_seconds": seconds for name, seconds in spent.items()},
        "unspent_seconds": budget - wall_seconds if budget is not None and not resumed else None,
        "resumed": bool(resumed),
    }


def describe_time(spent: dict) -> str:
    """`time_spent`'s record in words, in minutes: "of the 26-minute budget: set-up 1.0, training 22.3 (validations
    0.8), ...; unspent 1.1"."""
    names = {"set_up": "set-up", "averaging": "averaging", "start_check": "the start checked again",
             "alpha": "choice of alpha", "test": "test decoding", "folder": "log and plots"}  # fmt: skip
    words = []
    for key, seconds in spent.items():
        name = key.removesuffix("_seconds")
        if name == "training":
            words.append(f"training {seconds / 60:.1f} (validations {spent['validations_seconds'] / 60:.1f})")
        elif name in names and seconds is not None:
            words.append(f"{names[name]} {seconds / 60:.1f}")
    said = ", ".join(words)
    if spent.get("resumed"):
        return f"since the run resumed: {said}"
    if spent.get("budget_seconds") is not None:
        left = spent["unspent_seconds"] / 60
        said = f"of the {spent['budget_seconds'] / 60:g}-minute budget: {said}; "
        said += f"unspent {left:.1f}" if left >= 0 else f"over it by {-left:.1f}"
    return said


def fired_rules(plan, results: dict, averaging: dict | None = None) -> list[dict]:
    """The recipe's rules that decided something in the run, `{"rule": the recipe's value, "said": in words}`: the
    plan's (`Record.rules`: the size, the dropout, a cut warmup, a fine-tuning start's peak and warmup), the averaging
    count the end chose on the epochs made (`averaging`; the plan's prediction of it stays in `results["plan"]`), and
    how training ended where a rule ended it (the plateau, the epoch cap, the deadline, a switch, the source not yet
    judged)."""
    fired = [rule for rule in plan.record.rules if rule["rule"] != "average_last_by_epochs"]
    fired += [averaging] if averaging is not None else []
    ended = results["plan"]["ended_by"]
    if plan.history.switched_from:
        fired.append({"rule": "switch", "said": f"switched from {plan.history.switched_from.get('preset')}"})
    if ended == "validation plateau":
        fired.append({"rule": "plateau_validations", "said": f"stopped at {results['plateau']['stopped_at']:,}"})
    elif ended in ("epochs", "deadline"):
        fired.append({"rule": "max_epochs" if ended == "epochs" else "max_minutes", "said": f"{ended} ended it"})
    history = (results.get("source_check") or {}).get("history") or []
    last = history[-1] if history else None
    if last is not None and not last.get("low") and last["source_gain"] < SOURCE_GAIN_AT_LEAST:
        fired.append({"rule": "source_check", "said": "source not yet read: not judged"})
    return fired


def _ended_by(stopped_early_at: int | None, capped_by_epochs: bool, check, plateau=None) -> str:
    """Why training ended: "source collapse" (the source check stopped it), "validation plateau" (validation BLEU
    stopped rising: `PlateauCallback`), "deadline" (the budget's), "epochs" (the epoch cap bound before the budget:
    the run ends early), else "updates" (the length planned or given)."""
    if check is not None and check.collapsed_at is not None and check.mode == "stop":
        return "source collapse"
    if plateau is not None and plateau.stopped_at is not None:
        return "validation plateau"
    if stopped_early_at is not None:
        return "deadline"
    return "epochs" if capped_by_epochs else "updates"


def _data(data, name: dict, train_pairs: int) -> dict:
    """The corpus as named (`name`: the dataset and its languages) and as read: its pairs, the lines skipped."""
    corpus = data.corpus
    return {
        **name,
        "train_pairs": train_pairs,
        "validation_pairs": len(corpus["validation"]) if "validation" in corpus else 0,
        "test_pairs": len(data.test),
        # local files: the lines of each that were no sentence pair, by reason (data/corpora.py)
        "skipped_lines": data.clock.stages.get("corpus", {}).get("skipped_lines", {}),
    }


def _training(trainer, update_seconds: float | None, precision: str, outcome: RunOutcome) -> dict:
    """What training did: its updates and epochs, the `precision` it ran in (whatever chose it: the plan, a flag,
    the recipe), its seconds, its last loss, the target tokens per second of the Trainer's own updates
    (`update_seconds` each)."""
    steps = trainer.state.global_step
    trained = steps - (checkpoint_step(outcome.resumed_at) if outcome.resumed_at else 0)
    args = trainer.args
    per_epoch = updates_per_epoch(len(trainer.batch_sampler), args.gradient_accumulation_steps, args.world_size)
    return {
        "steps": steps,
        "epochs": steps / per_epoch,
        "precision": precision,
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


def _test(outcome: RunOutcome, beams: int) -> dict:
    scores = outcome.scores
    return {
        "bleu": scores["score"],
        "bleu_signature": scores["signature"],
        "chrf": scores["chrf"],
        "chrf_signature": scores["chrf_signature"],
        "tokenized_bleu": scores.get("tokenized_bleu"),
        "pairs": len(outcome.sources),
        "beams": beams,
        "decode_seconds": outcome.decode_seconds,
        "length_penalty": outcome.length_penalty,
    }
