"""The paper's training recipe (§5) through `transformers.Seq2SeqTrainer`.

* Adam with beta1 0.9, beta2 0.98, epsilon 1e-9, no weight decay, no gradient clipping (§5.3);
* lrate = lr_scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), step counted from 1 (§5.3);
* label smoothing 0.1 (§5.4) in the model's loss, normalised by the target tokens of the whole update across
  processes and accumulation steps (`Trainer`'s `num_items_in_batch`);
* batches of about N source + N target tokens by approximate length (§5.1), `gradient_accumulation_steps`
  chosen so that an update holds `tokens_per_update` tokens;
* checkpoints every `save_minutes` (the paper: 10) or every `save_steps`; evaluation with beam search.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import json
import logging
import math
import os
import sys
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch
from accelerate.utils import broadcast_object_list
from datasets import DatasetDict
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data import DataLoader
from transformers import (
    AutoTokenizer,
    DataCollatorForSeq2Seq,
    PreTrainedTokenizerFast,
    ProgressCallback,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    TrainerCallback,
    set_seed,
)
from transformers.utils import logging as hf_logging

from .averaging import AVERAGE_WINDOW, COMPLETE, average_last_checkpoints, checkpoint_folders, checkpoint_step
from .batching import TokenBudgetBatchSampler
from .budget import (
    BUDGET_FILE,
    FINISHING_SECONDS,
    BudgetPlan,
    TimeBudgetCallback,
    accumulation_for,
    apply_plan,
    cpu_has_fast_bf16,  # noqa: F401 (its import path before budget.py)
    new_plan,
    recorded_plan,
)
from .configuration_vanilla_transformer import PRESETS, VanillaTransformerConfig
from .data import CorpusError, load_corpus
from .metrics import seq2seq_bleu_metrics
from .modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from .tokenization import check_special_tokens, corpus_texts, tokenize_corpus, train_bpe_tokenizer


logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------------------------------------


@dataclass
class ModelDataArguments:
    """What to train and on what: model size, corpus, vocabulary, sequence limits."""

    preset: str = field(default="small", metadata={"help": f"Model size: one of {sorted(PRESETS)}."})
    model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "Fine-tune this saved model (folder or Hub id) with its own tokenizer instead of a preset."},
    )
    dataset: str = field(
        default="libreoffice-help",
        metadata={"help": "libreoffice-help (default), libreoffice-ui, or wmt14 (needs the Hugging Face Hub)."},
    )
    source_lang: str = field(default="en", metadata={"help": "Source language code."})
    target_lang: str = field(default="de", metadata={"help": "Target language code (e.g. de, fr)."})
    data_files: str | None = field(
        default=None, metadata={"help": "Local training pairs: a TSV, a JSONL, or 'src.txt,tgt.txt'."}
    )
    validation_files: str | None = field(default=None, metadata={"help": "Local validation pairs, as data_files."})
    test_files: str | None = field(default=None, metadata={"help": "Local test pairs, as data_files."})
    data_cache_dir: str | None = field(default=None, metadata={"help": "Where corpora are cached."})
    vocab_size: int = field(default=8000, metadata={"help": "Size of the shared BPE vocabulary (§5.1)."})
    max_length: int = field(default=256, metadata={"help": "Training pairs longer than this (tokens) are dropped."})
    max_tokens: int = field(
        default=4096, metadata={"help": "Padded source tokens (and as many target tokens) per batch (§5.1)."}
    )
    tokens_per_update: int | None = field(
        default=None,
        metadata={"help": "Source tokens per update; sets gradient accumulation (the paper: 25000 per step)."},
    )
    lr_scale: float = field(default=1.0, metadata={"help": "Factor on the §5.3 learning-rate schedule."})
    dropout: float | None = field(default=None, metadata={"help": "Override P_drop of the preset."})
    label_smoothing: float | None = field(default=None, metadata={"help": "Override epsilon_ls (0.1)."})
    save_minutes: float | None = field(
        default=None, metadata={"help": "Also save a checkpoint every this many minutes (the paper: 10)."}
    )
    average_last: int = field(
        default=5, metadata={"help": "Average the last N checkpoints into the final model (§6.1); 1 keeps the last."}
    )
    max_eval_samples: int | None = field(
        default=None, metadata={"help": "Evaluate on at most this many validation pairs during training."}
    )
    test_beams: int = field(default=4, metadata={"help": "Beam size for the final test evaluation (§6.1: 4)."})
    attn_implementation: str | None = field(
        default=None,
        metadata={
            "help": "eager, sdpa or flash_attention_2 (default: transformers' choice, sdpa); auto: the faster of eager "
            "and sdpa, measured on this machine before training."
        },
    )
    recipe: str | None = field(
        default=None,
        metadata={"help": "A recipe file (cpu, base, big in configs/recipes/, or a path); flags override its values."},
    )
    max_minutes: float | None = field(
        default=None,
        metadata={
            "help": "Time budget of the whole run in minutes (set-up, training, test decoding): the number of updates "
            "is measured to fit it, unless --max_steps is given."
        },
    )
    precision: str | None = field(
        default=None,
        metadata={
            "help": "bf16 or fp32 (default: --bf16); auto: bf16 autocast where it measures faster (CPUs with bf16 "
            "matrix units only), else fp32. An explicit --bf16 overrides auto.",
            "choices": ["auto", "bf16", "fp32"],
        },
    )
    peak_learning_rate: float | None = field(
        default=None,
        metadata={"help": "Scale the §5.3 schedule so that it peaks at this rate (sets lr_scale from the warmup)."},
    )
    checkpoints_per_run: int | None = field(
        default=None, metadata={"help": "Save this many evenly spaced checkpoints over the run (instead of save_steps)."}
    )
    evaluations_per_run: int | None = field(
        default=None, metadata={"help": "Validate this many times over the run (instead of eval_steps)."}
    )
    max_tokens_choices: str | None = field(
        default=None,
        metadata={
            "help": "Comma-separated max_tokens to choose from by measured speed (e.g. 2048,1024): the largest that "
            "still gives --min_updates updates in the budget, else the smallest."
        },
    )
    min_updates: int | None = field(
        default=None, metadata={"help": "With --max_tokens_choices: the updates a budgeted run should reach."}
    )
    max_warmup_fraction: float | None = field(
        default=None, metadata={"help": "Never warm up for more than this fraction of the run."}
    )
    max_epochs: float | None = field(
        default=None, metadata={"help": "Never plan more updates than this many epochs of the training split."}
    )
    average_window: float = field(
        default=AVERAGE_WINDOW,
        metadata={"help": "Average only checkpoints from this last fraction of the run (the last one always)."},
    )
    scale_vocab_to_corpus: bool = field(
        default=False,
        metadata={
            "help": "Cap vocab_size at a quarter of the training split's distinct words (rounded down to 500, at least "
            "1000): a small corpus cannot fill a large vocabulary."
        },
    )


@dataclass
class TransformerTrainingArguments(Seq2SeqTrainingArguments):
    """`Seq2SeqTrainingArguments` with the paper's defaults (§5.3) instead of transformers' ones."""

    output_dir: str | None = field(default="runs/transformer", metadata={"help": "Where checkpoints and the model go."})
    adam_beta2: float = field(default=0.98, metadata={"help": "Adam beta2 (§5.3: 0.98)."})
    adam_epsilon: float = field(default=1e-9, metadata={"help": "Adam epsilon (§5.3: 1e-9)."})
    weight_decay: float = field(default=0.0, metadata={"help": "No weight decay in the paper."})
    max_grad_norm: float = field(default=0.0, metadata={"help": "No gradient clipping in the paper (0 = off)."})
    warmup_steps: float = field(
        default=4000, metadata={"help": "Warmup updates of the §5.3 schedule (4000); below 1, a fraction of the run."}
    )
    logging_steps: float = field(default=50, metadata={"help": "Log every N updates."})
    save_steps: float = field(default=1000, metadata={"help": "Save a checkpoint every N updates."})
    predict_with_generate: bool = field(default=True, metadata={"help": "Evaluate BLEU with generate()."})
    generation_num_beams: int | None = field(default=4, metadata={"help": "Beams for evaluation (§6.1: 4)."})
    dataloader_num_workers: int = field(default=0, metadata={"help": "Data loading workers."})
    per_device_eval_batch_size: int = field(default=64, metadata={"help": "Sentences per evaluation batch."})
    ddp_find_unused_parameters: bool | None = field(
        default=False, metadata={"help": "Every parameter gets a gradient; DDP need not search for unused ones."}
    )
    include_num_input_tokens_seen: str = field(  # a str on the command line (transformers' str | bool reads bools)
        default="non_padding",
        metadata={
            "help": "Count the source tokens trained on: non_padding (for the progress line's tokens/s), all or no.",
            "choices": ["non_padding", "all", "no"],
        },
    )


# ---------------------------------------------------------------------------------------------------------------------
# Schedule, callbacks, trainer
# ---------------------------------------------------------------------------------------------------------------------


def noam_factor(step: int, warmup_steps: int) -> float:
    """min(step^-0.5, step * warmup^-1.5) for the optimizer's `step`-th update (1-based), §5.3 eq. 3."""
    step = max(step, 1)
    return min(step**-0.5, step * warmup_steps**-1.5)


