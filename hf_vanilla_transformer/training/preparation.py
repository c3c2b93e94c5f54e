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
from tokenizers import Tokenizer
from transformers import (
    AutoTokenizer,
    DataCollatorForSeq2Seq,
    PreTrainedTokenizerFast,
    ProgressCallback,
    set_seed,
)

from ..data.batching import LengthSortedSampler, TokenBudgetBatchSampler
from ..data.corpora import hold_out, load_corpus
from ..data.errors import CorpusError
from ..data.preparation import learn_tokenizer, length_chunks, tokenize_corpus, tokenized_folder, tokenizer_to_text
from ..data.tokenizer import check_special_tokens, wrap_tokenizer
from ..evaluation.length_penalty import length_penalty_choices
from ..evaluation.metrics import seq2seq_bleu_metrics
from ..model.configuration_vanilla_transformer import VanillaTransformerConfig
from ..model.modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration, shift_tokens_right
from ..utils.distributed import main_process_value
from ..utils.files import write_json_atomically
from ..utils.stages import SetupClock
from .arguments import ModelDataArguments, TransformerTrainingArguments, check_run_arguments, parse_config_overrides
from .calibration import Measurement
from .callbacks import (
    SaveEveryCallback,
    SetupClockCallback,
    TimeBudgetCallback,
    TrainingProgressCallback,
    recorded_plan,
)
from .collapse import SourceCheckCallback
from .costs import FINISHING_SECONDS
from .device import pad_multiple, training_device
from .planning import BUDGET_FILE, BudgetPlan, PlanContext, complete_recorded_plan, new_plan, trainer_arguments
from .replanning import RefitRules
from .schedule import updates_per_epoch
from .trainer import TransformerTrainer, noam_factor


logger = logging.getLogger(__name__)


@dataclass
class PreparedRun:
    """A run ready to train: the user's arguments as given, the plan, and the Trainer built from both."""

    recipe: ModelDataArguments
    args: TransformerTrainingArguments
    plan: BudgetPlan
    trainer: TransformerTrainer
    tokenizer: PreTrainedTokenizerFast
    corpus: DatasetDict  # the held-out splits (the training text is not kept once tokenized)
    budget: TimeBudgetCallback
    clock: SetupClock


# ---------------------------------------------------------------------------------------------------------------------
# Tokenizer and model
# ---------------------------------------------------------------------------------------------------------------------


def build_tokenizer(recipe: ModelDataArguments, args: TransformerTrainingArguments, train, output_dir: Path):
    """The model's own tokenizer when fine-tuning; else the one of an interrupted run in `output_dir`; else the
    shared BPE of the training split (§5.1, `data.preparation.learn_tokenizer`: a capped sample, cached). The main
    process makes it and hands it to the others as text, so that no process learns it again and no machine needs
    to see the main one's files; the main process saves it in `output_dir/tokenizer`."""
    if recipe.model_name_or_path:
        return AutoTokenizer.from_pretrained(recipe.model_name_or_path)
    tokenizer, text = None, None
    if args.process_index == 0:
        tokenizer = _result_or_error(_main_tokenizer, recipe, args, train, output_dir)
        text = tokenizer if isinstance(tokenizer, Exception) else tokenizer_to_text(tokenizer)
    text = main_process_value(text)
    if isinstance(text, Exception):  # the main process failed: every process stops with its error
        raise text
    return tokenizer if tokenizer is not None else wrap_tokenizer(Tokenizer.from_str(text))


