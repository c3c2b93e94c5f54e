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
    """`FSMTTokenizer` without Moses' punctuation normalisation: fairseq's `moses` tokenizer and `subword_nmt` BPE."""

    def moses_pipeline(self, text: str, lang: str) -> str:
        """fairseq's Moses tokenizer is given the text as it is (FSMT's normalises punctuation first)."""
        return text


__all__ = ["VanillaTransformerFairseqTokenizer"]