def noam_schedule(optimizer: torch.optim.Optimizer, warmup_steps: int) -> LambdaLR:
    """LambdaLR whose factor at scheduler step s (0 before the first update) is that of update s + 1."""
    if warmup_steps < 1:
        raise ValueError(f"warmup_steps={warmup_steps} is invalid; the §5.3 schedule needs at least 1.")
    return LambdaLR(optimizer, partial(_noam_lambda, warmup_steps=int(warmup_steps)))


def _noam_lambda(step: int, warmup_steps: int) -> float:
    return noam_factor(step + 1, warmup_steps)


class SaveEveryCallback(TrainerCallback):
    """Save a checkpoint whenever `minutes` have passed since the last one (§6.1: every 10 minutes).

    The decision is the main process's, broadcast to the others, so that every process saves at the same step.
    """

    def __init__(self, minutes: float):
        if minutes <= 0:
            raise ValueError(f"save_minutes={minutes} is invalid; expected a positive number of minutes.")
        self.seconds = minutes * 60
        self.last = time.monotonic()

    def on_step_end(self, args, state, control, **kwargs):
        due = time.monotonic() - self.last >= self.seconds
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            flag = torch.tensor([int(due)], device=args.device)
            torch.distributed.broadcast(flag, src=0)
            due = bool(flag.item())
        if due:
            control.should_save = True
        return control

    def on_save(self, args, state, control, **kwargs):
        self.last = time.monotonic()


