"""One byte-pair-encoding vocabulary shared by source and target (§5.1), as a `PreTrainedTokenizerFast`.

The BPE works on bytes (as GPT-2's), so every text encodes without unknown tokens and decodes back exactly.
Special tokens follow fairseq's layout, which the model config expects: `<s>`=0 (decoder start), `<pad>`=1,
`</s>`=2 (appended to every source and target), `<unk>`=3.
"""

from __future__ import annotations

import gc
import inspect
import json
import re
import shutil
from collections.abc import Iterable, Iterator
from itertools import chain
from pathlib import Path

from datasets import Dataset, DatasetDict
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast


SPECIAL_TOKENS = ["<s>", "<pad>", "</s>", "<unk>"]
TOKENIZER_FILES = (
    *("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"),  # what save_pretrained writes
    # and the files of the tokenizers a converted model keeps (hf_vanilla_transformer.convert): Marian's SentencePiece
    # models and vocabulary, FSMT's vocabularies and merges, the tokenizer of converted fairseq models
    *("source.spm", "target.spm", "vocab.json", "target_vocab.json", "vocab-src.json", "vocab-tgt.json", "merges.txt"),
    "tokenization_vanilla_transformer.py",
)


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
    """Raise a ValueError naming the mismatch when the tokenizer's special ids differ from the model config's.

    Decoding starts from the tokenizer's `<s>`, or for a converted model from the special token its family starts
    from (Marian: `<pad>`, fairseq: `</s>`)."""
    pairs = {
        "pad_token_id": (tokenizer.pad_token_id, config.pad_token_id),
        "eos_token_id": (tokenizer.eos_token_id, config.eos_token_id),
    }
    for name, (ours, theirs) in pairs.items():
        if ours != theirs:
            raise ValueError(f"The tokenizer gives {name}={ours} but the model config says {theirs}.")
    starts = sorted({tokenizer.bos_token_id, tokenizer.pad_token_id, tokenizer.eos_token_id} - {None})
    if config.decoder_start_token_id not in starts:
        raise ValueError(
            f"The model config's decoder_start_token_id={config.decoder_start_token_id} is none of the tokenizer's "
            f"<s>, <pad>, </s> ids {starts}."
        )
    if getattr(config, "source_vocab_size", None) is not None:
        raise ValueError(
            f"The model has a source vocabulary of its own (source_vocab_size={config.source_vocab_size}): a converted "
            "FSMT or fairseq model with separate dictionaries, whose tokenizer encodes targets with the source's. "
            "It translates, but this package trains models with one vocabulary only."
        )
    if len(tokenizer) > config.vocab_size:
        raise ValueError(f"The tokenizer has {len(tokenizer)} tokens but the model only {config.vocab_size}.")


def copy_tokenizer_files(source: str | Path, target: str | Path) -> list[Path]:
    """Copy the tokenizer files (`TOKENIZER_FILES`) that `source` holds into `target`; returns the copies."""
    source, target = Path(source), Path(target)
    return [Path(shutil.copy2(source / name, target / name)) for name in TOKENIZER_FILES if (source / name).exists()]


# What every transformers tokenizer reads from its tokenizer_config.json besides its own class's arguments
# (PreTrainedTokenizerBase.__init__): lengths, sides, spacing, input names, the special and added tokens, the class.
COMMON_TOKENIZER_KEYS = frozenset(
    {
        *("model_max_length", "padding_side", "truncation_side", "model_input_names", "backend"),
        *("clean_up_tokenization_spaces", "split_special_tokens", "added_tokens_decoder", "tokenizer_class"),
        *("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"),
        *("additional_special_tokens", "extra_special_tokens"),
    }
)
CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json", "additional_chat_templates")


