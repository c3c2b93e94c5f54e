"""Preparing a corpus for training, once per machine: the shared BPE learned on a seeded, capped sample of the
training split (§5.1), and every split tokenized in parallel into memory-mapped Arrow with its lengths beside it.

* **The BPE** reads at most `bpe_sample_pairs` pairs (both sides), drawn with a seed, as sentencepiece caps its
  input with `input_sentence_size`: the vocabulary of a few million sentences is the vocabulary of the corpus, and
  learning it costs minutes instead of hours at WMT's size. The sample is drawn a chunk of the split at a time and
  read as a stream, the pages it read unmapped as it goes: the learning process's memory does not grow with the
  corpus. It is cached by the corpus and the settings (`cache.py`), so a second run on the same data does not
  learn it again.
* **Tokenizing** runs `datasets.map(batched=True, num_proc=...)` over the training split: its text is dropped, ids
  are stored in the narrowest integer type the vocabulary allows (uint16 up to 65,536 tokens), the source and target
  lengths are written as columns (the batch sampler reads them as arrays), and pairs longer than `max_length` tokens
  are dropped inside the map (no row filter, no indices mapping). Each worker encodes each distinct word once
  while it is cached (`ChunkCachedEncoder`, the tokenizer's own ids) and unmaps the corpus pages of every record
  batch it has read. The held-out splits keep their text (decoding
  needs it) and every pair. The result is cached under the corpus, the tokenizer and `max_length`: a second run, a
  resume and the other processes of a launch read it.
"""

from __future__ import annotations

import hashlib
import logging
import multiprocessing
import os
import sys
import tempfile
import weakref
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
from datasets import Dataset, DatasetDict, Features, Sequence, Value, concatenate_datasets
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast

from ..utils.faults import moment
from ..utils.machine import release_mapped_pages
from .cache import (
    building,
    cache_root,
    complete_folder,
    dataset_key,
    entry_lock,
    headers_read_lightly,
    open_arrow,
    prune,
    text_key,
    touch,
)
from .tokenizer import ChunkCachedEncoder, train_bpe_tokenizer, wrap_tokenizer


logger = logging.getLogger(__name__)

BPE_SAMPLE_PAIRS = 2_000_000  # pairs (4 million sentences) the BPE reads at most, by default
BPE_SAMPLE_SEED = 0
PARALLEL_FROM_PAIRS = 200_000  # a training split at least this large is tokenized in several processes
MAP_BATCH = 2_000  # pairs encoded at a time (their ids are Python lists until they become Arrow)
# Pairs per batch of the training split's map and per record batch of its Arrow file (as `corpora.WRITE_BATCH`).
RECORD_BATCH = 50_000
SAMPLE_CHUNK = 50_000  # rows of the training split the BPE's sample is drawn from at a time
LENGTH_COLUMNS = ("source_length", "target_length")


# ---------------------------------------------------------------------------------------------------------------------
# The shared BPE
# ---------------------------------------------------------------------------------------------------------------------


def bpe_sample_rows(
    rows: int, pairs: int | None = BPE_SAMPLE_PAIRS, seed: int = BPE_SAMPLE_SEED
) -> Iterator[np.ndarray]:
    """The rows of a split of `rows` pairs that the BPE reads, in order, `SAMPLE_CHUNK` rows of the split at a time:
    all of them, or `pairs` of them drawn with `seed` as a uniform sample without replacement (every set of `pairs`
    rows equally likely). Each chunk's share of the sample is drawn from the hypergeometric law of what is left, then
    its rows within the chunk: nothing the size of the split is held, whatever its size."""
    if pairs is not None and pairs < 1:
        raise ValueError(f"bpe_sample_pairs={pairs} is invalid; expected a positive number of pairs.")
    rng, left = np.random.default_rng(seed), pairs
    for start in range(0, rows, SAMPLE_CHUNK):
        size = min(SAMPLE_CHUNK, rows - start)
        if pairs is None or rows <= pairs:
            yield np.arange(start, start + size)
            continue
        rest = rows - start - size
        taken = left if rest == 0 else int(rng.hypergeometric(size, rest, left)) if left else 0
        if taken:
            yield start + np.sort(rng.choice(size, taken, replace=False))
        left -= taken