class TrainingProgressCallback(ProgressCallback):
    """The progress bar, with one readable line per log instead of a dict: update, loss, learning rate, source
    tokens per second (padding excluded, all processes), validation BLEU when there is one, time so far and left."""

    def on_train_begin(self, args, state, control, **kwargs):
        super().on_train_begin(args, state, control, **kwargs)
        now = time.monotonic()
        self.started = (now, state.global_step)  # for the time left
        self.last = (now, _tokens_seen(state))  # at the last training-loss line: for tokens/s

    def on_evaluate(self, args, state, control, **kwargs):
        super().on_evaluate(args, state, control, **kwargs)
        self.last = (time.monotonic(), _tokens_seen(state))  # tokens/s counts training time only

    def on_save(self, args, state, control, **kwargs):
        super().on_save(args, state, control, **kwargs)
        self.last = (time.monotonic(), _tokens_seen(state))

    def on_prediction_step(self, args, state, control, eval_dataloader=None, **kwargs):
        # Under the training bar, the validation bar is drawn one line below and erased when done by moving the
        # cursor up; in a log file (no terminal) that leaves "\x1b[A" behind, so there validation runs without one.
        if self.training_bar is not None and not sys.stderr.isatty():
            return
        super().on_prediction_step(args, state, control, eval_dataloader=eval_dataloader, **kwargs)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or self.training_bar is None or not logs:
            return
        now, step, tokens = time.monotonic(), state.global_step, _tokens_seen(state)
        parts = [f"update {step}/{state.max_steps}"]
        if "loss" in logs:
            parts.append(f"loss {logs['loss']:.3f}")
        if "learning_rate" in logs:
            parts.append(f"lr {logs['learning_rate']:.2e}")
        if "eval_bleu" in logs:
            parts.append(f"validation BLEU {logs['eval_bleu']:.1f} (loss {logs.get('eval_loss', float('nan')):.3f})")
        last_time, last_tokens = self.last
        if now > last_time and tokens > last_tokens:
            parts.append(f"{(tokens - last_tokens) / (now - last_time):,.0f} source tok/s")
        started_time, started_step = self.started
        elapsed = now - started_time
        if step > started_step:
            left = elapsed / (step - started_step) * (state.max_steps - step)
            parts.append(f"{elapsed / 60:.1f} min, {left / 60:.1f} min left")
        if "loss" in logs:
            self.last = (now, tokens)
        self.training_bar.write(" | ".join(parts))


