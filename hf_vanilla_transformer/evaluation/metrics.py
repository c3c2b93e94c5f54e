"""BLEU through `evaluate`, with the metric module shipped in this package (no Hub download)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import evaluate
import numpy as np


METRIC_PATH = Path(__file__).with_name("bleu_metric.py")


def load_bleu_metric() -> evaluate.EvaluationModule:
    """sacreBLEU + chrF (+ optional tokenized BLEU) as an `evaluate` module, loaded from this package."""
    return evaluate.load(str(METRIC_PATH))


def compute_bleu(predictions: list[str], references: list[str] | list[list[str]], tokenized: bool = False) -> dict:
    """sacreBLEU, chrF and their signatures for detokenized `predictions` against `references`."""
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions but {len(references)} references; they must pair up.")
    if not predictions:
        raise ValueError("No predictions to score.")
    return load_bleu_metric().compute(predictions=predictions, references=references, tokenized=tokenized)


def seq2seq_bleu_metrics(tokenizer) -> Callable:
    """`compute_metrics` for `Seq2SeqTrainer(predict_with_generate=True)`: decode, then sacreBLEU and chrF."""
    metric = load_bleu_metric()

    def compute_metrics(eval_prediction) -> dict:
        predictions, labels = eval_prediction.predictions, eval_prediction.label_ids
        if isinstance(predictions, tuple):
            predictions = predictions[0]
        predictions = np.where(predictions < 0, tokenizer.pad_token_id, predictions)
        labels = np.where(labels < 0, tokenizer.pad_token_id, labels)
        hypotheses = tokenizer.batch_decode(predictions, skip_special_tokens=True)
        references = tokenizer.batch_decode(labels, skip_special_tokens=True)
        result = metric.compute(predictions=hypotheses, references=references)
        return {"bleu": result["score"], "chrf": result["chrf"]}

    return compute_metrics
