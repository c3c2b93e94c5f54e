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

from .averaging import COMPLETE, average_last_checkpoints, checkpoint_folders
from .batching import TokenBudgetBatchSampler, accumulation_steps
from .configuration_vanilla_transformer import PRESETS, VanillaTransformerConfig
from .data import load_corpus
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
        default=None, metadata={"help": "eager, sdpa or flash_attention_2 (default: transformers' choice, sdpa)."}
    )


@dataclass
class TransformerTrainingArguments(Seq2SeqTrainingArguments):
    """`Seq2SeqTrainingArguments` with the paper's defaults (§5.3) instead of transformers' ones."""

    output_dir: str | None = field(default="runs/transformer", metadata={"help": "Where checkpoints and the model go."})
    adam_beta2: float = field(default=0.98, metadata={"help": "Adam beta2 (§5.3: 0.98)."})
    adam_epsilon: float = field(default=1e-9, metadata={"help": "Adam epsilon (§5.3: 1e-9)."})
    weight_decay: float = field(default=0.0, metadata={"help": "No weight decay in the paper."})
    max_grad_norm: float = field(default=0.0, metadata={"help": "No gradient clipping in the paper (0 = off)."})
    warmup_steps: float = field(default=4000, metadata={"help": "Warmup steps of the §5.3 schedule (4000)."})
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


def cpu_has_fast_bf16() -> bool:
    """True on CPUs with native bf16 matrix units (AMX or AVX512-BF16), where bf16 autocast speeds training up."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " amx_bf16" in flags or " avx512_bf16" in flags


# The main job's recipe: the paper's, scaled to a 2-core CPU and about 25 minutes (README.md, "The main job", gives
# the measurements behind each choice).
CPU_RECIPE = {
    "model_data": dict(
        preset="small",  # d_model 256, 3 + 3 layers, 4 heads, d_ff 1024
        vocab_size=8000,
        max_tokens=2048,  # about 1,700 source + 1,700 target tokens per update
        lr_scale=1.0,
        dropout=0.0,  # a short run does not overfit; dropout costs a quarter of the step on a CPU
        label_smoothing=0.1,
        max_length=256,
        average_last=5,
        attn_implementation="eager",  # faster than SDPA's CPU kernels at these lengths in bf16
        test_beams=4,
        max_eval_samples=200,  # validation BLEU for the training curves: 200 pairs, greedy, every 900 updates
    ),
    "training": dict(
        max_steps=5400,
        warmup_steps=1000,
        save_steps=450,
        logging_steps=100,
        eval_strategy="steps",
        eval_steps=900,
        generation_num_beams=1,
        bf16=cpu_has_fast_bf16(),
        use_cpu=True,
    ),
}


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
    tokenizer = train_bpe_tokenizer(corpus_texts(corpus, "train"), vocab_size=recipe.vocab_size)
    if save:
        tokenizer.save_pretrained(saved)
    return tokenizer


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
    if recipe.attn_implementation:
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


def prepare_run(recipe: ModelDataArguments, args: TransformerTrainingArguments):
    """Everything `Trainer` needs, built from the two argument dataclasses. Returns (trainer, tokenizer, corpus)."""
    check_schedule_arguments(args)
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    # Each machine's first process fetches the corpus into its cache, then the others read it instead of racing it
    # to the same files. The main process learns and saves the tokenizer; the others load it where they can see
    # it, else learn the same one (BPE learning is deterministic) without writing it.
    with args.main_process_first(local=True, desc="corpus"):
        corpus = load_corpus(
            recipe.dataset,
            recipe.source_lang,
            recipe.target_lang,
            recipe.data_files,
            recipe.validation_files,
            recipe.test_files,
            recipe.data_cache_dir,
        )
    with args.main_process_first(local=False, desc="tokenizer"):
        tokenizer = build_tokenizer(recipe, corpus, output_dir, save=args.should_save)
    encoded = tokenize_corpus(corpus, tokenizer, max_length=recipe.max_length)
    set_seed(args.seed)  # the initial weights depend on the seed alone (Trainer seeds only after the model exists)
    model = build_model(recipe, tokenizer)

    train = encoded["train"]
    sampler = TokenBudgetBatchSampler(
        [len(ids) for ids in train["input_ids"]],
        [len(ids) for ids in train["labels"]],
        max_tokens=recipe.max_tokens,
        seed=args.seed,
    )
    args.gradient_accumulation_steps = max(
        args.gradient_accumulation_steps,
        accumulation_steps(recipe.tokens_per_update, recipe.max_tokens, args.world_size),
    )
    # The §5.3 schedule: peak lr_scale * d_model^-0.5 * warmup^-0.5 at the end of warmup.
    args.learning_rate = recipe.lr_scale * model.config.d_model**-0.5
    evaluation = encoded.get("validation")
    if evaluation is not None and recipe.max_eval_samples is not None:
        evaluation = evaluation.select(range(min(recipe.max_eval_samples, len(evaluation))))
    callbacks = [SaveEveryCallback(recipe.save_minutes)] if recipe.save_minutes else []
    trainer = TransformerTrainer(
        model=model,
        args=args,
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
        args.gradient_accumulation_steps,
        args.learning_rate * noam_factor(int(args.warmup_steps), int(args.warmup_steps)),
    )
    return trainer, tokenizer, corpus


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

    started = time.time()
    trainer, tokenizer, corpus = prepare_run(recipe, args)
    output_dir = Path(args.output_dir)
    # The main process picks the checkpoint to resume from and every process takes the same one (on several
    # machines, output_dir must be storage they share: only the main process writes checkpoints).
    resume = broadcast_object_list([args.resume_from_checkpoint or latest_checkpoint(output_dir)])[0]
    if resume:
        validate_checkpoint(resume)
        logger.info("resuming from %s", resume)
    train_started = time.time()
    trainer.train(resume_from_checkpoint=resume)
    train_seconds = time.time() - train_started
    if not args.should_save:
        # Averaging, the test decoding and the model folder are the main process's work; the others are done.
        return None

    # 1. Average the last checkpoints into the model folder (§6.1).
    model, averaged = average_last_checkpoints(output_dir, output_dir, last=recipe.average_last)
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
        },
        "training": {
            "steps": steps,
            "epochs": epochs_for(steps, trainer),
            "seconds": train_seconds,
            "final_loss": next((e["loss"] for e in reversed(trainer.state.log_history) if "loss" in e), None),
        },
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
