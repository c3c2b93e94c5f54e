"""Translating with an ONNX export (`onnx.py` writes it) in ONNX Runtime, without PyTorch: `generate()`'s beam search
step for step in NumPy, with the model's decoding rules (§6.1 by default: GNMT's length penalty, at most source
length + 50 tokens, a sentence done once it has `num_beams` finished hypotheses; transformers' `|Y|^alpha` penalty and
`early_stopping=False` or `"never"` where the model's generation config says so), and greedy search as one beam.

`onnxruntime` is optional (`pip install hf_vanilla_transformer[deploy]`), imported when used.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..data.batching import inference_batches
from ..data.translation_bounds import TRANSLATION_MAX_TOKENS, encode_within
from .onnx import ONNX_FILES, cache_names
from .rules import EARLY_STOPPING, EXPORT_INFO, PENALTY_NAMES, check_positions, decoding_arguments


class OnnxTranslator:
    """An ONNX folder written by `export_onnx`, translating lists of sentences with ONNX Runtime like `translate()`:
    §6.1's beam search (or greedy search with `num_beams=1`), batched by source length, output in input order."""

    def __init__(self, folder: str | Path, threads: int = 0, providers: list[str] | None = None):
        import onnxruntime
        from tokenizers import Tokenizer

        folder = Path(folder)
        info_file = folder / EXPORT_INFO
        if not info_file.exists():
            raise FileNotFoundError(f"{folder} holds no {EXPORT_INFO}; expected a folder written by scripts/export.py.")
        self.info = json.loads(info_file.read_text(encoding="utf-8"))
        if self.info.get("format") != "onnx":
            raise ValueError(f"{folder} holds a {self.info.get('format')} export; expected an ONNX one (--to onnx).")
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        providers = providers or ["CPUExecutionProvider"]
        self.encoder, self.step = (
            onnxruntime.InferenceSession(str(folder / name), options, providers=providers) for name in ONNX_FILES
        )
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        # The rules recorded_decoding wrote; exports written before the last two were searched with GNMT's
        # penalty and early stopping.
        self.defaults = {"length_penalty_type": "gnmt", "early_stopping": True} | self.info["generation"]

    def encode(self, sentences: list[str]) -> list[list[int]]:
        """Source ids with `</s>` appended, as the package's tokenizer gives them."""
        encodings = self.tokenizer.encode_batch(sentences, add_special_tokens=False)
        return [[*encoding.ids, self.info["eos_token_id"]] for encoding in encodings]

    def translate(
        self,
        sentences: list[str],
        num_beams: int | None = None,
        length_penalty: float | None = None,
        relative_max_length: int | None = None,
        max_batch_size: int = 32,
        length_penalty_type: str | None = None,
        early_stopping: bool | str | None = None,
        max_tokens: int = TRANSLATION_MAX_TOKENS,
    ) -> list[str]:
        """Translations in input order, empty and whitespace-only sentences kept empty; the model's decoding
        defaults (from the export) unless given. The bounds of `translate()`: batches of at most `max_tokens` padded
        source tokens and `max_batch_size` sentences, a longer line refused in one line naming it
        (data/translation_bounds.py), as is one longer than a learned position table."""
        num_beams, alpha, relative = decoding_arguments(
            self.defaults, num_beams, length_penalty, relative_max_length, max_batch_size
        )
        rules = {
            "length_penalty_type": length_penalty_type or self.defaults["length_penalty_type"],
            "early_stopping": self.defaults["early_stopping"] if early_stopping is None else early_stopping,
        }
        outputs = [""] * len(sentences)
        texts = [i for i, sentence in enumerate(sentences) if sentence.strip()]
        sources = encode_within(self.encode, sentences, texts, max_tokens)
        limit = self.info.get("max_source_tokens")
        check_positions([len(source) for source in sources], texts, limit, f"the model's {limit} learned positions")
        for chunk in inference_batches([len(source) for source in sources], max_tokens, max_batch_size):
            ids = self.search([sources[i] for i in chunk], num_beams, alpha, relative, **rules)
            for i, tokens in zip(chunk, ids, strict=True):
                outputs[texts[i]] = self.tokenizer.decode(tokens, skip_special_tokens=True).strip()
        return outputs

    def search(
        self,
        sources: list[list[int]],
        num_beams: int,
        alpha: float,
        relative_max_length: int,
        length_penalty_type: str = "gnmt",
        early_stopping: bool | str = True,
    ) -> list[list[int]]:
        """The generated ids (without the start token, with the final `</s>` if one was produced) of each source.

        `generate()`'s beam search, sentence by sentence: each step scores every running beam's continuations,
        keeps the 2 x num_beams best; those among the best num_beams that end the sentence (`</s>`, or the
        sentence's length limit) become finished hypotheses ranked by log P(Y) / lp(|Y|) (GNMT's
        lp = ((5 + |Y|) / 6)^alpha, or transformers' |Y|^alpha), the best num_beams of the others run on. A sentence
        is done once it has num_beams finished hypotheses (`early_stopping=True`), or, with False or "never", once its
        best running hypothesis divided by lp(its length now; for "never" with alpha > 0, the batch's longest allowed
        length, so that the result depends on the batch, as generate()'s does) cannot beat the worst of them,
        transformers' heuristic; its translation is the best finished hypothesis.
        Finished sentences leave the batch. One beam is greedy search.
        """
        if length_penalty_type not in PENALTY_NAMES:
            raise ValueError(
                f"length_penalty_type={length_penalty_type!r} is invalid; expected one of {tuple(PENALTY_NAMES)}."
            )
        if early_stopping not in EARLY_STOPPING or not isinstance(early_stopping, (bool, str)):
            raise ValueError(f"early_stopping={early_stopping!r} is invalid; expected one of {EARLY_STOPPING}.")
        early_stopping = True if num_beams == 1 else early_stopping  # greedy search ends at its first </s>
        search = _BeamSearch(self, sources, num_beams, relative_max_length)
        search.rules = _StoppingRules(length_penalty_type, alpha, early_stopping, int(search.limits.max()))
        while search.step():
            pass
        return [max(hypotheses, key=lambda item: item[0])[1] for hypotheses in search.finished]


