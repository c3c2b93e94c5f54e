"""`evaluate` metric module: sacreBLEU with its signature, chrF, and the paper-style tokenized BLEU.

Shipped inside the package because `evaluate.load("sacrebleu")` downloads its script from the Hugging Face Hub.
Load it with `hf_vanilla_transformer.metrics.load_bleu_metric()`, or `evaluate.load(path_to_this_file)`.

* `score`, `signature`: sacreBLEU on detokenized text (the number to report and compare; its signature says how).
* `chrf`, `chrf_signature`: sacreBLEU's chrF.
* `tokenized_bleu` (with `tokenized=True`): BLEU on text split by sacreBLEU's 13a tokenizer with hyphenated
  compounds split as in tensor2tensor's `get_ende_bleu.sh` ("a-b" -> "a ##AT##-##AT## b"), as the paper reported.
"""

from __future__ import annotations

import re

import datasets
import evaluate
import sacrebleu
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a


_CITATION = """\
@inproceedings{post-2018-call,
  title = "A Call for Clarity in Reporting {BLEU} Scores",
  author = "Post, Matt",
  booktitle = "Proceedings of the Third Conference on Machine Translation: Research Papers",
  year = "2018",
  pages = "186--191",
}
"""

_DESCRIPTION = "sacreBLEU and chrF with their signatures, and optionally BLEU on 13a-tokenized, compound-split text."

_KWARGS_DESCRIPTION = """
Args:
    predictions: list of translations (detokenized strings).
    references: list of references, one string or a list of strings per prediction.
    tokenized: also compute the paper-style tokenized BLEU (default False).
Returns:
    score, signature, counts, totals, precisions, bp, sys_len, ref_len, chrf, chrf_signature
    and, with tokenized=True, tokenized_bleu.
"""

_COMPOUND = re.compile(r"(\S)-(\S)")


def paper_tokenize(text: str) -> str:
    r"""13a tokenization, then tensor2tensor's compound splitting of hyphenated words: one global pass of
    `s{(\S)-(\S)}{$1 ##AT##-##AT## $2}g`, as its Perl one-liner does."""
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", Tokenizer13a()(text))


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class TranslationBleu(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=[
                datasets.Features(
                    {"predictions": datasets.Value("string"), "references": datasets.Sequence(datasets.Value("string"))}
                ),
                datasets.Features({"predictions": datasets.Value("string"), "references": datasets.Value("string")}),
            ],
            reference_urls=["https://github.com/mjpost/sacrebleu"],
        )

    def _compute(self, predictions, references, tokenized: bool = False):
        references = [[ref] if isinstance(ref, str) else list(ref) for ref in references]
        counts = {len(refs) for refs in references}
        if len(counts) != 1:
            raise ValueError(f"Every prediction needs the same number of references; got {sorted(counts)}.")
        streams = [list(stream) for stream in zip(*references, strict=True)]  # sacreBLEU wants one list per reference
        bleu = sacrebleu.metrics.BLEU()
        result = bleu.corpus_score(predictions, streams)
        chrf = sacrebleu.metrics.CHRF()
        chrf_result = chrf.corpus_score(predictions, streams)
        output = {
            "score": result.score,
            "signature": str(bleu.get_signature()),
            "counts": result.counts,
            "totals": result.totals,
            "precisions": result.precisions,
            "bp": result.bp,
            "sys_len": result.sys_len,
            "ref_len": result.ref_len,
            "chrf": chrf_result.score,
            "chrf_signature": str(chrf.get_signature()),
        }
        if tokenized:
            tokenized_bleu = sacrebleu.metrics.BLEU(tokenize="none", force=True)
            output["tokenized_bleu"] = tokenized_bleu.corpus_score(
                [paper_tokenize(p) for p in predictions],
                [[paper_tokenize(r) for r in stream] for stream in streams],
            ).score
        return output
