"""Everything `Trainer` needs, built from the run's two argument dataclasses: corpus -> tokenizer -> model -> plan ->
Trainer. The arguments are read, never changed: what the plan chose reaches the Trainer through a copy of them
(`planning.trainer_arguments`), and `PreparedRun` holds the plan beside the Trainer.

The paper's recipe (§5) as the Trainer runs it:

* Adam with beta1 0.9, beta2 0.98, epsilon 1e-9, no weight decay, no gradient clipping (§5.3);
* lrate = lr_scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), step counted from 1 (§5.3);
* label smoothing 0.1 (§5.4) in the model's loss, normalised by the target tokens of the whole update across
  processes and accumulation steps (`Trainer`'s `num_items_in_batch`);
* batches of about N source + N target tokens by approximate length (§5.1), `gradient_accumulation_steps`
  chosen so that an update holds `tokens_per_update` tokens;
* checkpoints every `save_minutes` (the paper: 10) or every `save_steps`; evaluation with beam search.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

from datasets import DatasetDict
from transformers import DataCollatorForSeq2Seq, PreTrainedTokenizerFast, ProgressCallback, set_seed

from ..data.tokenizer import check_special_tokens
from ..evaluation.metrics import seq2seq_bleu_metrics
from ..model.configuration_vanilla_transformer import VanillaTransformerConfig
from ..model.modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration, shift_tokens_right
from ..utils.distributed import main_process_value, result_or_error
from ..utils.stages import SetupClock
from .arguments import ModelDataArguments, TransformerTrainingArguments, check_run_arguments, parse_config_overrides
from .calibration import Measurement
from .callbacks import SaveEveryCallback, SetupClockCallback, TimeBudgetCallback, TrainingProgressCallback
from .choices import length_penalty_choices
from .collapse import SourceCheckCallback
from .costs import FINISHING_SECONDS
from .device import pad_multiple, training_device
from .plan_record import recorded_plan, write_plan
from .planning import BudgetPlan, PlanContext, complete_recorded_plan, new_plan, trainer_arguments
from .replanning import RefitRules
from .run_data import PreparedData, prepare_data
from .schedule import updates_per_epoch
from .trainer import TransformerTrainer, noam_factor


logger = logging.getLogger(__name__)


@dataclass
class PreparedRun:
    """A run ready to train: the user's arguments as given, the plan as made, the Trainer built from both, the data
    it trains on, and the callbacks that hold what the run measures of itself: the budget's (the plan as re-fitted,
    the Trainer's own seconds per update) and the source check's (None where it does not run)."""

    recipe: ModelDataArguments
    args: TransformerTrainingArguments
    plan: BudgetPlan
    trainer: TransformerTrainer
    data: PreparedData
    budget: TimeBudgetCallback
    source_check: SourceCheckCallback | None = None

    @property
    def tokenizer(self) -> PreTrainedTokenizerFast:
        return self.data.tokenizer

    @property
    def corpus(self) -> DatasetDict:
        """The held-out splits (the training text is not kept once tokenized)."""
        return self.data.corpus

    @property
    def clock(self) -> SetupClock:
        return self.data.clock


# ---------------------------------------------------------------------------------------------------------------------
# Tokenizer and model
# ---------------------------------------------------------------------------------------------------------------------


def build_model(recipe: ModelDataArguments, tokenizer) -> VanillaTransformerForConditionalGeneration:
    """A new model of the preset's size with the tokenizer's vocabulary, or the saved model to fine-tune."""
    overrides = parse_config_overrides(recipe.config_overrides)
    if recipe.dropout is not None:
        overrides["dropout"] = recipe.dropout
    if recipe.label_smoothing is not None:
        overrides["label_smoothing"] = recipe.label_smoothing
    if recipe.model_name_or_path:
        model = VanillaTransformerForConditionalGeneration.from_pretrained(recipe.model_name_or_path, **overrides)
    else:
        config = VanillaTransformerConfig.from_preset(
            recipe.preset,
            vocab_size=len(tokenizer),
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            decoder_start_token_id=tokenizer.bos_token_id,
            **overrides,
        )
        model = VanillaTransformerForConditionalGeneration(config)
    if recipe.attn_implementation and recipe.attn_implementation != "auto":  # auto: measured by the planner
        model.set_attn_implementation(recipe.attn_implementation)
    check_special_tokens(tokenizer, model.config)
    return model


# ---------------------------------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------------------------------


def prepare_run(
    recipe: ModelDataArguments,
    args: TransformerTrainingArguments,
    resume: str | None = None,
    started: float | None = None,
    known: Measurement | None = None,
    data: PreparedData | None = None,
) -> PreparedRun:
    """Corpus, tokenizer, batches (`run_data.prepare_data`, or `data` already prepared: a run that starts again with
    another choice builds only its model, plan and Trainer), model, and the run's plan (its length, schedule,
    precision, attention, batch and model size; measured to fit `max_minutes` where given, taken from the checkpoint
    `resume` when resuming), and the Trainer that runs it. `started` (time.time()) is when the budget's clock
    started; `known` the time of an update the Trainer measured (a run started again), used instead of a
    calibration."""
    started = time.time() if started is None else started
    check_run_arguments(recipe, args)
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    if data is None:
        data = prepare_data(recipe, args, output_dir, SetupClock(started, rank=args.process_index))
    with data.clock.stage("model"):
        set_seed(args.seed)  # the initial weights depend on the seed alone (Trainer seeds only after the model exists)
        model = build_model(recipe, data.tokenizer)
    with data.clock.stage("plan"):
        context = _plan_context(recipe, args, model, data, started)
        context.known = known
        plan = plan_run(context, resume)
        if plan.preset and plan.preset != recipe.preset:  # the planner chose another size: train that one
            set_seed(args.seed)
            model = build_model(dataclasses.replace(recipe, preset=plan.preset), data.tokenizer)
        if plan.attn_implementation:
            model.set_attn_implementation(plan.attn_implementation)
        plan = complete_recorded_plan(plan, recipe, args, model.config.d_model)
    rules = refit_rules(recipe, args, plan, context) if plan.max_minutes else None
    budget = TimeBudgetCallback(plan, _deadline(plan, resume, started), rules)
    check = (
        SourceCheckCallback(recipe.source_check)
        if data.evaluation is not None and recipe.source_check != "off"
        else None
    )
    extra = [SaveEveryCallback(recipe.save_minutes)] if recipe.save_minutes else []
    callbacks = [*extra, *([check] if check else []), budget, SetupClockCallback(data.clock, output_dir)]
    bound = rules.max_updates if rules is not None else None  # room to re-plan into
    trainer = _build_trainer(args, plan, model, data, callbacks, bound)
    data.clock.write(output_dir)
    return PreparedRun(recipe, args, plan, trainer, data, budget, check)


def _plan_context(recipe, args, model, data: PreparedData, started: float) -> PlanContext:
    """What the planner reads: real batches of the training split (for calibration), the epoch's updates at a batch
    size, the held-out splits' sizes, and a way to build the recipe's other presets."""
    collator = training_collator(data.tokenizer, model, args)
    multiple = pad_multiple(training_device(args))
    batches, train, corpus, evaluation = data.batches, data.train, data.corpus, data.evaluation

    def sample_batches(max_tokens: int, count: int, taken: set) -> list[dict]:
        sampler = batches.of(max_tokens)
        chosen = sampler.shape_sample(count, multiple, taken)
        if len(chosen) < count:  # a small corpus has too few shapes for each candidate to have its own
            chosen += sampler.shape_sample(count - len(chosen), multiple)
        return [collator([{k: train[i][k] for k in ("input_ids", "labels")} for i in batch]) for batch in chosen]

    def epoch_updates(max_tokens: int, accumulation: int) -> int:
        return updates_per_epoch(batches.of(max_tokens), accumulation, args.world_size)

    def shapes_met(max_tokens: int, count: int) -> float:
        return batches.of(max_tokens).shapes_met(count, multiple)

    def build(preset: str) -> VanillaTransformerForConditionalGeneration:
        return build_model(dataclasses.replace(recipe, preset=preset), data.tokenizer)

    test = corpus["test"] if "test" in corpus else corpus.get("validation", [])
    validation_pairs = len(evaluation) if evaluation is not None else None
    return PlanContext(
        recipe,
        args,
        model,
        sample_batches,
        epoch_updates,
        validation_pairs,
        len(test),
        started,
        build=build,
        shapes_met=shapes_met,
    )


def training_collator(tokenizer, model, args) -> DataCollatorForSeq2Seq:
    """The collator of the training batches, the calibration's and the Trainer's: padded to the longest of each side
    (to a multiple of 8 on CUDA: `device.pad_multiple`), the decoder inputs made from the labels. It holds the
    model's two token ids, not the model: data-loading workers get a copy of it."""
    multiple = pad_multiple(training_device(args))
    shifter = DecoderInputs(model.config.pad_token_id, model.config.decoder_start_token_id)
    return DataCollatorForSeq2Seq(tokenizer, model=shifter, pad_to_multiple_of=multiple if multiple > 1 else None)


