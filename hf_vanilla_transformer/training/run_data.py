"""The data of a training run, prepared once and shared by the plan, the Trainer and a run that starts again with
another choice: the corpus (validation and test pairs held out of a lone training file), the tokenizer (made once
per launch: the model's own, an interrupted run's, or the shared BPE learned on a capped sample), the training split
tokenized once per machine, and its token-budget batch samplers."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from datasets import DatasetDict
from tokenizers import Tokenizer
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from ..data.batching import BatchSamplers
from ..data.cache import SCRATCH, cache_root
from ..data.corpora import hold_out, load_corpus
from ..data.pipeline import learn_tokenizer, length_chunks, tokenize_corpus, tokenized_folder, tokenizer_to_text
from ..data.splits import CorpusError
from ..data.tokenizer import wrap_tokenizer
from ..utils.distributed import main_process_value, result_or_error
from ..utils.machine import release_mapped_pages
from ..utils.stages import SetupClock
from .arguments import ModelDataArguments, TransformerTrainingArguments
from .choices import budgeted
from .planning import BudgetError


logger = logging.getLogger(__name__)


@dataclass
class PreparedData:
    """What a run trains and evaluates on: the held-out splits as text (the training text is not kept once
    tokenized), the tokenizer, the tokenized training split and validation pairs (or None), the batch samplers, and
    the set-up clock that timed them."""

    corpus: DatasetDict
    tokenizer: PreTrainedTokenizerFast
    train: object  # datasets.Dataset: input_ids, labels and their length columns
    evaluation: object | None
    batches: BatchSamplers
    clock: SetupClock


def prepare_data(
    recipe: ModelDataArguments, args: TransformerTrainingArguments, output_dir: Path, clock: SetupClock
) -> PreparedData:
    """The corpus read and the training split tokenized once per machine (the machine's first process does it, the
    others read the cache), the tokenizer made once per launch, the batches cut from the length columns."""
    with clock.stage("corpus") as facts:
        corpus = _load_corpus(recipe, args)
        facts["skipped_lines"] = corpus.skipped_lines
    check_budget_left(recipe, args, clock)
    with clock.stage("tokenizer"):
        tokenizer = build_tokenizer(recipe, args, corpus["train"], output_dir)
    check_budget_left(recipe, args, clock)
    with clock.stage("tokenize") as facts:
        with args.main_process_first(local=True, desc="tokenizing"):
            folder = tokenized_folder(corpus["train"], tokenizer, recipe.max_length, recipe.data_cache_dir)
            facts["tokenized_here"] = folder is None or not folder.exists()
            encoded = tokenize_corpus(
                corpus, tokenizer, recipe.max_length, recipe.data_cache_dir, recipe.preprocessing_num_workers
            )
        facts["pairs"] = len(encoded["train"])
    with clock.stage("lengths and batches") as facts:
        scratch = cache_root(recipe.data_cache_dir) / SCRATCH
        batches = BatchSamplers(length_chunks(encoded["train"]), args.seed, scratch)
        facts["batches"] = len(batches.of(recipe.max_tokens))
        # What the set-up read of the corpus and its tokenization (file headers, length columns) is unmapped: the
        # first update maps the pages of its own rows only.
        release_mapped_pages()
    check_budget_left(recipe, args, clock)
    held_out = DatasetDict({name: split for name, split in corpus.items() if name != "train"})
    return PreparedData(held_out, tokenizer, encoded["train"], _validation_split(recipe, encoded), batches, clock)


def build_tokenizer(recipe: ModelDataArguments, args: TransformerTrainingArguments, train, output_dir: Path):
    """The model's own tokenizer when fine-tuning; else the one of an interrupted run in `output_dir`; else the
    shared BPE of the training split (§5.1, `data.pipeline.learn_tokenizer`: a capped sample, cached). The main
    process makes it and hands it to the others as text, so that no process learns it again and no machine needs
    to see the main one's files; the main process saves it in `output_dir/tokenizer`."""
    if recipe.model_name_or_path:
        return AutoTokenizer.from_pretrained(recipe.model_name_or_path)
    tokenizer, text = None, None
    if args.process_index == 0:
        tokenizer = result_or_error(_main_tokenizer, recipe, args, train, output_dir)
        text = tokenizer if isinstance(tokenizer, Exception) else tokenizer_to_text(tokenizer)
    text = main_process_value(text)
    if isinstance(text, Exception):  # the main process failed: every process stops with its error
        raise text
    return tokenizer if tokenizer is not None else wrap_tokenizer(Tokenizer.from_str(text))


def _main_tokenizer(recipe: ModelDataArguments, args: TransformerTrainingArguments, train, output_dir: Path):
    """The main process's tokenizer: the interrupted run's, else the shared BPE (cached); saved for resuming."""
    saved = output_dir / "tokenizer"
    tokenizer = None
    if (saved / "tokenizer.json").exists():
        try:
            tokenizer = AutoTokenizer.from_pretrained(saved)
        except Exception as error:  # damaged (a disk that filled up, a copy cut short): the BPE is made again
            logger.warning("%s cannot be read (%s): the tokenizer is made again", saved, str(error).splitlines()[0])
    if tokenizer is None:
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
                carve=True,  # a lone training file's held-out pairs carved as it is cached
            )
        except (ValueError, UnicodeDecodeError) as error:  # a bad file or language: one line naming it
            raise CorpusError(str(error)) from error
    held_out = hold_out(corpus)
    held_out.skipped_lines = getattr(corpus, "skipped_lines", {})  # (local files: the lines that were no pair)
    return held_out


def _validation_split(recipe: ModelDataArguments, encoded: DatasetDict):
    """The validation pairs evaluated during training (at most `max_eval_samples`), or None."""
    evaluation = encoded.get("validation")
    if evaluation is not None and recipe.max_eval_samples is not None:
        evaluation = evaluation.select(range(min(recipe.max_eval_samples, len(evaluation))))
    return evaluation


def check_budget_left(recipe: ModelDataArguments, args: TransformerTrainingArguments, clock: SetupClock) -> None:
    """Stop a budgeted run as soon as its set-up has spent the whole budget, naming what it took (the planner would
    find no time left, but only after the rest of the set-up)."""
    if not budgeted(recipe, args):
        return
    spent = time.time() - clock.started
    if spent >= recipe.max_minutes * 60:
        stages = ", ".join(f"{name} {facts['seconds']:.0f} s" for name, facts in clock.stages.items())
        raise BudgetError(
            f"max_minutes={recipe.max_minutes:g} leaves no time to train: the set-up alone took {spent / 60:.1f} min "
            f"({stages}); give more minutes (the set-up is faster from the data cache)."
        )
