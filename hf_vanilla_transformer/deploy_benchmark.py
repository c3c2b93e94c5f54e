"""Deploy benchmark: one trained model, one test split, every engine side by side in one process.

For each engine — this package's `generate()` (eager), CTranslate2 float32 and int8 (exports written here) — it
translates the test split with beam 4 in batches of `batch_size` sentences sorted by length and reports sentences/s,
target tokens/s, the peak resident memory the engine added, and sacreBLEU/chrF; ratios divide by ours eager. Engines
run one after the other (each is timed over the whole split), so nothing else may run on the machine meanwhile.
CTranslate2 is also run at several length-penalty alphas (`alphas`), as its beam search divides by length^alpha where
ours uses GNMT's ((5 + length) / 6)^alpha.
"""

from __future__ import annotations

import gc
import resource
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from .export import CTranslate2Translator, export_ctranslate2
from .inference import load_translator, translate
from .metrics import compute_bleu


@dataclass
class DeployBenchmarkConfig:
    model_dir: str = "outputs/vanilla-transformer-en-de"
    dataset: str = "libreoffice-help"
    source_lang: str = "en"
    target_lang: str = "de"
    split: str = "test"
    num_beams: int = 4
    batch_size: int = 32
    threads: int | None = None
    alphas: list[float] = field(default_factory=lambda: [0.6, 1.0, 1.5])


def peak_rss_bytes() -> int:
    """The process's peak resident set so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _time(engine: str, run, references: list[str], tokenizer) -> dict:
    gc.collect()
    before = peak_rss_bytes()
    start = time.perf_counter()
    hypotheses = run()
    seconds = time.perf_counter() - start
    scores = compute_bleu(hypotheses, references)
    tokens = sum(len(tokenizer(h, add_special_tokens=False)["input_ids"]) + 1 for h in hypotheses)
    figures = {
        "seconds": seconds,
        "sentences_per_second": len(hypotheses) / seconds,
        "target_tokens_per_second": tokens / seconds,
        "peak_rss_added_bytes": max(0, peak_rss_bytes() - before),
        "bleu": scores["score"],
        "chrf": scores["chrf"],
    }
    print(
        f"{engine}: {figures['sentences_per_second']:.1f} sentences/s, BLEU {figures['bleu']:.2f}, "
        f"chrF {figures['chrf']:.2f}",
        flush=True,
    )
    return figures


def run_deploy_benchmark(options: DeployBenchmarkConfig) -> dict:
    from .data import load_corpus

    if options.threads:
        torch.set_num_threads(options.threads)
    pairs = load_corpus(options.dataset, options.source_lang, options.target_lang)[options.split]
    sources, references = list(pairs["source"]), list(pairs["target"])
    model, tokenizer = load_translator(options.model_dir)
    results = {"options": asdict(options), "pairs": len(sources), "engines": {}}
    engines = results["engines"]
    tokens_per_batch = 10**9  # batches by sentence count only

    def ours():
        return translate(
            model,
            tokenizer,
            sources,
            max_tokens=tokens_per_batch,
            max_sentences=options.batch_size,
            progress=False,
            compile="never",
            num_beams=options.num_beams,
        )

    engines["ours_eager"] = _time("ours eager", ours, references, tokenizer)
    with tempfile.TemporaryDirectory() as folder:
        for quantization in ("float32", "int8"):
            exported = export_ctranslate2(options.model_dir, Path(folder) / quantization, quantization=quantization)
            engine = CTranslate2Translator(exported, threads=options.threads or torch.get_num_threads())
            for alpha in options.alphas:
                name = f"ctranslate2_{quantization}_alpha{alpha}"

                def run(engine=engine, alpha=alpha):
                    return engine.translate(
                        sources, num_beams=options.num_beams, length_penalty=alpha, max_batch_size=options.batch_size
                    )

                engines[name] = _time(name, run, references, tokenizer)
            del engine
            gc.collect()
    base = engines["ours_eager"]["sentences_per_second"]
    results["speed_ratios"] = {name: e["sentences_per_second"] / base for name, e in engines.items()}
    results["bleu_differences"] = {name: e["bleu"] - engines["ours_eager"]["bleu"] for name, e in engines.items()}
    return results