@contextlib.contextmanager
def _without_nested_bars():
    """No transformers progress bars (such as save_pretrained's "Writing model shards") inside the training bar when
    the output is a log file: placed one line below it, they move the cursor up and leave "\x1b[A" behind."""
    if sys.stderr.isatty() or not hf_logging.is_progress_bar_enabled():
        yield
        return
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.enable_progress_bar()


def _tokens_seen(state) -> int:
    return int(getattr(state, "num_input_tokens_seen", 0) or 0)


class CheckpointError(RuntimeError):
    """A checkpoint is incomplete or corrupted; the message names the file."""


def validate_checkpoint(folder: str | Path) -> Path:
    """Raise `CheckpointError` naming the file if `folder` is not a complete, readable checkpoint of this package."""
    from safetensors import safe_open

    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"{folder} is not a checkpoint folder.")
    if not (folder / COMPLETE).exists():
        raise CheckpointError(
            f"{folder / COMPLETE} is missing: the checkpoint was interrupted while being written. Resume from an "
            "earlier one, or leave out --resume_from_checkpoint to take the newest complete one."
        )
    for name in ("config.json", "trainer_state.json"):
        try:
            json.loads((folder / name).read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise CheckpointError(f"{folder / name} cannot be read: {error}") from error
    try:
        with safe_open(str(folder / "model.safetensors"), framework="pt") as handle:
            for key in handle.keys():  # noqa: SIM118 (safe_open handles are not containers)
                handle.get_slice(key)
    except Exception as error:
        raise CheckpointError(f"{folder / 'model.safetensors'} is corrupted or truncated: {error}") from error
    for path in sorted(folder.glob("*.pt")) + sorted(folder.glob("*.pth")):
        try:  # memory-mapped: the archive and its index are checked, the tensors not read (Trainer reads them next)
            torch.load(path, map_location="cpu", weights_only=False, mmap=True)
        except Exception as error:
            raise CheckpointError(f"{path} is corrupted or truncated: {error}") from error
    return folder


class TransformerTrainer(Seq2SeqTrainer):
    """`Seq2SeqTrainer` with token-budget batches (§5.1) and the §5.3 learning-rate schedule.

    `batch_sampler` (a `TokenBudgetBatchSampler`) replaces the fixed batch size for training; evaluation batches
    are sorted by length too, so that beam search wastes little on padding.
    """

    def __init__(self, *args, batch_sampler: TokenBudgetBatchSampler | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.batch_sampler = batch_sampler

    def get_train_dataloader(self) -> DataLoader:
        if self.batch_sampler is None:
            return super().get_train_dataloader()
        dataset = self._remove_unused_columns(self.train_dataset, description="Training")
        loader = DataLoader(
            dataset,
            batch_sampler=self.batch_sampler,
            collate_fn=self.data_collator,
            num_workers=self.args.dataloader_num_workers,
            pin_memory=self.args.dataloader_pin_memory and torch.cuda.is_available(),
        )
        # accelerate gives each process every num_processes-th batch; Trainer calls set_epoch on our sampler.
        return self.accelerator.prepare(loader)

    def get_eval_dataloader(self, eval_dataset=None) -> DataLoader:
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if isinstance(dataset, str) or dataset is None or "input_ids" not in dataset.column_names:
            return super().get_eval_dataloader(eval_dataset)
        dataset = self._remove_unused_columns(dataset, description="Evaluation")
        lengths = [len(ids) for ids in dataset["input_ids"]]
        budget = self.args.per_device_eval_batch_size * max(1, int(sum(lengths) / len(lengths)))
        sampler = TokenBudgetBatchSampler(lengths, lengths, max_tokens=budget, shuffle=False)
        loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=self.data_collator)
        return self.accelerator.prepare(loader)

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None, **gen_kwargs):
        # Seq2SeqTrainer fills the model's generation config with transformers' global defaults (max_length 20, ...)
        # in place; every checkpoint would then carry them. Evaluate on a copy and keep the model's own config.
        generation_config = copy.deepcopy(self.model.generation_config)
        try:
            return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys, **gen_kwargs)
        finally:
            self.model.generation_config = generation_config

    def _save_checkpoint(self, model, trial) -> None:
        """`Trainer`'s checkpoint, then a `.complete` marker once every process has written its part, so that a
        checkpoint interrupted at any moment (SIGKILL included) is never mistaken for a complete one."""
        with _without_nested_bars():
            super()._save_checkpoint(model, trial)
        folder = Path(self._get_output_dir(trial=trial)) / f"checkpoint-{self.state.global_step}"
        self.accelerator.wait_for_everyone()
        if self.args.should_save:
            temporary = folder / (COMPLETE + ".tmp")
            temporary.write_text(f"{self.state.global_step}\n")
            os.replace(temporary, folder / COMPLETE)
        self.accelerator.wait_for_everyone()

    def create_scheduler(self, num_training_steps: int, optimizer: torch.optim.Optimizer | None = None):
        if self.lr_scheduler is None:
            optimizer = optimizer if optimizer is not None else self.optimizer
            self.lr_scheduler = noam_schedule(optimizer, int(self.args.warmup_steps))
            self._created_lr_scheduler = True
        return self.lr_scheduler


