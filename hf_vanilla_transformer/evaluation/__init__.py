"""Translating and scoring: `translation` (many sentences, batched by length, compiled on request), `metrics`
(sacreBLEU, chrF and the paper's tokenized BLEU through `evaluate`, with the metric module `bleu_metric` shipped
here), `length_penalty` (the GNMT α chosen on the validation split, §6.1)."""
