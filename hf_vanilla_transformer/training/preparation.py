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
import time
from dataclasses import dataclass
from pathlib import Path

from datasets import DatasetDict
from transformers import (
    AutoTokenizer,
    DataCollatorForSeq2Seq,
    PreTrainedTokenizerFast,
    ProgressCallback,
    set_seed,
)

from ..data.batching import TokenBudgetBatchSampler
from ..data.corpora import load_corpus
from ..data.errors import CorpusError
from ..data.tokenizer import check_special_tokens, corpus_texts, tokenize_corpus, train_bpe_tokenizer
from ..evaluation.metrics import seq2seq_bleu_metrics
from ..model.configuration_vanilla_transformer import VanillaTransformerConfig
from ..model.modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from ..utils.distributed import main_process_value
from ..utils.files import write_json_atomically
from .arguments import ModelDataArguments, TransformerTrainingArguments, check_run_arguments, parse_config_overrides
from .calibration import calibration_batches
from .callbacks import SaveEveryCallback, TimeBudgetCallback, TrainingProgressCallback
from .planning import (
    BUDGET_FILE,
    FINISHING_SECONDS,
    BudgetPlan,
    PlanContext,
    complete_recorded_plan,
    new_plan,
    recorded_plan,
    trainer_arguments,
    updates_per_epoch,
)
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
    corpus: DatasetDict
    budget: TimeBudgetCallback


# ---------------------------------------------------------------------------------------------------------------------
# Tokenizer and model
# ---------------------------------------------------------------------------------------------------------------------


def build_tokenizer(
    recipe: ModelDataArguments, corpus: DatasetDict, output_dir: Path, save: bool = True
) -> PreTrainedTokenizerFast:
    """The model's own tokenizer when fine-tuning; else the one of an interrupted run in `output_dir`; else a new
    shared BPE learned on the training split (§5.1), saved in `output_dir` when `save` (the main process)."""
    if recipe.model_name_or_path:
        return AutoTokenizer.from_pretrained(recipe.model_name_or_path)
    saved = output_dir / "tokenizer"
    if (saved / "tokenizer.json").exists():
        return AutoTokenizer.from_pretrained(saved)
    vocab_size = vocab_size_for(recipe, corpus["train"])
    if vocab_size != recipe.vocab_size:
        logger.info(
            "vocabulary %d instead of %d: the training split has too few distinct words", vocab_size, recipe.vocab_size
        )
    tokenizer = train_bpe_tokenizer(corpus_texts(corpus, "train"), vocab_size=vocab_size)
    if save:
        tokenizer.save_pretrained(saved)
    return tokenizer


