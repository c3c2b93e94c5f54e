"""One byte-pair-encoding vocabulary shared by source and target (§5.1), as a `PreTrainedTokenizerFast`.

The BPE works on bytes (as GPT-2's), so every text encodes without unknown tokens and decodes back exactly.
Special tokens follow fairseq's layout, which the model config expects: `<s>`=0 (decoder start), `<pad>`=1,
`</s>`=2 (appended to every source and target), `<unk>`=3.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path

from datasets import Dataset, DatasetDict
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast


SPECIAL_TOKENS = ["<s>", "<pad>", "</s>", "<unk>"]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")  # what save_pretrained writes


def train_bpe_tokenizer(
    texts: Iterable[str], vocab_size: int = 8000, min_frequency: int = 2
) -> PreTrainedTokenizerFast:
    """Learn a byte-level BPE of `vocab_size` tokens (specials included) from `texts` (both languages)."""
    if vocab_size < len(SPECIAL_TOKENS) + 256:
        raise ValueError(f"vocab_size={vocab_size} is too small; a byte-level BPE needs at least 260 tokens.")
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer=trainer)
    eos = backend.token_to_id("</s>")
    # Every source and every target ends with </s>; the decoder input starts with <s> (see shift_tokens_right).
    backend.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", eos)])
    return wrap_tokenizer(backend)


def wrap_tokenizer(backend: Tokenizer) -> PreTrainedTokenizerFast:
    """The `tokenizers` object as a transformers tokenizer with the special tokens named."""
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<s>",
        pad_token="<pad>",
        eos_token="</s>",
        unk_token="<unk>",
        model_max_length=1_000_000,  # sinusoidal positions have no length limit
        clean_up_tokenization_spaces=False,
    )


def corpus_texts(corpus: Dataset | DatasetDict, split: str = "train") -> Iterator[str]:
    """Source and target sentences of a split, for learning the shared vocabulary."""
    data = corpus[split] if isinstance(corpus, DatasetDict) else corpus
    for batch in data.iter(batch_size=1000):
        yield from batch["source"]
        yield from batch["target"]


def check_special_tokens(tokenizer: PreTrainedTokenizerFast, config) -> None:
    """Raise a ValueError naming the mismatch when the tokenizer's special ids differ from the model config's."""
    pairs = {
        "pad_token_id": (tokenizer.pad_token_id, config.pad_token_id),
        "eos_token_id": (tokenizer.eos_token_id, config.eos_token_id),
        "decoder_start_token_id": (tokenizer.bos_token_id, config.decoder_start_token_id),
    }
    for name, (ours, theirs) in pairs.items():
        if ours != theirs:
            raise ValueError(f"The tokenizer gives {name}={ours} but the model config says {theirs}.")
    if len(tokenizer) > config.vocab_size:
        raise ValueError(f"The tokenizer has {len(tokenizer)} tokens but the model only {config.vocab_size}.")


def copy_tokenizer_files(source: str | Path, target: str | Path) -> list[Path]:
    """Copy the tokenizer files (`TOKENIZER_FILES`) that `source` holds into `target`; returns the copies."""
    source, target = Path(source), Path(target)
    return [Path(shutil.copy2(source / name, target / name)) for name in TOKENIZER_FILES if (source / name).exists()]