def tokenizer_keys(tokenizer_class: type) -> frozenset[str]:
    """The tokenizer_config.json keys `tokenizer_class` defines: its own and its bases' named `__init__` arguments,
    and what every tokenizer reads (`COMMON_TOKENIZER_KEYS`)."""
    keys = set(COMMON_TOKENIZER_KEYS)
    for klass in tokenizer_class.__mro__:
        if "__init__" in vars(klass):
            parameters = inspect.signature(vars(klass)["__init__"]).parameters.values()
            keys |= {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return frozenset(keys - {"self"})


def save_tokenizer(tokenizer, folder: str | Path) -> None:
    """`tokenizer.save_pretrained(folder)`, keeping nothing of the folder it was loaded from that its class does not
    define: transformers writes back every key of the source's tokenizer_config.json, so a source naming code of
    its own (`auto_map`, which `trust_remote_code=True` then runs) or another class (`tokenizer_class`) would hand
    it on. tokenizer_config.json keeps the keys of `tokenizer_keys`, the class transformers names, and an `auto_map`
    only where the class is this package's own (its file saved beside it); a chat template is not kept."""
    folder = Path(folder)
    tokenizer.save_pretrained(folder)
    path = folder / "tokenizer_config.json"
    written = json.loads(path.read_text(encoding="utf-8"))
    allowed = tokenizer_keys(type(tokenizer))
    kept = {key: value for key, value in written.items() if key in allowed}
    own = f"{type(tokenizer).__module__.rsplit('.', 1)[-1]}.{type(tokenizer).__name__}"
    if getattr(tokenizer, "_auto_class", None) is not None and (folder / f"{own.split('.')[0]}.py").is_file():
        kept["auto_map"] = {
            tokenizer._auto_class: [own, None]
        }  # this package's class and file, as transformers names it
    path.write_text(json.dumps(kept, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
    for name in CHAT_TEMPLATE_FILES:
        if (folder / name).is_dir():
            shutil.rmtree(folder / name)
        else:
            (folder / name).unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------------------------------
# Encoding millions of sentences: each distinct word is encoded once
# ---------------------------------------------------------------------------------------------------------------------

# A byte-level BPE's pre-tokenizer (GPT-2's pattern) never joins a non-space character to the whitespace after it:
# every match is a whitespace run, or starts with at most one space followed by no whitespace. So a sentence split
# before each whitespace that follows a non-space is split where the pre-tokenizer splits it, and its ids are the
# chunks' ids end to end. The split is taken only where both sides are beyond doubt: after a character Python calls
# no space (Python's spaces include every Unicode space the BPE's pattern knows) and before an ASCII space, tab or
# line end (spaces to both).
CHUNK_BOUNDARY = re.compile(r"(?<=\S)(?=[ \t\n\r])")
CHUNK_CACHE_SIZE = 1 << 18  # chunks whose ids a `ChunkCachedEncoder` keeps (emptied when full)


class ChunkCachedEncoder:
    """The ids `tokenizer` gives each sentence (its specials included, as `tokenizer(sentences)` gives them), with
    each distinct whitespace-delimited chunk of text encoded once and its ids reused: a corpus repeats its words,
    and the BPE's pattern-matching pre-tokenizer is most of the cost of encoding (the ids are the same, see
    `CHUNK_BOUNDARY`; tests/test_tokenization.py checks them against the tokenizer's own). Tokenizers this does not
    hold for (a normalizer, another pre-tokenizer, a prefix space, truncation or padding) are used as they are."""

    def __init__(self, tokenizer: PreTrainedTokenizerFast):
        self.backend = tokenizer.backend_tokenizer
        self.tokens = len(tokenizer)
        self.cache: dict[str, list[int]] = {}
        plain, special = (self.backend.encode("a", add_special_tokens=flag).ids for flag in (False, True))
        at = next((i for i in range(len(special) - len(plain) + 1) if special[i : i + len(plain)] == plain), None)
        self.exact = at is not None and chunks_encode_exactly(self.backend)  # (specials around the text only)
        self.prefix, self.suffix = (special[:at], special[at + len(plain) :]) if at is not None else ([], [])
        self._encode = getattr(self.backend, "encode_batch_fast", self.backend.encode_batch)

    def __call__(self, sentences: list[str]) -> list[list[int]]:
        if not self.exact:
            return [encoding.ids for encoding in self._encode(sentences)]
        collecting = gc.isenabled()
        gc.disable()  # millions of short lists and no cycle among them: the collector's passes cost a tenth
        try:
            return self._chunked(sentences)
        finally:
            if collecting:
                gc.enable()

    def _chunked(self, sentences: list[str]) -> list[list[int]]:
        pieces = [CHUNK_BOUNDARY.split(sentence) for sentence in sentences]
        new = {chunk for chunks in pieces for chunk in chunks if chunk not in self.cache}
        if len(self.cache) + len(new) > CHUNK_CACHE_SIZE:
            self.cache.clear()
            new = {chunk for chunks in pieces for chunk in chunks}
        if new:
            new = list(new)
            self.cache.update(zip(new, (e.ids for e in self._encode(new, add_special_tokens=False)), strict=True))
        lookup, prefix, suffix = self.cache.__getitem__, self.prefix, self.suffix
        return [[*prefix, *chain.from_iterable(map(lookup, chunks)), *suffix] for chunks in pieces]


def chunks_encode_exactly(backend: Tokenizer) -> bool:
    """Whether `backend` encodes a text as its whitespace-delimited chunks end to end (`CHUNK_BOUNDARY`): a byte-level
    BPE without a prefix space, with its pattern, no normalizer, no truncation or padding, and added tokens without
    whitespace or stripping."""
    state = json.loads(backend.to_str())
    pre = state.get("pre_tokenizer") or {}
    added = state.get("added_tokens") or []
    return (
        state.get("normalizer") is None
        and pre.get("type") == "ByteLevel"
        and pre.get("use_regex", True)
        and not pre.get("add_prefix_space", False)
        and (state.get("model") or {}).get("type") == "BPE"
        and (state.get("model") or {}).get("dropout") is None
        and backend.truncation is None
        and backend.padding is None
        and all(not re.search(r"\s", t["content"]) and not t.get("lstrip") and not t.get("rstrip") for t in added)
    )