@dataclass(frozen=True)
class DecoderInputs:
    """What `DataCollatorForSeq2Seq` asks of a model: the decoder inputs of a batch's labels, shifted right (§3.1)."""

    pad_token_id: int
    decoder_start_token_id: int

    def prepare_decoder_input_ids_from_labels(self, labels):
        return shift_tokens_right(labels, self.pad_token_id, self.decoder_start_token_id)


def plan_run(context: PlanContext, resume: str | None = None) -> BudgetPlan:
    """The run's plan: the recorded one when resuming a run that has one; else measured (where the budget or an
    `auto` choice asks for it) and computed. Under several processes every process measures (as they will train,
    side by side) and the main process's plan is the one all of them follow."""
    args = context.args
    if resume is not None or context.budgeted:
        kept = recorded_plan(args.output_dir, resume)
        if kept is not None and (resume is not None or kept.max_minutes is not None):
            logger.info("keeping the plan of the run being resumed: %s", kept.summary())
            return kept
    plan = main_process_value(result_or_error(new_plan, context))
    if isinstance(plan, Exception):  # the main process failed: every process stops with its error
        raise plan
    if args.should_save:
        write_plan(args.output_dir, plan)
    return plan


def _deadline(plan: BudgetPlan, resume: str | None, started: float) -> float | None:
    """Seconds from now by which a budgeted run's training must end, in time for the test decoding; None for a
    given length or a resumed run (its budget was spent by the interrupted one)."""
    if not plan.max_minutes or resume is not None:
        return None
    return plan.max_minutes * 60 - (time.time() - started) - plan.predicted_decode_seconds - FINISHING_SECONDS


