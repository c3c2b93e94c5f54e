"""The Trainer of a run's plan.

The paper's recipe (§5) as the Trainer runs it:

* Adam with beta1 0.9, beta2 0.98, epsilon 1e-9, no weight decay, no gradient clipping (§5.3);
* lrate = lr_scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), step counted from 1 (§5.3);
* label smoothing 0.1 (§5.4) in the model's loss, normalised by the target tokens of the whole update across
  processes and accumulation steps (`Trainer`'s `num_items_in_batch`);
* batches of about N source + N target tokens by approximate length (§5.1), `gradient_accumulation_steps`
  chosen so that an update holds `tokens_per_update` tokens;
* checkpoints every `save_minutes` (the paper: 10) or as the plan spaces them; evaluation with beam search.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from transformers import ProgressCallback

from ..data.collating import training_collator
from ..evaluation.metrics import seq2seq_bleu_metrics
from .budget import BudgetClock, Budgeted, TimeBudgetCallback, apply_plan, updates_per_epoch
from .callbacks import PlateauCallback, SaveEveryCallback, SetupClockCallback, TrainingProgressCallback
from .collapse import SourceCheckCallback
from .run_data import PreparedData
from .trainer import TransformerTrainer


logger = logging.getLogger(__name__)


@dataclass
class Training:
    """A Trainer ready to train a plan, with the callbacks that hold what the run measures of itself: the budget's
    (`TrainingEnd` once trained), the source check's and the plateau's (None where they do not run)."""

    trainer: TransformerTrainer
    budget: TimeBudgetCallback
    source_check: SourceCheckCallback | None = None
    plateau: PlateauCallback | None = None


def build_trainer(settings, budgeted: Budgeted, model, data: PreparedData, clock: BudgetClock) -> Training:
    """The Trainer of the plan: the user's arguments with the plan's values (a copy), the plan's attention,
    token-budget batches of the plan's size, validation BLEU, the budget's callback (its deadline only where the
    plan re-fits its length) and the source check, and the progress line instead of the plain bar."""
    recipe, plan, rules = settings.recipe, budgeted.plan, budgeted.rules
    # The plan's decisions on a copy of the arguments and on the model (`budget.apply_plan`, their one place): the
    # Trainer runs to the bound the budget may re-plan to, its callback holds it to the plan's length.
    planned = apply_plan(plan, settings.args, model, runs_to=rules.room.max_updates if rules is not None else None)
    budget = TimeBudgetCallback(plan, clock if rules is not None else None, rules)
    sampler = data.batches.of(plan.choice.max_tokens)
    per_epoch = updates_per_epoch(len(sampler), planned.gradient_accumulation_steps, settings.world_size)
    check = (
        SourceCheckCallback(recipe.source_check, per_epoch)
        if data.evaluation is not None and recipe.source_check != "off"
        else None
    )
    plateau = PlateauCallback(recipe.plateau_validations) if recipe.plateau_validations and settings.validates else None
    callbacks = [SaveEveryCallback(recipe.save_minutes)] if recipe.save_minutes else []
    callbacks += [*([check] if check else []), *([plateau] if plateau else [])]
    callbacks += [budget, SetupClockCallback(data.clock, settings.output_dir)]
    trainer = TransformerTrainer(
        model=model,
        args=planned,
        train_dataset=data.train,
        eval_dataset=data.evaluation,
        data_collator=training_collator(data.tokenizer, model.config, settings.device),
        processing_class=data.tokenizer,
        compute_metrics=seq2seq_bleu_metrics(data.tokenizer),
        batch_sampler=sampler,
        callbacks=callbacks,
        source_check=check is not None,
    )
    if trainer.pop_callback(ProgressCallback) is not None:
        trainer.add_callback(
            TrainingProgressCallback(plan.update.seconds_per_update if plan.record.max_minutes else None)
        )
    logger.info(
        "%d training pairs in %d batches of ~%.0f padded tokens; %d accumulation steps; peak lr %.2e",
        len(data.train),
        len(sampler),
        sampler.tokens_per_batch(),
        planned.gradient_accumulation_steps,
        plan.schedule.peak_learning_rate,
    )
    data.clock.write(settings.output_dir)
    return Training(trainer, budget, check, plateau)
