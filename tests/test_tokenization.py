"""The shared BPE vocabulary (§5.1): fairseq's special-token layout, exact round trip, </s> on both sides."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from datasets import Dataset, DatasetDict

from hf_vanilla_transformer import VanillaTransformerConfig
from hf_vanilla_transformer.data.corpora import read_parallel_file
from hf_vanilla_transformer.data.pipeline import tokenize_corpus
from hf_vanilla_transformer.data.tokenizer import check_special_tokens, corpus_texts, train_bpe_tokenizer

from conftest import FIXTURES


FIXTURE = FIXTURES / "libreoffice_help_en_de_200.tsv"


@pytest.fixture(scope="module")
def pairs() -> Dataset:
    return read_parallel_file(FIXTURE)


@pytest.fixture(scope="module")
def tokenizer(pairs):
    return train_bpe_tokenizer(corpus_texts(pairs), vocab_size=600)


def test_special_tokens_follow_the_model_config(tokenizer):
    assert tokenizer.convert_ids_to_tokens([0, 1, 2, 3]) == ["<s>", "<pad>", "</s>", "<unk>"]
    config = VanillaTransformerConfig(vocab_size=len(tokenizer))
    assert (tokenizer.bos_token_id, tokenizer.pad_token_id, tokenizer.eos_token_id) == (
        config.decoder_start_token_id,
        config.pad_token_id,
        config.eos_token_id,
    )
    check_special_tokens(tokenizer, config)
    with pytest.raises(ValueError, match="pad_token_id=1 but the model config says 0"):
        check_special_tokens(tokenizer, VanillaTransformerConfig(vocab_size=len(tokenizer), pad_token_id=0))


def test_one_vocabulary_for_both_languages(tokenizer):
    assert len(tokenizer) == 600
    # German-only and English-only words are both in the one vocabulary.
    assert tokenizer.tokenize("Speichern")[0] != "<unk>" and tokenizer.tokenize("Save")[0] != "<unk>"


def test_round_trip_is_exact_on_the_corpus(tokenizer, pairs):
    texts = list(pairs["source"]) + list(pairs["target"]) + ["Größe ≥ 3 → „Zitat“ — 日本語, tabs\tand  spaces"]
    for text in texts:
        ids = tokenizer(text)["input_ids"]
        assert ids[-1] == tokenizer.eos_token_id
        assert tokenizer.unk_token_id not in ids
        assert tokenizer.decode(ids, skip_special_tokens=True) == text


def test_tokenize_corpus_adds_eos_to_sources_and_labels_and_filters_long_training_pairs(tokenizer, pairs):
    corpus = DatasetDict({"train": pairs, "test": pairs.select(range(5))})
    encoded = tokenize_corpus(corpus, tokenizer, max_length=12)
    assert all(len(ids) <= 12 for ids in encoded["train"]["input_ids"])
    assert 0 < len(encoded["train"]) < len(pairs)
    assert len(encoded["test"]) == 5  # held-out splits keep every pair
    first = encoded["test"][0]
    assert first["input_ids"][-1] == tokenizer.eos_token_id and first["labels"][-1] == tokenizer.eos_token_id
    assert tokenizer.decode(first["labels"], skip_special_tokens=True) == pairs[0]["target"]


def test_save_and_reload(tokenizer, tmp_path):
    from transformers import AutoTokenizer

    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    text = "Choose Format - Cells."
    assert loaded(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert loaded.pad_token_id == 1 and loaded.eos_token_id == 2 and loaded.bos_token_id == 0


def test_too_small_a_vocabulary_is_refused(pairs):
    with pytest.raises(ValueError, match="vocab_size=100 is too small"):
        train_bpe_tokenizer(corpus_texts(pairs), vocab_size=100)


def test_the_training_split_is_tokenized_without_text_in_narrow_ids_with_its_lengths(tokenizer, pairs, tmp_path):
    from hf_vanilla_transformer.data.corpora import parallel_files_corpus
    from hf_vanilla_transformer.data.pipeline import length_chunks, lengths, tokenized_folder

    corpus = parallel_files_corpus(str(FIXTURE), str(FIXTURE), cache_dir=tmp_path, carve=True)
    assert tokenized_folder(corpus["train"], tokenizer, 12, tmp_path).exists() is False
    encoded = tokenize_corpus(corpus, tokenizer, max_length=12, cache_dir=tmp_path, num_proc=2)
    train = encoded["train"]
    assert train.column_names == ["input_ids", "labels", "source_length", "target_length"]  # no text
    assert train.features["input_ids"].feature.dtype == "uint16"  # 600 tokens fit 16 bits
    assert encoded["validation"].column_names[:2] == ["source", "target"]  # held-out pairs keep their text
    # The ids are the tokenizer's own, both sides ending with </s>; long pairs are dropped inside the map.
    kept = [
        (s, t)
        for s, t in zip(corpus["train"]["source"], corpus["train"]["target"], strict=True)  # (the test pairs carved)
        if max(len(tokenizer(s)["input_ids"]), len(tokenizer(text_target=t)["input_ids"])) <= 12
    ]
    assert len(train) == len(kept) and 0 < len(kept) < len(pairs) and train._indices is None
    assert train[0]["input_ids"] == tokenizer(kept[0][0])["input_ids"]
    assert train[-1]["labels"] == tokenizer(text_target=kept[-1][1])["input_ids"]
    source, target = lengths(train)
    assert source.tolist() == [len(tokenizer(s)["input_ids"]) for s, _ in kept]
    assert target.tolist() == [len(tokenizer(text_target=t)["input_ids"]) for _, t in kept]
    # The batch sampler reads the same lengths a record batch at a time, from the mapped file: no copy.
    sources, targets = length_chunks(train)
    assert np.array_equal(np.concatenate(sources), source) and np.array_equal(np.concatenate(targets), target)
    assert all(not chunk.flags.owndata and not chunk.flags.writeable for chunk in (*sources, *targets))
    # Cached: tokenized again, the same files are read, not written.
    folder = tokenized_folder(corpus["train"], tokenizer, 12, tmp_path)
    files = sorted(entry["filename"] for entry in train.cache_files)
    assert files and all(name.startswith(str(folder)) for name in files)
    again = tokenize_corpus(corpus, tokenizer, max_length=12, cache_dir=tmp_path)
    assert sorted(entry["filename"] for entry in again["train"].cache_files) == files


def test_the_bpe_learns_from_a_seeded_capped_sample_and_is_cached(pairs, tmp_path):
    from hf_vanilla_transformer.data.corpora import parallel_files_corpus
    from hf_vanilla_transformer.data.pipeline import bpe_sample, bpe_sample_texts, learn_tokenizer

    def sampled(split, size, seed=0):
        return [source for chunk in bpe_sample(split, size, seed) for source in chunk["source"]]

    sample = sampled(pairs, 50)
    assert len(sample) == 50 and sample == sampled(pairs, 50) and sample != sampled(pairs, 50, seed=1)
    positions = [pairs["source"].index(source) for source in sample]
    assert positions == sorted(positions)  # in corpus order
    assert sampled(pairs, 10**6) == pairs["source"]  # a corpus under the cap is read whole
    train = parallel_files_corpus(str(FIXTURE), cache_dir=tmp_path)["train"]
    capped = learn_tokenizer(train, 400, sample_pairs=50, cache_dir=tmp_path)
    assert capped.get_vocab() == train_bpe_tokenizer(bpe_sample_texts(train, 50), 400).get_vocab()
    # A second run on the same corpus with the same settings reads the learned BPE instead of learning it again.
    (cached,) = (tmp_path / "tokenizers").iterdir()
    before = (cached / "tokenizer.json").stat().st_mtime_ns
    assert learn_tokenizer(train, 400, sample_pairs=50, cache_dir=tmp_path).get_vocab() == capped.get_vocab()
    assert (cached / "tokenizer.json").stat().st_mtime_ns == before
    assert len(list((tmp_path / "tokenizers").iterdir())) == 1
    learn_tokenizer(train, 400, sample_pairs=60, cache_dir=tmp_path)  # other settings: another entry
    assert len(list((tmp_path / "tokenizers").iterdir())) == 2


@pytest.mark.parametrize("rows, pairs, chunk", [(250, 40, 64), (250, 249, 64), (100, 7, 100)])
def test_the_bpe_sample_is_uniform_without_holding_the_split(rows, pairs, chunk, monkeypatch):
    """Drawn a chunk at a time (each chunk's share from the hypergeometric law of what is left), every row is as
    likely to be read as any other, each sample holds `pairs` distinct rows in order, and a seed gives one sample."""
    from hf_vanilla_transformer.data import pipeline

    monkeypatch.setattr(pipeline, "SAMPLE_CHUNK", chunk)
    seeds = 4000
    counts = np.zeros(rows)
    for seed in range(seeds):
        drawn = np.concatenate(list(pipeline.bpe_sample_rows(rows, pairs, seed)))
        assert len(drawn) == pairs and np.all(np.diff(drawn) > 0) and drawn[0] >= 0 and drawn[-1] < rows
        counts[drawn] += 1
    expected = seeds * pairs / rows
    spread = np.sqrt(seeds * pairs / rows * (1 - pairs / rows))
    assert np.all(np.abs(counts - expected) <= 5 * spread + 1e-9), (counts.min(), counts.max(), expected)
    first = [np.concatenate(list(pipeline.bpe_sample_rows(rows, pairs, 7))) for _ in range(2)]
    assert np.array_equal(*first)
    with pytest.raises(ValueError, match="bpe_sample_pairs=0 is invalid"):
        list(pipeline.bpe_sample_rows(rows, 0))


def test_corpus_and_tokenized_files_hold_large_record_batches_with_the_same_ids(tokenizer, tmp_path, monkeypatch):
    """Opening a file maps pages around every record batch's header, so both files are written in large batches
    (`WRITE_BATCH`, `RECORD_BATCH` pairs; smaller here, but larger than the 1,000 rows `datasets.map` writes by
    default); the ids are still encoded `MAP_BATCH` pairs at a time."""
    import datasets

    from hf_vanilla_transformer.data import corpora, pipeline

    monkeypatch.setattr(datasets.config, "DEFAULT_MAX_BATCH_SIZE", 10)  # what a writer left to its default would use
    monkeypatch.setattr(corpora, "WRITE_BATCH", 1300)
    monkeypatch.setattr(pipeline, "RECORD_BATCH", 2000)
    monkeypatch.setattr(pipeline, "MAP_BATCH", 300)
    (tmp_path / "large.tsv").write_text(FIXTURE.read_text(encoding="utf-8") * 13, encoding="utf-8")  # 2,600 pairs
    files = (str(tmp_path / "large.tsv"), str(FIXTURE), str(FIXTURE))  # (none carved out of the training file)
    train = corpora.parallel_files_corpus(*files, cache_dir=tmp_path)["train"]
    assert [batch.num_rows for batch in train.data.table.to_batches()] == [1300, 1300]
    encoded = pipeline.tokenize_training_split(train, tokenizer, max_length=40, cache_dir=tmp_path, num_proc=1)
    whole = pipeline.encode_pairs(train[:], tokenizer, max_length=40)  # every pair at once, as lists
    assert encoded["input_ids"] == whole["input_ids"] and encoded["labels"] == whole["labels"]
    assert encoded["target_length"] == whole["target_length"] and 0 < len(encoded) < len(train)
    kept = [len(pipeline.encode_pairs(train[i : i + 2000], tokenizer, 40)["labels"]) for i in (0, 2000)]
    assert [batch.num_rows for batch in encoded.data.table.to_batches()] == kept and kept[0] > 1000


def test_words_encoded_once_give_the_tokenizers_own_ids(tokenizer, pairs, monkeypatch):
    """`ChunkCachedEncoder` (each distinct whitespace-delimited chunk encoded once) gives the ids the tokenizer gives
    whole sentences: on the corpus, and on random strings of every kind of space, special tokens, contractions,
    marks and symbols; with its cache emptied as it fills; and through the tokenizer itself where chunks would not
    be exact (a normalizer)."""
    import random

    from tokenizers import normalizers

    from hf_vanilla_transformer.data import tokenizer as tokenization

    def own(texts, tok=tokenizer):
        return tok(texts)["input_ids"]

    alphabet = [*"ab Zé1 2\t\n\r  \u00a0\u3000\x1c\x1f\x0b\x0c\u2028\u0085'.,!?-_\u4e2d\u0301😀"]
    alphabet += ["<s>", "</s>", "<pad>", "<unk>", "'s", "'ll", " '", "\u200b", "  ", "\t "]
    rng = random.Random(0)
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 20))) for _ in range(20000)]
    texts += [*pairs["source"], *pairs["target"], "", " ", "a", " a", "a ", "  a  b  "]
    encoder = tokenization.ChunkCachedEncoder(tokenizer)
    assert encoder.exact and encoder.suffix == [tokenizer.eos_token_id] and encoder.prefix == []
    assert encoder(texts) == own(texts)
    monkeypatch.setattr(tokenization, "CHUNK_CACHE_SIZE", 50)  # emptied again and again
    assert tokenization.ChunkCachedEncoder(tokenizer)(texts[:3000]) == own(texts[:3000])
    normalized = copy.deepcopy(tokenizer)
    normalized.backend_tokenizer.normalizer = normalizers.NFKC()
    fallback = tokenization.ChunkCachedEncoder(normalized)
    assert not fallback.exact and fallback(texts[:3000]) == own(texts[:3000], normalized)