# ---------------------------------------------------------------------------------------------------------------------
# The pipeline: corpus -> tokenizer -> model -> Trainer
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
        logger.info("vocabulary %d instead of %d: the training split has too few distinct words", vocab_size,
                    recipe.vocab_size)
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
    overrides = {}
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
    if recipe.attn_implementation and recipe.attn_implementation != "auto":  # auto: measured in plan_run
        model.set_attn_implementation(recipe.attn_implementation)
    check_special_tokens(tokenizer, model.config)
    return model


def check_schedule_arguments(args: TransformerTrainingArguments) -> None:
    """The §5.3 schedule sets the learning rate at every step; refuse the Trainer flags it would silently ignore."""
    default_rate = TransformerTrainingArguments.__dataclass_fields__["learning_rate"].default
    if args.learning_rate != default_rate:
        raise ValueError(
            f"learning_rate={args.learning_rate} is not used: the §5.3 schedule sets the rate from d_model and "
            "warmup_steps. Scale it with --lr_scale (peak = lr_scale * d_model^-0.5 * warmup_steps^-0.5)."
        )
    if args.lr_scheduler_type != "linear":  # a str enum after TrainingArguments.__post_init__
        raise ValueError(
            f"lr_scheduler_type={args.lr_scheduler_type!r} is not supported: training always uses the §5.3 schedule "
            "(warmup_steps, lr_scale)."
        )


