"""The tokenizer of a model converted from a fairseq checkpoint: fairseq's own text pipeline, as `fairseq-interactive
--tokenizer moses --bpe subword_nmt` and `TransformerModel.from_pretrained(...).translate()` run it.

fairseq tokenizes with Moses (aggressive dash splits, escaping), splits words with its BPE codes and looks the pieces
up in its dictionary, appending `</s>`. transformers' `FSMTTokenizer` does all of that on the same files (the
converter writes them: vocab-src.json, vocab-tgt.json, merges.txt), but first normalises punctuation as Moses'
`normalize-punctuation.perl` (`"it",` becomes `"it,"`, `…` becomes `...`), which fairseq's tokenizer does not: this
tokenizer leaves that step out, so that its ids are fairseq's. Not the paper's; saved beside a converted model's
files (`register_for_auto_class`), it loads with `trust_remote_code=True` where this package is not installed and
imports nothing but transformers.
"""

from transformers import FSMTTokenizer


class VanillaTransformerFairseqTokenizer(FSMTTokenizer):
    """`FSMTTokenizer` without Moses' punctuation normalisation: fairseq's `moses` tokenizer and `subword_nmt` BPE.

    Args:
        moses_no_dash_splits (`bool`, *optional*, defaults to `False`):
            fairseq's `--moses-no-dash-splits`: Moses leaves `a-b` whole (FSMT and fairseq's default split it).
        moses_no_escape (`bool`, *optional*, defaults to `False`):
            fairseq's `--moses-no-escape`: Moses leaves `&`, `'`, `"`, `<`, ... as they are instead of `&amp;`, ...
        kwargs: `FSMTTokenizer`'s (`langs`, `src_vocab_file`, `tgt_vocab_file`, `merges_file`, ...).
    """

    def __init__(self, *args, moses_no_dash_splits: bool = False, moses_no_escape: bool = False, **kwargs):
        self.moses_no_dash_splits, self.moses_no_escape = bool(moses_no_dash_splits), bool(moses_no_escape)
        super().__init__(*args, moses_no_dash_splits=moses_no_dash_splits, moses_no_escape=moses_no_escape, **kwargs)

    def moses_pipeline(self, text: str, lang: str) -> str:
        """fairseq's Moses tokenizer is given the text as it is (FSMT's normalises punctuation first)."""
        return text

    def moses_tokenize(self, text: str, lang: str) -> list[str]:
        """Moses as fairseq's `moses` tokenizer runs it: dash splits and escaping unless the flags turn them off."""
        if lang not in self.cache_moses_tokenizer:
            self.cache_moses_tokenizer[lang] = self.sm.MosesTokenizer(lang=lang)
        return self.cache_moses_tokenizer[lang].tokenize(
            text,
            aggressive_dash_splits=not self.moses_no_dash_splits,
            return_str=False,
            escape=not self.moses_no_escape,
        )


__all__ = ["VanillaTransformerFairseqTokenizer"]
