"""The bounds of what a translation reads, one rule for every engine (`translate()`, the CTranslate2 and ONNX
translators, the `translate` and `score` commands): at most `max_tokens` padded source tokens a batch, so no line
longer than that; a line of more than `CHARS_PER_TOKEN` characters a token refused before it is tokenized (a file
without line ends, a megabyte of one word), one of more tokens after; each refusal a ValueError in one line naming
the line and its length."""

from __future__ import annotations

from collections.abc import Callable, Sequence


# Padded source tokens a batch of translation holds by default (the commands' --max_tokens).
TRANSLATION_MAX_TOKENS = 4000
# Characters a sentence may hold per token of `max_tokens` before it is refused without being tokenized: far more
# than any tokenizer's average (a byte-level BPE's token is 2-5 characters), so that only a line no batch could hold
# is refused unread; the others are counted in tokens.
CHARS_PER_TOKEN = 32


def check_max_tokens(max_tokens) -> int:
    """`max_tokens`, a positive whole number of tokens; a ValueError naming it otherwise."""
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens={max_tokens!r} is invalid; expected a positive number of tokens.")
    return max_tokens


def encode_within(
    encode: Callable[[list[str]], list[Sequence]],
    sentences: list[str],
    texts: list[int],
    max_tokens: int,
    appended: int = 0,
) -> list[Sequence]:
    """The sentences `texts` (indices into `sentences`) encoded by `encode` (a list of sentences to their token
    lists), each at most `max_tokens` tokens long, counting `appended` tokens the engine adds itself (CTranslate2's
    `</s>`): a sentence longer than `CHARS_PER_TOKEN` characters a token is refused before it is tokenized, one of
    more tokens after; the ValueError names its line (index + 1) and its length."""
    check_max_tokens(max_tokens)
    most = max_tokens * CHARS_PER_TOKEN
    for index in texts:
        if len(sentences[index]) > most:
            raise ValueError(
                f"line {index + 1} is {len(sentences[index]):,} characters long, more than max_tokens={max_tokens} "
                f"tokens can hold ({most:,} characters); split it, or raise max_tokens (--max_tokens)."
            )
    encoded = list(encode([sentences[i] for i in texts])) if texts else []
    for index, tokens in zip(texts, encoded, strict=True):
        if len(tokens) + appended > max_tokens:
            raise ValueError(
                f"line {index + 1} is {len(tokens) + appended:,} tokens long, more than max_tokens={max_tokens} (the "
                "padded source tokens of a batch); split it, or raise max_tokens (--max_tokens)."
            )
    return encoded