def prepare_run(
    recipe: ModelDataArguments,
    args: TransformerTrainingArguments,
    resume: str | None = None,
    started: float | None = None,
):
    """Everything `Trainer` needs, built from the two argument dataclasses: corpus, tokenizer, model, batches, and
    the run's plan (its length, schedule, precision and attention; measured to fit `max_minutes` where given, taken
    from the checkpoint `resume` when resuming). `started` (time.time()) is when the budget's clock started.

    Returns (trainer, tokenizer, corpus); the plan is `trainer.plan`."""
    started = time.time() if started is None else started
    check_schedule_arguments(args)
    check_recipe_arguments(recipe)
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    # Each machine's first process fetches the corpus into its cache, then the others read it instead of racing it
    # to the same files. The main process learns and saves the tokenizer; the others load it where they can see
    # it, else learn the same one (BPE learning is deterministic) without writing it.
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
            )
        except (ValueError, UnicodeDecodeError) as error:  # a bad file or language: one line naming it
            raise CorpusError(str(error)) from error
    with args.main_process_first(local=False, desc="tokenizer"):
        tokenizer = build_tokenizer(recipe, corpus, output_dir, save=args.should_save)
    encoded = tokenize_corpus(corpus, tokenizer, max_length=recipe.max_length)
    set_seed(args.seed)  # the initial weights depend on the seed alone (Trainer seeds only after the model exists)
    model = build_model(recipe, tokenizer)

    train = encoded["train"]
    source_lengths, target_lengths = [len(ids) for ids in train["input_ids"]], [len(ids) for ids in train["labels"]]

    def batches_of(max_tokens: int) -> TokenBudgetBatchSampler:
        return TokenBudgetBatchSampler(source_lengths, target_lengths, max_tokens=max_tokens, seed=args.seed)

    collator = DataCollatorForSeq2Seq(tokenizer, model=model)
    evaluation = encoded.get("validation")
    if evaluation is not None and recipe.max_eval_samples is not None:
        evaluation = evaluation.select(range(min(recipe.max_eval_samples, len(evaluation))))
    test_pairs = len(corpus["test"] if "test" in corpus else corpus.get("validation", []))
    plan = plan_run(recipe, args, model, train, batches_of, collator, evaluation, test_pairs, resume, started)
    apply_plan(plan, recipe, args, model)
    sampler = batches_of(recipe.max_tokens)
    args.gradient_accumulation_steps = accumulation_for(recipe, args, recipe.max_tokens)

    callbacks = [SaveEveryCallback(recipe.save_minutes)] if recipe.save_minutes else []
    deadline = None
    if plan.max_minutes and resume is None:  # the run's training must end in time for the test decoding
        deadline = plan.max_minutes * 60 - (time.time() - started) - plan.predicted_decode_seconds - FINISHING_SECONDS
    callbacks.append(TimeBudgetCallback(plan.to_dict(), deadline_seconds=deadline))
    trainer = TransformerTrainer(
        model=model,
        args=args,
        train_dataset=train,
        eval_dataset=evaluation,
        data_collator=collator,
        processing_class=tokenizer,
        compute_metrics=seq2seq_bleu_metrics(tokenizer),
        batch_sampler=sampler,
        callbacks=callbacks,
    )
    trainer.plan = plan
    if trainer.pop_callback(ProgressCallback) is not None:
        trainer.add_callback(TrainingProgressCallback())
    logger.info(
        "%d training pairs in %d batches of ~%.0f padded tokens; %d accumulation steps; peak lr %.2e",
        len(train),
        len(sampler),
        sampler.tokens_per_batch(),
        args.gradient_accumulation_steps,
        args.learning_rate * noam_factor(int(args.warmup_steps), int(args.warmup_steps)),
    )
    return trainer, tokenizer, corpus


def check_recipe_arguments(recipe: ModelDataArguments) -> None:
    """Raise a ValueError naming the value for recipe fields out of range."""
    if recipe.max_minutes is not None and recipe.max_minutes <= 0:
        raise ValueError(f"max_minutes={recipe.max_minutes:g} is invalid; expected a positive number of minutes.")
    if recipe.peak_learning_rate is not None and recipe.peak_learning_rate <= 0:
        raise ValueError(f"peak_learning_rate={recipe.peak_learning_rate} is invalid; expected a positive rate.")
    for name in ("checkpoints_per_run", "evaluations_per_run"):
        value = getattr(recipe, name)
        if value is not None and value < 1:
            raise ValueError(f"{name}={value} is invalid; expected at least 1.")
    if recipe.min_updates is not None and recipe.min_updates < 1:
        raise ValueError(f"min_updates={recipe.min_updates} is invalid; expected at least 1.")
    if recipe.max_warmup_fraction is not None and not 0 < recipe.max_warmup_fraction <= 1:
        raise ValueError(f"max_warmup_fraction={recipe.max_warmup_fraction} is invalid; expected a fraction in (0, 1].")
    if recipe.max_epochs is not None and recipe.max_epochs <= 0:
        raise ValueError(f"max_epochs={recipe.max_epochs} is invalid; expected a positive number of epochs.")
    if not 0 < recipe.average_window <= 1:
        raise ValueError(f"average_window={recipe.average_window} is invalid; expected a fraction in (0, 1].")
    if recipe.attn_implementation not in (None, "auto", "eager", "sdpa", "flash_attention_2", "flex_attention"):
        raise ValueError(
            f"attn_implementation={recipe.attn_implementation!r} is invalid; expected eager, sdpa, "
            "flash_attention_2, flex_attention or auto."
        )