def refit_rules(recipe, args, plan: BudgetPlan, context: PlanContext) -> RefitRules:
    """What the budget callback needs to re-fit a budgeted run's length: the recipe's per-run counts, the epoch cap
    in updates, the held-out decoding to predict, and the first check (halfway to the first checkpoint, after at
    least 25 updates, at most 200)."""
    alphas = len(length_penalty_choices(recipe)) if context.validation_pairs is not None else 0
    per_epoch = context.updates_per_epoch(plan.max_tokens, plan.gradient_accumulation_steps)
    # The Trainer runs to this bound (the epoch cap, else ten times the plan): a re-plan never goes past it.
    bound = math.floor(recipe.max_epochs * per_epoch) if recipe.max_epochs is not None else 10 * plan.max_steps
    return RefitRules(
        checkpoints_per_run=recipe.checkpoints_per_run,
        evaluations_per_run=recipe.evaluations_per_run,
        save_steps=args.save_steps,
        eval_steps=args.eval_steps,
        validates=args.eval_strategy == "steps" and context.validation_pairs is not None,
        max_updates=max(bound, plan.max_steps),
        first_check=min(200, max(1, plan.save_steps // 2)),  # before the first checkpoint
        validation_pairs=context.validation_pairs or 0,
        test_sentences=context.test_pairs + alphas * (context.validation_pairs or 0),
        test_beams=recipe.test_beams,
        min_updates=recipe.min_updates,
        max_epochs=recipe.max_epochs,
        validation_beams=args.generation_num_beams or 1,
        source_check=recipe.source_check != "off",
        accumulation=plan.gradient_accumulation_steps,
        shapes_met=lambda count: context.shapes_met(plan.max_tokens, count),
    )


def _build_trainer(args, plan, model, data: PreparedData, callbacks, bound) -> TransformerTrainer:
    """The Trainer of the plan: the user's arguments with the plan's values (a copy), token-budget batches of the
    plan's size, validation BLEU, and the progress line instead of the plain bar."""
    planned = trainer_arguments(args, plan, model.config.d_model, max_steps=bound)
    sampler = data.batches.of(plan.max_tokens)
    trainer = TransformerTrainer(
        model=model,
        args=planned,
        train_dataset=data.train,
        eval_dataset=data.evaluation,
        data_collator=training_collator(data.tokenizer, model, args),
        processing_class=data.tokenizer,
        compute_metrics=seq2seq_bleu_metrics(data.tokenizer),
        batch_sampler=sampler,
        callbacks=callbacks,
        source_check=any(isinstance(callback, SourceCheckCallback) for callback in callbacks),
    )
    if trainer.pop_callback(ProgressCallback) is not None:
        trainer.add_callback(TrainingProgressCallback(plan.seconds_per_update if plan.max_minutes else None))
    logger.info(
        "%d training pairs in %d batches of ~%.0f padded tokens; %d accumulation steps; peak lr %.2e",
        len(data.train),
        len(sampler),
        sampler.tokens_per_batch(),
        planned.gradient_accumulation_steps,
        planned.learning_rate * noam_factor(int(planned.warmup_steps), int(planned.warmup_steps)),
    )
    return trainer