@dataclass
class _StoppingRules:
    """How finished hypotheses are ranked (log P(Y) / lp(|Y|)) and when a sentence is done: `early_stopping` True,
    False or "never" (transformers' rules); `longest` is the batch's longest allowed length ("never" with alpha > 0
    bounds a running hypothesis by lp(longest), as generate() does)."""

    penalty_type: str
    alpha: float
    early_stopping: bool | str
    longest: int

    def penalty(self, length: int) -> float:
        if self.penalty_type == "gnmt":
            return ((5.0 + length) / 6.0) ** self.alpha
        return length**self.alpha

    def done(self, finished: list[tuple[float, list[int]]], survivors: list, beams: int, step: int) -> bool:
        """Whether a sentence with these finished hypotheses (best first) and running `survivors` is done."""
        if len(finished) < beams:
            return False
        if self.early_stopping is True or not survivors:
            return True
        length = self.longest if self.early_stopping == "never" and self.alpha > 0 else step
        return survivors[0][0] / self.penalty(length) <= finished[-1][0]  # no runner can beat the worst finished


class _BeamSearch:
    """The state of `OnnxTranslator.search` over one batch: every sentence's beams are consecutive rows of the
    decoder step's inputs; `active` holds the sentences still searching, and finished ones leave the batch."""

    def __init__(self, translator: OnnxTranslator, sources: list[list[int]], beams: int, relative_max_length: int):
        info = translator.info
        self.translator, self.beams, self.eos = translator, beams, info["eos_token_id"]
        self.rules: _StoppingRules | None = None
        batch, width = len(sources), max(map(len, sources))
        ids = np.full((batch, width), info["pad_token_id"], dtype=np.int64)
        mask = np.zeros((batch, width), dtype=np.int64)
        for row, source in enumerate(sources):
            ids[row, : len(source)], mask[row, : len(source)] = source, 1
        cross = translator.encoder.run(None, {"input_ids": ids, "attention_mask": mask})  # per layer: keys, values
        self.limits = mask.sum(1) + relative_max_length  # new tokens allowed per sentence (§6.1: input length + 50)
        rows = np.repeat(np.arange(batch), beams)
        self.cross, self.mask = [tensor[rows] for tensor in cross], mask[rows]
        heads = info["decoder_attention_heads"]
        self.past = [np.zeros((batch * beams, heads, 0, dim), dtype=cross[0].dtype) for dim in info["head_dims"]]
        self.past = self.past * info["decoder_layers"]
        self.cross_names, self.past_names, _ = cache_names(info["decoder_layers"])
        self.active = np.arange(batch)
        self.running = np.zeros((batch, beams), dtype=np.float32)
        self.running[:, 1:] = -1e9  # the first step expands one beam, as generate() does
        self.sequences = [[[] for _ in range(beams)] for _ in range(batch)]
        self.finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(batch)]
        self.tokens = np.full((batch * beams, 1), info["decoder_start_token_id"], dtype=np.int64)
        self.step_number = 0

    def step(self) -> bool:
        """One decoding step of every active sentence; False once every sentence is done."""
        inputs = {"decoder_input_ids": self.tokens, "attention_mask": self.mask}
        inputs |= dict(zip(self.cross_names, self.cross, strict=True))
        inputs |= dict(zip(self.past_names, self.past, strict=True))
        log_probs, *self.past = self.translator.step.run(None, inputs)
        beams, active, vocab = self.beams, self.active, log_probs.shape[-1]
        scores = self.running[active][:, :, None] + log_probs.reshape(len(active), beams, vocab)
        scores = scores.reshape(len(active), -1)
        keep = 2 * beams  # the best 2 x num_beams continuations, best first
        top = np.argpartition(-scores, keep - 1, axis=1)[:, :keep]
        top = np.take_along_axis(top, np.argsort(-np.take_along_axis(scores, top, 1), axis=1, kind="stable"), 1)
        self.step_number += 1
        next_rows, next_tokens, still = [], [], []
        for n, sentence in enumerate(active):
            candidates = [(scores[n, index], index // vocab, index % vocab) for index in top[n]]
            survivors = self._advance(sentence, candidates)
            if survivors is None:
                continue  # done: its beams leave the batch
            next_rows += [n * beams + beam for _, beam, _ in survivors]
            next_tokens += [token for _, _, token in survivors]
            still.append(n)
        if not still:
            return False
        self.past = [tensor[next_rows] for tensor in self.past]  # each beam continues from the cache it extends
        if len(still) < len(active):  # finished sentences leave the batch
            kept = np.repeat(np.asarray(still), beams) * beams + np.tile(np.arange(beams), len(still))
            self.cross, self.mask = [tensor[kept] for tensor in self.cross], self.mask[kept]
        self.tokens = np.asarray(next_tokens, dtype=np.int64)[:, None]
        self.active = active[still]
        return True

    def _advance(self, sentence: int, candidates: list[tuple[float, int, int]]) -> list | None:
        """Sentence `sentence`'s step from its (score, beam, token) candidates, best first: those among the best
        num_beams that end it (`</s>` or its length limit) join its finished hypotheses, the best num_beams of the
        others run on. Returns those survivors, or None when the sentence is done."""
        beams, step = self.beams, self.step_number
        ends = [token == self.eos or step >= self.limits[sentence] for _, _, token in candidates]
        for rank, ((score, beam, token), end) in enumerate(zip(candidates, ends, strict=True)):
            if end and rank < beams:
                hypothesis = self.sequences[sentence][beam] + [int(token)]
                self.finished[sentence].append((score / self.rules.penalty(step), hypothesis))
        self.finished[sentence] = sorted(self.finished[sentence], key=lambda item: -item[0])[:beams]
        survivors = [c for c, end in zip(candidates, ends, strict=True) if not end][:beams]
        if self.rules.done(self.finished[sentence], survivors, beams, step):
            return None
        self.sequences[sentence] = [self.sequences[sentence][beam] + [int(token)] for _, beam, token in survivors]
        self.running[sentence] = [score for score, _, _ in survivors]
        return survivors