def plan_run(
    recipe: ModelDataArguments,
    args: TransformerTrainingArguments,
    model,
    train,
    batches_of,
    collator,
    evaluation,
    test_pairs: int,
    resume: str | None,
    started: float,
) -> BudgetPlan:
    """The run's plan: the recorded one when resuming a run that has one; else measured (where the budget or an
    `auto` choice asks for it) and computed. Under several processes every process measures (as they will train,
    side by side) and the main process's plan is the one all of them follow."""
    budgeted = recipe.max_minutes is not None and args.max_steps <= 0
    if resume is not None or budgeted:
        kept = recorded_plan(args.output_dir, resume)
        if kept is not None:
            logger.info("keeping the plan of the run being resumed: %s", kept.summary())
            return kept
    plan = new_plan(recipe, args, model, train, batches_of, collator, evaluation, test_pairs, started, budgeted)
    plan = broadcast_object_list([plan])[0]
    if args.should_save:
        save_json(Path(args.output_dir) / BUDGET_FILE, plan.to_dict())
    return plan


def process_start_time() -> float:
    """When this process started (time.time() scale), or now where that cannot be read."""
    try:
        import psutil

        return psutil.Process().create_time()
    except Exception:  # psutil missing or the platform does not say
        return time.time()


def latest_checkpoint(output_dir: str | Path) -> str | None:
    """The newest complete checkpoint folder of a run, for resuming; None if there is none."""
    folders = checkpoint_folders(output_dir)
    return str(folders[-1]) if folders else None


def save_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def describe_parameters(model) -> str:
    count = sum(p.numel() for p in model.parameters())
    return f"{count / 1e6:.2f}M" if count >= 1e5 else f"{count / 1e3:.1f}k"


def epochs_for(max_steps: int, trainer: TransformerTrainer) -> float:
    per_epoch = max(1, math.ceil(len(trainer.batch_sampler) / trainer.args.gradient_accumulation_steps))
    return max_steps / per_epoch


def hardware_description() -> str:
    """A short description of where this runs, for the results and the model card."""
    import platform

    if torch.cuda.is_available():
        return f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    return (
        f"{os.cpu_count()} CPU cores ({platform.processor() or platform.machine()}), {torch.get_num_threads()} threads"
    )


def plot_sentence(sources: list[str]) -> str:
    """A test sentence of readable length (6-20 words) for the attention maps; else the first one."""
    return next((text for text in sources if 6 <= len(text.split()) <= 20), sources[0])


def train_and_evaluate(
    recipe: ModelDataArguments, args: TransformerTrainingArguments, command: str = "", examples: int = 5
) -> dict | None:
    """Train, average the last checkpoints, evaluate on the test split with beam search, and leave a complete model
    folder in `args.output_dir`: weights, config, generation config, tokenizer, remote-code files, `results.json`,
    `training_log.json`, plots and a `README.md` model card. Resumes from the newest complete checkpoint of the
    folder. Under several processes all of them train; the main process does the rest and returns the results,
    the others return None.
    """
    results = _train_and_evaluate(recipe, args, command, examples)
    leave_process_group()  # after the trainer is gone: see leave_process_group
    return results


