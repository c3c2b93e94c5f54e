"""A trained model folder exported as a stock MarianMTModel (issue 64), checked against the folder on its own
corpus, one JSON line per check (docs/sharing.md's figures):

    python scripts/marian_export_check.py outputs/vanilla-transformer-en-de --output runs/marian-check

1. logits: the largest difference between ours and the stock MarianMTModel's, fp32, on padded batches of held-out
   sentences (the longest of each batch up to the position table's length);
2. greedy tokens: the test split's first `--sentences`, ours against transformers' MarianMTModel, ONNX Runtime on
   the graphs in Optimum's layout, and transformers.js in headless Chromium (where `node`, the example page's npm
   packages and Chromium are installed; said where not);
3. beam 4: test BLEU of ours (GNMT's penalty, the folder's α) against the MarianMTModel's (transformers' penalty at
   the mapped α, and at the α of best validation BLEU among `--alphas`, chosen on the 200 validation pairs).

Nothing else should run meanwhile (it decodes on every core)."""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import torch


sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("model_dir")
    parser.add_argument("--output", required=True, help="where the export and the figures (marian_check.json) go")
    parser.add_argument("--sentences", type=int, default=200, help="greedy checks on this many test sentences")
    parser.add_argument("--alphas", default="0.6,1.0,1.2,1.5,2.0", help="transformers' alphas to choose among")
    flags = parser.parse_args()
    from length_penalty_probe import held_out_splits
    from sacrebleu import corpus_bleu
    from test_marian_export import browser_missing, onnx_greedy, translate_in_browser
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from hf_vanilla_transformer import VanillaTransformerForConditionalGeneration
    from hf_vanilla_transformer.convert.marian_export import export_marian
    from hf_vanilla_transformer.evaluation.translation import evaluate_translations

    output = Path(flags.output)
    folder = output / "marian"
    if not folder.exists():
        export_marian(flags.model_dir, folder, onnx=True)
    ours = VanillaTransformerForConditionalGeneration.from_pretrained(flags.model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(flags.model_dir)
    marian = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    table = marian.config.max_position_embeddings
    splits = held_out_splits()
    sources, references = list(splits["test"]["source"]), list(splits["test"]["target"])
    figures = {"model": Path(flags.model_dir).name, "table": table}

    def say(name: str, value) -> None:
        figures[name] = value
        print(json.dumps({name: value}), flush=True)

    # 1. Logits on padded batches: 16 sentences a batch, the longest first; one batch at the table's length.
    order = sorted(range(len(sources)), key=lambda i: -len(sources[i]))
    worst = largest = worst64 = 0.0
    ours64, marian64 = copy.deepcopy(ours).double(), copy.deepcopy(marian).double()
    for start in range(0, 128, 16):
        batch = tokenizer([sources[i] for i in order[start : start + 16]], padding=True, truncation=True,
                          max_length=table, text_target=[references[i] for i in order[start : start + 16]],
                          return_tensors="pt")  # fmt: skip
        labels = batch.pop("labels")[:, : table - 1].clamp(min=1)
        decoder_inputs = ours.prepare_decoder_input_ids_from_labels(labels)
        with torch.no_grad():
            a = ours(**batch, decoder_input_ids=decoder_inputs).logits
            b = marian(**batch, decoder_input_ids=decoder_inputs).logits
            # The mapping itself, without fp32's rounding: both models in float64.
            a64 = ours64(**batch, decoder_input_ids=decoder_inputs).logits
            b64 = marian64(**batch, decoder_input_ids=decoder_inputs).logits
        worst = max(worst, (a - b).abs().max().item())
        largest = max(largest, a.abs().max().item())
        worst64 = max(worst64, (a64 - b64).abs().max().item())
    say("logits_max_abs_difference", worst)
    say("logits_largest_abs", largest)
    say("logits_max_abs_difference_float64", worst64)
    say("longest_source_tokens", len(tokenizer(sources[order[0]], truncation=True, max_length=table)["input_ids"]))

    # 2. Greedy tokens.
    chosen = sources[: flags.sentences]
    batch = tokenizer(chosen, padding=True, return_tensors="pt")
    with torch.no_grad():
        mine = ours.generate(**batch, num_beams=1, do_sample=False)  # input length + 50, the folder's rule
        limit = int(batch["attention_mask"].sum(-1).max()) + 50
        theirs = marian.generate(**batch, num_beams=1, do_sample=False, max_new_tokens=limit)
    expected = tokenizer.batch_decode(mine, skip_special_tokens=True)
    special = set(tokenizer.all_special_ids)
    capped = [[t for t in row.tolist() if t not in special] for row in ours.generate(
        **batch, num_beams=1, do_sample=False, relative_max_length=None, max_new_tokens=limit)]  # fmt: skip
    # Stock generate() has one limit for the batch (its longest input + 50), ours one a sentence: compared at the
    # batch's, as ONNX Runtime's are.
    stock = [[t for t in row.tolist() if t not in special] for row in theirs]
    say("greedy_equal_transformers", sum(a == b for a, b in zip(capped, stock, strict=True)))
    onnx = onnx_greedy(folder, tokenizer, chosen, new_tokens=limit)
    say("greedy_equal_onnx_runtime", sum(a == b for a, b in zip(capped, onnx, strict=True)))
    missing = browser_missing()
    if missing:
        say("greedy_equal_transformers_js", f"not run: {missing}")
    else:
        began = time.time()
        browser = translate_in_browser(folder.resolve(), chosen, output / "site")
        say("greedy_equal_transformers_js", sum(a == b for a, b in zip(expected, browser["translations"], strict=True)))
        say("transformers_js_seconds", round(time.time() - began, 1))
    say("greedy_sentences", len(chosen))

    # 3. Beam 4: ours with its own rule, the MarianMTModel's at the mapped alpha and at the alpha chosen on validation.
    scores, _ = evaluate_translations(ours, tokenizer, sources, references, num_beams=4, progress=False)
    say("ours_beam4_test_bleu", round(scores["score"], 2))
    mapped = marian.generation_config.length_penalty
    validation = splits["validation"]
    best = None
    for alpha in sorted({mapped, *(float(a) for a in flags.alphas.split(","))}):
        hypotheses = marian_beam(marian, tokenizer, list(validation["source"]), alpha)
        bleu = corpus_bleu(hypotheses, [list(validation["target"])]).score
        say(f"marian_validation_bleu_alpha_{alpha:g}", round(bleu, 2))
        best = max(best or (bleu, alpha), (bleu, alpha))
    for alpha, name in ((mapped, "mapped"), (best[1], "chosen")):
        hypotheses = marian_beam(marian, tokenizer, sources, alpha)
        say(f"marian_beam4_test_bleu_{name}_alpha_{alpha:g}", round(corpus_bleu(hypotheses, [references]).score, 2))
    (output / "marian_check.json").write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")


def marian_beam(marian, tokenizer, sources: list[str], alpha: float, batch_size: int = 32) -> list[str]:
    """Beam 4 of the stock MarianMTModel at transformers' length penalty `alpha`, each sentence at most its length
    + 50 tokens (the package's rule, given per batch as its longest source + 50), in batches sorted by length."""
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    out = [""] * len(sources)
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        batch = tokenizer([sources[i] for i in chunk], padding=True, return_tensors="pt")
        limit = int(batch["attention_mask"].sum(-1).max()) + 50
        with torch.no_grad():
            ids = marian.generate(**batch, num_beams=4, length_penalty=alpha, early_stopping=True, max_new_tokens=limit)
        for i, text in zip(chunk, tokenizer.batch_decode(ids, skip_special_tokens=True), strict=True):
            out[i] = text
    return out


if __name__ == "__main__":
    main()
