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

import dataclasses
import gc
import json
import logging
import math
import os
import time
from pathlib import Path

import torch
from accelerate.utils import broadcast_object_list
from datasets import DatasetDict
from transformers import (
    AutoTokenizer,
    DataCollatorForSeq2Seq,
    PreTrainedTokenizerFast,
    ProgressCallback,
    set_seed,
)

from .arguments import (
    ModelDataArguments,
    TransformerTrainingArguments,
    check_recipe_arguments,
    check_schedule_arguments,
    length_penalty_choices,
    parse_config_overrides,
)
from .averaging import average_last_checkpoints, checkpoint_step
from .batching import TokenBudgetBatchSampler
from .budget import (
    BUDGET_FILE,
    FINISHING_SECONDS,
    BudgetPlan,
    TimeBudgetCallback,
    accumulation_for,
    apply_plan,
    cpu_has_fast_bf16,
    new_plan,
    recorded_plan,
)
from .checkpoints import CheckpointError, latest_checkpoint, validate_checkpoint
from .configuration_vanilla_transformer import VanillaTransformerConfig
from .data import CorpusError, load_corpus
from .metrics import seq2seq_bleu_metrics
from .modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from .tokenization import check_special_tokens, corpus_texts, tokenize_corpus, train_bpe_tokenizer
from .trainer import (
    SaveEveryCallback,
    TrainingProgressCallback,
    TransformerTrainer,
    noam_factor,
    noam_schedule,
)


logger = logging.getLogger(__name__)


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
    if recipe.attn_implementation and recipe.attn_implementation != "auto":  # auto: measured in plan_run
        model.set_attn_implementation(recipe.attn_implementation)
    check_special_tokens(tokenizer, model.config)
    return model


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

    def build(preset: str) -> VanillaTransformerForConditionalGeneration:  # another size, for the planner
        return build_model(dataclasses.replace(recipe, preset=preset), tokenizer)

    plan = plan_run(recipe, args, model, train, batches_of, collator, evaluation, test_pairs, resume, started, build)
    if plan.preset and plan.preset != recipe.preset:  # the planner chose another size: train that one
        recipe.preset = plan.preset
        set_seed(args.seed)
        model = build_model(recipe, tokenizer)
        collator = DataCollatorForSeq2Seq(tokenizer, model=model)
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
    build=None,
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
    plan = new_plan(recipe, args, model, train, batches_of, collator, evaluation, test_pairs, started, budgeted, build)
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


def run_results(
    recipe: ModelDataArguments,
    args: TransformerTrainingArguments,
    trainer: TransformerTrainer,
    model,
    corpus: DatasetDict,
    averaged: list[Path],
    scores: dict,
    texts: tuple[list[str], list[str], list[str]],
    timing: dict,
    command: str,
    examples: int,
) -> dict:
    """The `results.json` of a finished run: model, data, recipe, training, plan, test scores and the first
    `examples` test translations (`texts`: sources, references, hypotheses); `timing` holds the process start,
    the training and decoding seconds and the checkpoint the run resumed from."""
    output_dir = Path(args.output_dir)
    test = corpus["test"] if "test" in corpus else corpus["validation"]
    sources, references, hypotheses = texts
    train_seconds, decode_seconds, resume = timing["train"], timing["decode"], timing["resumed_at"]
    budget_callback = next(c for c in trainer.callback_handler.callbacks if isinstance(c, TimeBudgetCallback))
    steps = trainer.state.global_step
    return {
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
        "wall_seconds": time.time() - timing["started"],
    }


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
    if not args.should_save:
        # Averaging, the test decoding and the model folder are the main process's work; the others are done.
        return None

    # 1. Average the last checkpoints into the model folder (§6.1).
    model, averaged = average_last_checkpoints(
        output_dir,
        output_dir,
        last=recipe.average_last,
        window=recipe.average_window,
        log_history=trainer.state.log_history,
    )
    tokenizer.save_pretrained(output_dir)
    model.to(trainer.args.device)

    # 2. The GNMT alpha of the beam search, chosen on the validation pairs where the recipe asks for it (§6.1).
    decode_started = time.time()
    alpha_choice = choose_alpha(recipe, model, tokenizer, corpus, output_dir)

    # 3. Test BLEU with the paper's beam search.
    test = corpus["test"] if "test" in corpus else corpus["validation"]
    sources, references = list(test["source"]), list(test["target"])
    scores, hypotheses = evaluate_translations(model, tokenizer, sources, references, num_beams=recipe.test_beams)
    decode_seconds = time.time() - decode_started

    # 4. Results, log and card.
    timing = {"started": started, "train": train_seconds, "decode": decode_seconds, "resumed_at": resume}
    texts = (sources, references, hypotheses)
    results = run_results(recipe, args, trainer, model, corpus, averaged, scores, texts, timing, command, examples)
    results["test"]["length_penalty"] = model.generation_config.length_penalty
    if alpha_choice:
        results["length_penalty_choice"] = alpha_choice
    save_json(output_dir / "training_log.json", {"log_history": trainer.state.log_history})
    save_json(output_dir / "results.json", results)
    plots = write_run_plots(model, tokenizer, trainer.state.log_history, output_dir / "plots", plot_sentence(sources))
    write_model_card(output_dir, results, plots=[str(path.relative_to(output_dir)) for path in plots])
    return results


def choose_alpha(recipe: ModelDataArguments, model, tokenizer, corpus: DatasetDict, output_dir: Path) -> dict | None:
    """With `--length_penalty_choices`, decode the first `max_eval_samples` validation pairs with each alpha (beam
    search, `test_beams`), keep the best in the model's generation config (saved in `output_dir`) and return what was
    measured; None (and the model's alpha unchanged) without choices or without a validation split."""
    from .inference import choose_length_penalty

    alphas = length_penalty_choices(recipe)
    if not alphas or "validation" not in corpus:
        return None
    validation = corpus["validation"]
    if recipe.max_eval_samples is not None:
        validation = validation.select(range(min(recipe.max_eval_samples, len(validation))))
    sources, references = list(validation["source"]), list(validation["target"])
    best, bleu = choose_length_penalty(
        model, tokenizer, sources, references, alphas, num_beams=recipe.test_beams, progress=False
    )
    model.generation_config.length_penalty = best
    model.generation_config.save_pretrained(output_dir)
    described = ", ".join(f"{alpha:g}: {score:.2f}" for alpha, score in bleu.items())
    print(
        f"Length penalty: GNMT alpha {best:g} (validation BLEU on {len(sources)} pairs, beam {recipe.test_beams}: "
        f"{described}).",
        flush=True,
    )
    return {
        "chosen": best,
        "validation_bleu": {f"{alpha:g}": score for alpha, score in bleu.items()},
        "validation_pairs": len(sources),
        "beams": recipe.test_beams,
    }


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


# What a run uses, importable from here as before the split into arguments.py, trainer.py and checkpoints.py.
__all__ = [
    "CheckpointError",
    "ModelDataArguments",
    "SaveEveryCallback",
    "TrainingProgressCallback",
    "TransformerTrainer",
    "TransformerTrainingArguments",
    "build_model",
    "build_tokenizer",
    "check_recipe_arguments",
    "check_schedule_arguments",
    "cpu_has_fast_bf16",
    "latest_checkpoint",
    "noam_factor",
    "noam_schedule",
    "plan_run",
    "prepare_run",
    "process_start_time",
    "train_and_evaluate",
    "validate_checkpoint",
    "vocab_size_for",
]
