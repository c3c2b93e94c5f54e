"""The data of a training run, prepared once and shared by the plan, the Trainer and a run that starts again with
another choice: the corpus (validation and test pairs held out of a lone training file), the tokenizer (made once
per launch: the model's own, an interrupted run's, or the shared BPE learned on a capped sample), the training split
tokenized once per machine, and its token-budget batch samplers (their batches collated by `data.collating`)."""

from __future__ import annotations

import logging
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
from .budget import BudgetClock


logger = logging.getLogger(__name__)


@dataclass
class PreparedData:
    """What a run trains and evaluates on: the held-out splits as text (the training text is not kept once
    tokenized), the tokenizer, the tokenized training split and validation pairs (or None), the batch samplers, and
    the set-up clock that timed them, and the split the run is tested on. The plan counts the held-out pairs as the
    lengths of these splits, reads the batches from the samplers themselves (`data.batching`) and collates them as
    the Trainer does (`data.collating`)."""

    corpus: DatasetDict
    tokenizer: PreTrainedTokenizerFast
    train: object  # datasets.Dataset: input_ids, labels and their length columns
    evaluation: object | None
    batches: BatchSamplers
    clock: SetupClock
    test: object  # datasets.Dataset: the test split, else the validation split (`hold_out` gives every corpus one)


def prepare_data(settings, budget: BudgetClock, clock: SetupClock) -> PreparedData:
    """The corpus read and the training split tokenized once per machine (the machine's first process does it, the
    others read the cache), the tokenizer made once per launch, the batches cut from the length columns; the set-up
    stopped as soon as it has spent the whole `budget`."""
    recipe, args = settings.recipe, settings.args
    output_dir = Path(settings.output_dir)
    with clock.stage("corpus") as facts:
        # Each machine's first process fetches or reads the corpus into the cache, then the others read it instead
        # of racing it to the same files.
        with args.main_process_first(local=True, desc="corpus"):
            files = (recipe.data_files, recipe.validation_files, recipe.test_files)
            languages = (recipe.source_lang, recipe.target_lang)
            corpus = _read_corpus(recipe.dataset, languages, files, recipe.data_cache_dir, recipe.wmt14_dir)
        facts["skipped_lines"] = corpus.skipped_lines
    budget.check_setup(clock.stages)
    with clock.stage("tokenizer"):
        if recipe.model_name_or_path:
            tokenizer = AutoTokenizer.from_pretrained(recipe.model_name_or_path)
        else:
            bpe = (recipe.vocab_size, recipe.scale_vocab_to_corpus, recipe.bpe_sample_pairs, recipe.data_cache_dir)
            tokenizer = launch_tokenizer(corpus["train"], output_dir, bpe, args.process_index, args.should_save)
    budget.check_setup(clock.stages)
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
        facts["batches"] = len(batches.of(settings.token_sizes[0]))
        # What the set-up read of the corpus and its tokenization (file headers, length columns) is unmapped: the
        # first update maps the pages of its own rows only.
        release_mapped_pages()
    budget.check_setup(clock.stages)
    held_out = DatasetDict({name: split for name, split in corpus.items() if name != "train"})
    evaluation = encoded.get("validation")
    if evaluation is not None and recipe.max_eval_samples is not None:
        evaluation = evaluation.select(range(min(recipe.max_eval_samples, len(evaluation))))
    test = held_out["test"] if "test" in held_out else held_out["validation"]
    return PreparedData(held_out, tokenizer, encoded["train"], evaluation, batches, clock, test)


def launch_tokenizer(train, output_dir: Path, bpe: tuple, rank: int, saves: bool):
    """The tokenizer of a new model: the one of an interrupted run in `output_dir`, else the shared BPE of the
    training split (§5.1, `data.pipeline.learn_tokenizer(train, *bpe)`: its vocabulary size, whether it is scaled to
    the corpus, the pairs it samples, the cache folder; cached). The main process (`rank` 0)
    makes it and hands it to the others as text, so that no process learns it again and no machine needs to see the
    main one's files; the main process (`saves`) saves it in `output_dir/tokenizer`."""
    tokenizer, text = None, None
    if rank == 0:
        tokenizer = result_or_error(_main_tokenizer, bpe, train, output_dir, saves)
        text = tokenizer if isinstance(tokenizer, Exception) else tokenizer_to_text(tokenizer)
    text = main_process_value(text)
    if isinstance(text, Exception):  # the main process failed: every process stops with its error
        raise text
    return tokenizer if tokenizer is not None else wrap_tokenizer(Tokenizer.from_str(text))


def _main_tokenizer(bpe: tuple, train, output_dir: Path, saves: bool):
    """The main process's tokenizer: the interrupted run's, else the shared BPE (cached); saved for resuming."""
    saved = output_dir / "tokenizer"
    tokenizer = None
    if (saved / "tokenizer.json").exists():
        try:
            tokenizer = AutoTokenizer.from_pretrained(saved)
        except Exception as error:  # damaged (a disk that filled up, a copy cut short): the BPE is made again
            logger.warning("%s cannot be read (%s): the tokenizer is made again", saved, str(error).splitlines()[0])
    if tokenizer is None:
        vocab_size, scaled, sample_pairs, cache_dir = bpe
        tokenizer = learn_tokenizer(train, vocab_size, scaled, sample_pairs, cache_dir=cache_dir)
    if saves:
        tokenizer.save_pretrained(saved)
    return tokenizer


def _read_corpus(dataset: str, languages: tuple, files: tuple, cache_dir, wmt14_dir) -> DatasetDict:
    """The corpus (`data.corpora.load_corpus` of `dataset`, the (source, target) `languages`, the (training,
    validation, test) `files`), with validation and test pairs held out of the training split where none are given;
    a bad file or language in one line naming it (`CorpusError`)."""
    try:
        corpus = load_corpus(
            dataset,
            *languages,
            *files,
            cache_dir,
            wmt14_dir,
            carve=True,  # a lone training file's held-out pairs
        )
    except (ValueError, UnicodeDecodeError) as error:
        raise CorpusError(str(error)) from error
    held_out = hold_out(corpus)
    held_out.skipped_lines = getattr(corpus, "skipped_lines", {})  # (local files: the lines that were no pair)
    return held_out