def _main_tokenizer(recipe: ModelDataArguments, args: TransformerTrainingArguments, train, output_dir: Path):
    """The main process's tokenizer: the interrupted run's, else the shared BPE (cached); saved for resuming."""
    saved = output_dir / "tokenizer"
    if (saved / "tokenizer.json").exists():
        tokenizer = AutoTokenizer.from_pretrained(saved)
    else:
        tokenizer = learn_tokenizer(
            train,
            recipe.vocab_size,
            recipe.scale_vocab_to_corpus,
            recipe.bpe_sample_pairs,
            cache_dir=recipe.data_cache_dir,
        )
    if args.should_save:
        tokenizer.save_pretrained(saved)
    return tokenizer


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
) -> PreparedRun:
    """Corpus, tokenizer, model, batches and the run's plan (its length, schedule, precision, attention, batch and
    model size; measured to fit `max_minutes` where given, taken from the checkpoint `resume` when resuming), and the
    Trainer that runs it. `started` (time.time()) is when the budget's clock started; `known` the time of an update
    the Trainer measured (a run started again with another choice), used instead of a calibration."""
    started = time.time() if started is None else started
    check_run_arguments(recipe, args)
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    clock = SetupClock(started, rank=args.process_index)
    corpus, tokenizer, train, evaluation = _prepare_data(recipe, args, output_dir, clock)
    with clock.stage("model"):
        set_seed(args.seed)  # the initial weights depend on the seed alone (Trainer seeds only after the model exists)
        model = build_model(recipe, tokenizer)
    with clock.stage("lengths and batches") as facts:
        batches = BatchSamplers(train, args.seed)
        facts["batches"] = len(batches.of(recipe.max_tokens))
    with clock.stage("plan"):
        context = _plan_context(recipe, args, model, tokenizer, train, batches, evaluation, corpus, started)
        context.known = known
        plan = plan_run(context, resume)
        if plan.preset and plan.preset != recipe.preset:  # the planner chose another size: train that one
            set_seed(args.seed)
            model = build_model(dataclasses.replace(recipe, preset=plan.preset), tokenizer)
        if plan.attn_implementation:
            model.set_attn_implementation(plan.attn_implementation)
        plan = complete_recorded_plan(plan, recipe, args, model.config.d_model)
    rules = refit_rules(recipe, args, plan, context) if plan.max_minutes else None
    budget = TimeBudgetCallback(plan.to_dict(), _deadline(plan, resume, started), rules)
    callbacks = [*_callbacks(recipe, evaluation is not None), budget, SetupClockCallback(clock, output_dir)]
    bound = rules.max_updates if rules is not None else None  # room to re-plan into
    trainer = _build_trainer(args, plan, model, tokenizer, train, evaluation, batches, callbacks, bound)
    clock.write(output_dir)
    return PreparedRun(recipe, args, plan, trainer, tokenizer, corpus, budget, clock)


def _prepare_data(recipe, args, output_dir: Path, clock: SetupClock):
    """(held-out corpus, tokenizer, tokenized training split, tokenized validation pairs or None): the corpus read
    and the training split tokenized once per machine (the machine's first process does it, the others read the
    cache), the tokenizer made once per launch. The raw training text is not kept."""
    with clock.stage("corpus"):
        corpus = _load_corpus(recipe, args)
    with clock.stage("tokenizer"):
        tokenizer = build_tokenizer(recipe, args, corpus["train"], output_dir)
    with clock.stage("tokenize") as facts:
        with args.main_process_first(local=True, desc="tokenizing"):
            folder = tokenized_folder(corpus["train"], tokenizer, recipe.max_length, recipe.data_cache_dir)
            facts["tokenized_here"] = folder is None or not folder.exists()
            encoded = tokenize_corpus(
                corpus, tokenizer, recipe.max_length, recipe.data_cache_dir, recipe.preprocessing_num_workers
            )
        facts["pairs"] = len(encoded["train"])
    held_out = DatasetDict({name: split for name, split in corpus.items() if name != "train"})
    return held_out, tokenizer, encoded["train"], _validation_split(recipe, encoded)


class BatchSamplers:
    """One token-budget batch sampler per batch size over the training split's length columns, built once and
    shared by the planner (calibration, epoch sizes) and the Trainer. Every size shares one array of the pairs'
    length groups (2 bytes a pair), made from the memory-mapped length columns a record batch at a time: the
    lengths are never copied."""

    def __init__(self, train, seed: int):
        self.groups = LengthSortedSampler.of_chunks(*length_chunks(train), seed=seed)
        self.samplers: dict[int, TokenBudgetBatchSampler] = {}

    def of(self, max_tokens: int) -> TokenBudgetBatchSampler:
        if max_tokens not in self.samplers:
            self.samplers[max_tokens] = TokenBudgetBatchSampler.over(self.groups, max_tokens)
        return self.samplers[max_tokens]


