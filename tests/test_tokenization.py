"""The shared BPE vocabulary (§5.1): fairseq's special-token layout, exact round trip, </s> on both sides."""

from __future__ import annotations

import pytest
from datasets import Dataset, DatasetDict

from hf_vanilla_transformer import VanillaTransformerConfig
from hf_vanilla_transformer.data.corpora import read_parallel_file
from hf_vanilla_transformer.data.tokenizer import (
    check_special_tokens,
    corpus_texts,
    tokenize_corpus,
    train_bpe_tokenizer,
)

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