def _train_and_evaluate(
    recipe: ModelDataArguments, args: TransformerTrainingArguments, command: str, examples: int
) -> dict | None:
    from .hub import write_model_card
    from .inference import evaluate_translations
    from .plots import write_run_plots

    started = process_start_time()  # a budget counts the whole run, interpreter start-up included
    output_dir = Path(args.output_dir)
    # The main process picks the checkpoint to resume from and every process takes the same one (on several
    # machines, output_dir must be storage they share: only the main process writes checkpoints).
    resume = broadcast_object_list([args.resume_from_checkpoint or latest_checkpoint(output_dir)])[0]
    if resume:
        validate_checkpoint(resume)
        logger.info("resuming from %s", resume)
    trainer, tokenizer, corpus = prepare_run(recipe, args, resume=resume, started=started)
    if args.should_save:
        print(f"Plan: {trainer.plan.summary()}.", flush=True)
    train_started = time.time()
    trainer.train(resume_from_checkpoint=resume)
    train_seconds = time.time() - train_started
    budget_callback = next(c for c in trainer.callback_handler.callbacks if isinstance(c, TimeBudgetCallback))
    if not args.should_save:
        # Averaging, the test decoding and the model folder are the main process's work; the others are done.
        return None

    # 1. Average the last checkpoints into the model folder (§6.1).
    model, averaged = average_last_checkpoints(
        output_dir, output_dir, last=recipe.average_last, window=recipe.average_window,
        log_history=trainer.state.log_history,
    )
    tokenizer.save_pretrained(output_dir)
    model.to(trainer.args.device)

    # 2. Test BLEU with the paper's beam search.
    test = corpus["test"] if "test" in corpus else corpus["validation"]
    sources, references = list(test["source"]), list(test["target"])
    decode_started = time.time()
    scores, hypotheses = evaluate_translations(model, tokenizer, sources, references, num_beams=recipe.test_beams)
    decode_seconds = time.time() - decode_started

    # 3. Results, log and card.
    steps = trainer.state.global_step
    results = {
        "name": output_dir.name,
        "parameters": describe_parameters(model),
        "model": model.config.to_dict(),
        "data": {
            "dataset": "local files" if recipe.data_files else recipe.dataset,
            "source_lang": recipe.source_lang,
            "target_lang": recipe.target_lang,
            "train_pairs": len(trainer.train_dataset),
            "validation_pairs": len(corpus["validation"]) if "validation" in corpus else 0,
            "test_pairs": len(test),
        },
        "recipe": {
            "preset": recipe.preset,
            "max_tokens": recipe.max_tokens,
            "gradient_accumulation_steps": args.gradient_accumulation_steps,
            "lr_scale": recipe.lr_scale,
            "warmup_steps": int(args.warmup_steps),
            "max_length": recipe.max_length,
            "seed": args.seed,
            "bf16": args.bf16,
            "attn_implementation": trainer.plan.attn_implementation,
            "recipe_file": recipe.recipe,
            "max_minutes": recipe.max_minutes,
        },
        "training": {
            "steps": steps,
            "epochs": epochs_for(steps, trainer),
            "seconds": train_seconds,
            "seconds_per_update": train_seconds / max(1, steps - (checkpoint_step(resume) if resume else 0)),
            "final_loss": next((e["loss"] for e in reversed(trainer.state.log_history) if "loss" in e), None),
        },
        "plan": {**trainer.plan.to_dict(), "stopped_early_at": budget_callback.stopped_early_at},
        "averaged_checkpoints": [path.name for path in averaged],
        "test": {
            "bleu": scores["score"],
            "bleu_signature": scores["signature"],
            "chrf": scores["chrf"],
            "chrf_signature": scores["chrf_signature"],
            "tokenized_bleu": scores.get("tokenized_bleu"),
            "pairs": len(test),
            "beams": recipe.test_beams,
            "decode_seconds": decode_seconds,
        },
        "examples": [
            {"source": sources[i], "reference": references[i], "translation": hypotheses[i]}
            for i in range(min(examples, len(sources)))
        ],
        "hardware": hardware_description(),
        "command": command,
        "wall_seconds": time.time() - started,
    }
    save_json(output_dir / "training_log.json", {"log_history": trainer.state.log_history})
    save_json(output_dir / "results.json", results)
    plots = write_run_plots(model, tokenizer, trainer.state.log_history, output_dir / "plots", plot_sentence(sources))
    write_model_card(output_dir, results, plots=[str(path.relative_to(output_dir)) for path in plots])
    return results


def leave_process_group() -> None:
    """End this process's part in a multi-process launch (nothing to do in a single process). Call it once the
    run's trainer is unreachable.

    The order matters under gloo: a DDP reducer keeps a reference to the process group, and if the reducer drops
    the last one, the group's destructor runs with the GIL held and joins gloo's worker threads, which may be
    waiting for the GIL to free the tensors of the last collective (Trainer's final all-gather): a hang, or an
    abort when it happens at interpreter exit. So the trainer goes first (collected here), then the group, whose
    last reference is dropped from Python, whose binding releases the GIL while the threads stop.
    """
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        gc.collect()
        torch.distributed.destroy_process_group()