def bpe_sample(train: Dataset, pairs: int | None = BPE_SAMPLE_PAIRS, seed: int = BPE_SAMPLE_SEED) -> Iterator[dict]:
    """The training pairs the BPE reads (`bpe_sample_rows`), a chunk at a time as {"source": [...], "target": [...]}.
    The chunk's pages of the memory-mapped corpus are unmapped before the next is read (`release_mapped_pages`): a
    sample spread over a corpus of 36M pairs touches most of its pages, which would otherwise all stay in the
    reading process's resident memory."""
    texts = train.select_columns(["source", "target"])
    for rows in bpe_sample_rows(len(train), pairs, seed):
        chunk = texts[rows]
        release_mapped_pages()
        yield chunk


def bpe_sample_texts(train: Dataset, pairs: int | None = BPE_SAMPLE_PAIRS, seed: int = BPE_SAMPLE_SEED):
    """The sentences of `bpe_sample`, both sides."""
    for chunk in bpe_sample(train, pairs, seed):
        yield from chunk["source"]
        yield from chunk["target"]


def scaled_vocab_size(vocab_size: int, texts: Iterable[str]) -> int:
    """`vocab_size` capped by corpus size: a quarter of the distinct whitespace-separated words of `texts` (both
    sides of the BPE's sample), rounded down to 500, at least 1000 (the LibreOffice help EN-DE has 60,788, so the CPU
    recipe's 8,000 stand; 200 pairs have 1,502)."""
    words = set()
    for text in texts:
        words.update(text.split())
    return min(vocab_size, max(1000, len(words) // 4 // 500 * 500))


def learn_tokenizer(
    train: Dataset,
    vocab_size: int,
    scale_to_corpus: bool = False,
    sample_pairs: int | None = BPE_SAMPLE_PAIRS,
    seed: int = BPE_SAMPLE_SEED,
    cache_dir: str | Path | None = None,
) -> PreTrainedTokenizerFast:
    """The shared BPE of `train` (learned on `bpe_sample`; `scale_to_corpus` caps the vocabulary as
    `scaled_vocab_size` does), from the cache when this corpus and these settings were learned before."""
    key = dataset_key(train)
    if key is None:  # held in memory: not cached
        return _in_child(_learn, train, vocab_size, scale_to_corpus, sample_pairs, seed)
    settings = text_key(key, vocab_size, scale_to_corpus, sample_pairs, seed, "byte-level-bpe-2")
    folder = cache_root(cache_dir) / "tokenizers" / settings
    with entry_lock(folder, cache_dir):
        if complete_folder(folder):
            touch(folder)
            return PreTrainedTokenizerFast.from_pretrained(folder)
        tokenizer = _in_child(_learn, train, vocab_size, scale_to_corpus, sample_pairs, seed)
        with building(folder) as temporary:
            tokenizer.save_pretrained(temporary)
    return tokenizer


def _learn(train: Dataset, vocab_size: int, scale_to_corpus: bool, sample_pairs: int | None, seed: int):
    """The shared BPE of `train`'s sample (see `learn_tokenizer`), read as a stream (twice where the vocabulary is
    scaled to the corpus)."""
    size = scaled_vocab_size(vocab_size, bpe_sample_texts(train, sample_pairs, seed)) if scale_to_corpus else vocab_size
    if size != vocab_size:
        logger.info("vocabulary %d instead of %d: the training split has too few distinct words", size, vocab_size)
    pairs = len(train) if sample_pairs is None else min(len(train), sample_pairs)
    logger.info("learning a shared BPE of %d tokens on %s training pairs", size, f"{pairs:,}")
    return train_bpe_tokenizer(bpe_sample_texts(train, sample_pairs, seed), vocab_size=size)


def _in_child(learn, *arguments) -> PreTrainedTokenizerFast:
    """`learn(*arguments)`'s tokenizer, learned in a forked child process where the platform forks: learning a BPE
    on millions of sentences takes a gigabyte or more, which the child gives back to the system when it ends (a
    training process's caching allocator would keep it). The tokenizer comes back as its JSON."""
    if sys.platform != "linux":
        return learn(*arguments)
    with headers_read_lightly(), multiprocessing.get_context("fork").Pool(1) as pool:
        text = pool.apply(_learned_text, (learn, *arguments))  # (the split is pickled: the child opens it again)
    return wrap_tokenizer(Tokenizer.from_str(text))


def _learned_text(learn, *arguments) -> str:
    moment("bpe")
    return tokenizer_to_text(learn(*arguments))


def tokenizer_to_text(tokenizer: PreTrainedTokenizerFast) -> str:
    """The tokenizer as one string (its `tokenizer.json`), to hand to the other processes of a launch."""
    return tokenizer.backend_tokenizer.to_str()


# ---------------------------------------------------------------------------------------------------------------------
# Tokenizing
# ---------------------------------------------------------------------------------------------------------------------


def token_features(vocab_size: int, lengths: bool = True) -> dict:
    """The tokenized columns' types: ids in the narrowest integer type for `vocab_size` tokens, int32 lengths."""
    ids = Sequence(Value("uint16" if vocab_size <= 2**16 else "int32"))
    columns = {"input_ids": ids, "labels": ids}
    if lengths:
        columns.update({name: Value("int32") for name in LENGTH_COLUMNS})
    return columns


def encode_pairs(batch: dict, tokenizer: PreTrainedTokenizerFast, max_length: int | None = None) -> dict:
    """`input_ids` and `labels` (each ending with </s>, as `tokenizer(sources)` and `tokenizer(text_target=targets)`
    give them) and their lengths for a batch of pairs; with `max_length`, pairs longer on either side are left out.
    Each distinct word is encoded once per process while it is cached (`ChunkCachedEncoder`: the same ids, faster)."""
    if hasattr(tokenizer, "backend_tokenizer"):
        encode = chunk_encoder(tokenizer)
        sources, targets = encode(batch["source"]), encode(batch["target"])
    else:  # a converted model's own tokenizer (Marian's has a SentencePiece model for each language)
        sources, targets = tokenizer(batch["source"])["input_ids"], tokenizer(text_target=batch["target"])["input_ids"]
    if max_length is not None:
        kept = [i for i, (s, t) in enumerate(zip(sources, targets, strict=True)) if max(len(s), len(t)) <= max_length]
        if len(kept) < len(sources):
            sources, targets = [sources[i] for i in kept], [targets[i] for i in kept]
    return {
        "input_ids": sources,
        "labels": targets,
        "source_length": [len(ids) for ids in sources],
        "target_length": [len(ids) for ids in targets],
    }


_ENCODERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # each tokenizer's encoder, kept by this process


def chunk_encoder(tokenizer: PreTrainedTokenizerFast) -> ChunkCachedEncoder:
    """`tokenizer`'s `ChunkCachedEncoder`, one per tokenizer object and process, kept for a whole tokenization (a
    worker's shard) and dropped at its end (`tokenize_corpus`); made again where tokens were added meanwhile."""
    encoder = _ENCODERS.get(tokenizer)
    if encoder is None or encoder.tokens != len(tokenizer):
        encoder = _ENCODERS[tokenizer] = ChunkCachedEncoder(tokenizer)
    return encoder


def encode_record_batch(batch: dict, tokenizer: PreTrainedTokenizerFast, max_length: int | None = None) -> pa.Table:
    """`encode_pairs` over a batch of up to `RECORD_BATCH` pairs, `MAP_BATCH` at a time, as one Arrow table: a
    worker holds the ids of `MAP_BATCH` pairs as Python lists at a time, and the file gets large record batches.
    The corpus pages the batch was read from are then unmapped from the worker (`release_mapped_pages`): a worker
    passes over gigabytes of corpus, and would otherwise keep every page it read in its resident memory."""
    schema = Features(token_features(len(tokenizer))).arrow_schema
    release_mapped_pages()
    tables = []
    for start in range(0, len(batch["source"]), MAP_BATCH):
        pairs = {side: batch[side][start : start + MAP_BATCH] for side in ("source", "target")}
        tables.append(pa.Table.from_pydict(encode_pairs(pairs, tokenizer, max_length), schema=schema))
    return pa.concat_tables(tables).combine_chunks() if tables else schema.empty_table()


def tokenize_corpus(
    corpus: DatasetDict | Dataset,
    tokenizer: PreTrainedTokenizerFast,
    max_length: int | None = None,
    cache_dir: str | Path | None = None,
    num_proc: int | None = None,
) -> DatasetDict | Dataset:
    """`input_ids` and `labels` (both ending with </s>) for every split (see the module docstring): the training
    split without its text, with its lengths, without the pairs longer than `max_length` tokens on either side; the
    held-out splits with their text and every pair. A lone `Dataset` is tokenized as a held-out split."""
    try:
        if isinstance(corpus, Dataset):
            return _tokenize_held_out(corpus, tokenizer)
        encoded = {name: _tokenize_held_out(split, tokenizer) for name, split in corpus.items() if name != "train"}
        if "train" in corpus:
            encoded["train"] = tokenize_training_split(corpus["train"], tokenizer, max_length, cache_dir, num_proc)
        return DatasetDict({name: encoded[name] for name in corpus})
    finally:
        _ENCODERS.pop(tokenizer, None)  # its cache of words (tens of MB) is not kept for the run


def _tokenize_held_out(split: Dataset, tokenizer: PreTrainedTokenizerFast) -> Dataset:
    features = Features({**split.features, **token_features(len(tokenizer))})
    return split.map(
        encode_pairs,
        batched=True,
        fn_kwargs={"tokenizer": tokenizer},
        features=features,
        keep_in_memory=True,  # small: nothing written beside the corpus
        desc="tokenizing held-out pairs",
    )


def tokenized_folder(
    train: Dataset, tokenizer: PreTrainedTokenizerFast, max_length: int | None, cache_dir: str | Path | None = None
) -> Path | None:
    """Where the tokenized training split is cached (whether or not it is there yet); None for a split held in
    memory, which is not cached."""
    key = dataset_key(train)
    if key is None:
        return None
    return (
        cache_root(cache_dir) / "tokenized" / key / text_key(tokenizer_identity(tokenizer), max_length, "tokenized-2")
    )


def tokenizer_identity(tokenizer) -> str:
    """What names the tokenizer in the cache's keys: its `tokenizer.json`, or for a tokenizer without one (a converted
    model's: Marian's, FSMT's, fairseq's) its class and the digests of the files it saves."""
    if hasattr(tokenizer, "backend_tokenizer"):
        return tokenizer_to_text(tokenizer)
    with tempfile.TemporaryDirectory() as folder:
        tokenizer.save_pretrained(folder)
        files = sorted(Path(folder).iterdir())
        digests = [f"{file.name}:{hashlib.sha256(file.read_bytes()).hexdigest()}" for file in files]
    return " ".join([type(tokenizer).__name__, *digests])


def tokenize_training_split(
    train: Dataset,
    tokenizer: PreTrainedTokenizerFast,
    max_length: int | None = None,
    cache_dir: str | Path | None = None,
    num_proc: int | None = None,
) -> Dataset:
    """The training split tokenized (see the module docstring), from the cache when it was tokenized before with
    this tokenizer and `max_length`. `num_proc` None: one process per core for a large split, else one."""
    if num_proc is None:
        num_proc = min(os.cpu_count() or 1, 8) if len(train) >= PARALLEL_FROM_PAIRS else 1
    arguments = dict(
        function=encode_record_batch,
        batched=True,
        batch_size=RECORD_BATCH,
        writer_batch_size=RECORD_BATCH,
        fn_kwargs={"tokenizer": tokenizer, "max_length": max_length},
        remove_columns=train.column_names,
        features=Features(token_features(len(tokenizer))),
        num_proc=num_proc if num_proc > 1 else None,
        desc="tokenizing the training split",
    )
    folder = tokenized_folder(train, tokenizer, max_length, cache_dir)
    if folder is None:  # held in memory: tokenized in memory
        return train.map(**arguments, keep_in_memory=True)
    corpus_folder = folder.parent
    with entry_lock(folder, cache_dir):
        if complete_folder(folder) is None:
            with building(folder) as temporary, headers_read_lightly():
                train.map(**arguments, cache_file_name=str(temporary / "train.arrow"))
                moment("tokenize", temporary)
            prune(corpus_folder)
            logger.info("tokenized %s training pairs into %s", f"{len(train):,}", folder)
        touch(folder)
    shards = sorted(folder.glob("train*.arrow"))
    return concatenate_datasets([open_arrow(path) for path in shards])


def length_chunks(train: Dataset) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The source and target lengths of a tokenized training split, in chunks: its length columns' record batches
    as they lie in the memory-mapped file (no copy), or (for a split that selects rows of its file, or was
    tokenized elsewhere) one chunk each, read from its rows."""
    if train._indices is None and all(name in train.column_names for name in LENGTH_COLUMNS):
        source, target = (train.data.column(name).chunks for name in LENGTH_COLUMNS)
        return [c.to_numpy(zero_copy_only=True) for c in source], [c.to_numpy(zero_copy_only=True) for c in target]
    if all(name in train.column_names for name in LENGTH_COLUMNS):
        columns = train.select_columns(list(LENGTH_COLUMNS)).with_format("numpy")[:]
        return [columns["source_length"]], [columns["target_length"]]
    return (
        [np.fromiter((len(ids) for ids in train["input_ids"]), dtype=np.int64, count=len(train))],
        [np.fromiter((len(ids) for ids in train["labels"]), dtype=np.int64, count=len(train))],
    )


def lengths(train: Dataset) -> tuple[np.ndarray, np.ndarray]:
    """The source and target lengths of a tokenized training split, as arrays (`length_chunks` end to end)."""
    none = [np.zeros(0, dtype=np.int32)]  # a table of no record batches
    source, target = length_chunks(train)
    return np.concatenate(source or none), np.concatenate(target or none)