def vocab_size_for(recipe: ModelDataArguments, train) -> int:
    """The vocabulary to learn: `vocab_size`, capped by corpus size when `scale_vocab_to_corpus` (a quarter of the
    distinct whitespace-separated words of both sides, rounded down to 500, at least 1000: the LibreOffice help
    EN-DE has 60,788, so the CPU recipe's 8,000 stand; 200 pairs have 1,502)."""
    if not recipe.scale_vocab_to_corpus:
        return recipe.vocab_size
    words = set()
    for batch in train.iter(batch_size=5000):
        for text in batch["source"] + batch["target"]:
            words.update(text.split())
    return min(recipe.vocab_size, max(1000, len(words) // 4 // 500 * 500))


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
) -> PreparedRun:
    """Corpus, tokenizer, model, batches and the run's plan (its length, schedule, precision, attention, batch and
    model size; measured to fit `max_minutes` where given, taken from the checkpoint `resume` when resuming), and the
    Trainer that runs it. `started` (time.time()) is when the budget's clock started."""
    started = time.time() if started is None else started
    check_run_arguments(recipe, args)
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    corpus = _load_corpus(recipe, args)
    # The main process learns and saves the tokenizer; the others load it where they can see it, else learn the
    # same one (BPE learning is deterministic) without writing it.
    with args.main_process_first(local=False, desc="tokenizer"):
        tokenizer = build_tokenizer(recipe, corpus, output_dir, save=args.should_save)
    encoded = tokenize_corpus(corpus, tokenizer, max_length=recipe.max_length)
    set_seed(args.seed)  # the initial weights depend on the seed alone (Trainer seeds only after the model exists)
    model = build_model(recipe, tokenizer)
    train, evaluation = encoded["train"], _validation_split(recipe, encoded)
    context = _plan_context(recipe, args, model, tokenizer, train, evaluation, corpus, started)
    plan = plan_run(context, resume)
    if plan.preset and plan.preset != recipe.preset:  # the planner chose another size: train that one
        set_seed(args.seed)
        model = build_model(dataclasses.replace(recipe, preset=plan.preset), tokenizer)
    if plan.attn_implementation:
        model.set_attn_implementation(plan.attn_implementation)
    plan = complete_recorded_plan(plan, recipe, args, model.config.d_model)
    budget = TimeBudgetCallback(plan.to_dict(), deadline_seconds=_deadline(plan, resume, started))
    trainer = _build_trainer(args, plan, model, tokenizer, train, evaluation, [*_callbacks(recipe), budget])
    return PreparedRun(recipe, args, plan, trainer, tokenizer, corpus, budget)


def _load_corpus(recipe: ModelDataArguments, args: TransformerTrainingArguments) -> DatasetDict:
    """The corpus; each machine's first process fetches it into its cache, then the others read it instead of
    racing it to the same files."""
    with args.main_process_first(local=True, desc="corpus"):
        try:
            return load_corpus(
                recipe.dataset,
                recipe.source_lang,
                recipe.target_lang,
                recipe.data_files,
                recipe.validation_files,
                recipe.test_files,
                recipe.data_cache_dir,
            )
        except (ValueError, UnicodeDecodeError) as error:  # a bad file or language: one line naming it
            raise CorpusError(str(error)) from error


def _validation_split(recipe: ModelDataArguments, encoded: DatasetDict):
    """The validation pairs evaluated during training (at most `max_eval_samples`), or None."""
    evaluation = encoded.get("validation")
    if evaluation is not None and recipe.max_eval_samples is not None:
        evaluation = evaluation.select(range(min(recipe.max_eval_samples, len(evaluation))))
    return evaluation


def _batches(train, max_tokens: int, seed: int) -> TokenBudgetBatchSampler:
    source_lengths, target_lengths = [len(ids) for ids in train["input_ids"]], [len(ids) for ids in train["labels"]]
    return TokenBudgetBatchSampler(source_lengths, target_lengths, max_tokens=max_tokens, seed=seed)


def _plan_context(recipe, args, model, tokenizer, train, evaluation, corpus, started) -> PlanContext:
    """What the planner reads: real batches of the training split (a spread of 12 for calibration), the epoch's
    updates at a batch size, the held-out splits' sizes, and a way to build the recipe's other presets."""
    collator = DataCollatorForSeq2Seq(tokenizer, model=model)

    def sample_batches(max_tokens: int) -> list[dict]:
        chosen = calibration_batches(list(iter(_batches(train, max_tokens, args.seed))), count=12)
        return [collator([{k: train[i][k] for k in ("input_ids", "labels")} for i in batch]) for batch in chosen]

    def epoch_updates(max_tokens: int, accumulation: int) -> int:
        return updates_per_epoch(_batches(train, max_tokens, args.seed), accumulation, args.world_size)

    def build(preset: str) -> VanillaTransformerForConditionalGeneration:
        return build_model(dataclasses.replace(recipe, preset=preset), tokenizer)

    test = corpus["test"] if "test" in corpus else corpus.get("validation", [])
    validation_pairs = len(evaluation) if evaluation is not None else None
    return PlanContext(
        recipe, args, model, sample_batches, epoch_updates, validation_pairs, len(test), started, build=build
    )


def plan_run(context: PlanContext, resume: str | None = None) -> BudgetPlan:
    """The run's plan: the recorded one when resuming a run that has one; else measured (where the budget or an
    `auto` choice asks for it) and computed. Under several processes every process measures (as they will train,
    side by side) and the main process's plan is the one all of them follow."""
    args = context.args
    if resume is not None or context.budgeted:
        kept = recorded_plan(args.output_dir, resume)
        if kept is not None:
            logger.info("keeping the plan of the run being resumed: %s", kept.summary())
            return kept
    plan = main_process_value(new_plan(context))
    if args.should_save:
        write_json_atomically(Path(args.output_dir) / BUDGET_FILE, plan.to_dict())
    return plan


def _deadline(plan: BudgetPlan, resume: str | None, started: float) -> float | None:
    """Seconds from now by which a budgeted run's training must end, in time for the test decoding; None for a
    given length or a resumed run (its budget was spent by the interrupted one)."""
    if not plan.max_minutes or resume is not None:
        return None
    return plan.max_minutes * 60 - (time.time() - started) - plan.predicted_decode_seconds - FINISHING_SECONDS


def _callbacks(recipe: ModelDataArguments) -> list:
    return [SaveEveryCallback(recipe.save_minutes)] if recipe.save_minutes else []


def _build_trainer(args, plan, model, tokenizer, train, evaluation, callbacks) -> TransformerTrainer:
    """The Trainer of the plan: the user's arguments with the plan's values (a copy), token-budget batches of the
    plan's size, validation BLEU, and the progress line instead of the plain bar."""
    planned = trainer_arguments(args, plan, model.config.d_model)
    sampler = _batches(train, plan.max_tokens, args.seed)
    trainer = TransformerTrainer(
        model=model,
        args=planned,
        train_dataset=train,
        eval_dataset=evaluation,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
        processing_class=tokenizer,
        compute_metrics=seq2seq_bleu_metrics(tokenizer),
        batch_sampler=sampler,
        callbacks=callbacks,
    )
    if trainer.pop_callback(ProgressCallback) is not None:
        trainer.add_callback(TrainingProgressCallback())
    logger.info(
        "%d training pairs in %d batches of ~%.0f padded tokens; %d accumulation steps; peak lr %.2e",
        len(train),
        len(sampler),
        sampler.tokens_per_batch(),
        planned.gradient_accumulation_steps,
        planned.learning_rate * noam_factor(int(planned.warmup_steps), int(planned.warmup_steps)),
    )
    return trainer