def _load_corpus(recipe: ModelDataArguments, args: TransformerTrainingArguments) -> DatasetDict:
    """The corpus, with validation and test pairs held out of the training split where none are given; each
    machine's first process fetches or reads it into the cache, then the others read it instead of racing it to
    the same files."""
    with args.main_process_first(local=True, desc="corpus"):
        try:
            corpus = load_corpus(
                recipe.dataset,
                recipe.source_lang,
                recipe.target_lang,
                recipe.data_files,
                recipe.validation_files,
                recipe.test_files,
                recipe.data_cache_dir,
                recipe.wmt14_dir,
            )
        except (ValueError, UnicodeDecodeError) as error:  # a bad file or language: one line naming it
            raise CorpusError(str(error)) from error
    return hold_out(corpus)


def _validation_split(recipe: ModelDataArguments, encoded: DatasetDict):
    """The validation pairs evaluated during training (at most `max_eval_samples`), or None."""
    evaluation = encoded.get("validation")
    if evaluation is not None and recipe.max_eval_samples is not None:
        evaluation = evaluation.select(range(min(recipe.max_eval_samples, len(evaluation))))
    return evaluation


def _plan_context(recipe, args, model, tokenizer, train, batches, evaluation, corpus, started) -> PlanContext:
    """What the planner reads: real batches of the training split (a spread of 12 for calibration), the epoch's
    updates at a batch size, the held-out splits' sizes, and a way to build the recipe's other presets."""
    collator = training_collator(tokenizer, model, args)
    multiple = pad_multiple(training_device(args))

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
        return build_model(dataclasses.replace(recipe, preset=preset), tokenizer)

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
    plan = main_process_value(_result_or_error(new_plan, context))
    if isinstance(plan, Exception):  # the main process failed: every process stops with its error
        raise plan
    if args.should_save:
        write_json_atomically(Path(args.output_dir) / BUDGET_FILE, plan.to_dict())
    return plan


def _result_or_error(function, *arguments):
    """`function(*arguments)`, or the exception it raised: a process that fails before a collective still joins it
    (every process must), and every process then raises the main process's error."""
    try:
        return function(*arguments)
    except Exception as error:
        return error


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


def _callbacks(recipe: ModelDataArguments, validates: bool) -> list:
    """The recipe's own callbacks: timed checkpoints, and the source check where there are validation pairs."""
    callbacks = [SaveEveryCallback(recipe.save_minutes)] if recipe.save_minutes else []
    if validates and recipe.source_check != "off":
        callbacks.append(SourceCheckCallback(recipe.source_check))
    return callbacks


def _build_trainer(args, plan, model, tokenizer, train, evaluation, batches, callbacks, bound) -> TransformerTrainer:
    """The Trainer of the plan: the user's arguments with the plan's values (a copy), token-budget batches of the
    plan's size, validation BLEU, and the progress line instead of the plain bar."""
    planned = trainer_arguments(args, plan, model.config.d_model, max_steps=bound)
    sampler = batches.of(plan.max_tokens)
    trainer = TransformerTrainer(
        model=model,
        args=planned,
        train_dataset=train,
        eval_dataset=evaluation,
        data_collator=training_collator(tokenizer, model, args),
        processing_class=tokenizer,
        compute_metrics=seq2seq_bleu_metrics(tokenizer),
        batch_sampler=sampler,
        callbacks=callbacks,
        source_check=any(isinstance(callback, SourceCheckCallback) for callback in callbacks),
    )
    if trainer.pop_callback(ProgressCallback) is not None:
        trainer.add_callback(TrainingProgressCallback(plan.seconds_per_update if plan.max_minutes else None))
    logger.info(
        "%d training pairs in %d batches of ~%.0f padded tokens; %d accumulation steps; peak lr %.2e",
        len(train),
        len(sampler),
        sampler.tokens_per_batch(),
        planned.gradient_accumulation_steps,
        planned.learning_rate * noam_factor(int(planned.warmup_steps), int(planned.warmup_steps)),
    )
    return trainer
