"""Deploy benchmark: one trained model, one test split, every engine side by side in one process.

For each engine — this package's `generate()` (eager, and compiled with a static cache), ONNX Runtime float32 and int8,
CTranslate2 float32 and int8 (exports written here) — it translates the test split with beam 4 in batches of
`batch_size` sentences sorted by length and reports sentences/s, target tokens/s and sacreBLEU/chrF, then the peak
resident memory of each engine in a fresh process; ratios divide by ours eager. Engines run one after the other
(each is timed over the whole split), so nothing else may run on the machine meanwhile.
CTranslate2 runs once as it comes (one worker with every thread) and then as `CTranslate2Translator` runs it (one
worker per thread: batches in parallel, the same translations), at its export's default alpha (the model's, carried
over to CTranslate2's rule: `ctranslate2_alpha`) and at several other alphas (`alphas`), as its beam search divides by length^alpha where ours uses GNMT's
((5 + length) / 6)^alpha.
"""

from __future__ import annotations

import gc
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..data.corpora import load_corpus
from ..deploy.ctranslate2 import CTranslate2Translator, export_ctranslate2
from ..deploy.engines import load_export
from ..deploy.onnx import export_onnx
from ..deploy.onnx_translator import OnnxTranslator
from ..evaluation.metrics import compute_bleu
from ..evaluation.translation import load_translator, translate
from ..utils.machine import describe_cpu, peak_rss_bytes
from .measure import in_fresh_process, versions


QUANTIZATIONS = ("float32", "int8")
# The exports measured, as (row name prefix, engine of `deploy.engines`): ONNX Runtime runs the "onnx" engine.
EXPORTS = (("onnxruntime", "onnx"), ("ctranslate2", "ctranslate2"))


@dataclass
class DeployBenchmarkConfig:
    model_dir: str = "outputs/vanilla-transformer-en-de"
    dataset: str = "libreoffice-help"
    source_lang: str = "en"
    target_lang: str = "de"
    split: str = "test"
    data_files: str | None = None  # your own pairs (a TSV, a JSONL, or 'src.txt,ref.txt') instead of the dataset
    num_beams: int = 4
    batch_size: int = 32
    threads: int | None = None
    alphas: list[float] = field(default_factory=lambda: [0.6, 1.0, 1.5])


def deploy_table(results: dict) -> str:
    """The figures as a Markdown table (speed and memory as ratios to ours eager), with the machine named."""
    engines, memory = results["engines"], results.get("memory_ratios", {})
    base = engines["ours_eager"]
    lines = [
        f"Machine: {results['machine']}, {results['threads']} threads; "
        + ", ".join(f"{name} {v}" for name, v in results["versions"].items())
        + f"; {results['pairs']:,} test pairs, beam {results['options']['num_beams']}, batches of "
        f"{results['options']['batch_size']} sentences sorted by length.",
        "",
        "| engine | sentences/s | target tokens/s | speed | BLEU | chrF | peak RSS added | memory |",
        "|---|---|---|---|---|---|---|---|",
    ]
    added = results.get("peak_rss_above_baseline_bytes", {})
    for name, figures in engines.items():
        kind = name.split("_alpha")[0]
        memory_cell = f"{added[kind] / 2**20:,.0f} MiB" if kind in added else ""
        ratio_cell = f"{memory[kind]:.2f}x" if kind in memory else ""
        lines.append(
            f"| {name} | {figures['sentences_per_second']:.1f} | {figures['target_tokens_per_second']:,.0f} | "
            f"**{figures['sentences_per_second'] / base['sentences_per_second']:.2f}x** | {figures['bleu']:.2f} | "
            f"{figures['chrf']:.2f} | {memory_cell} | {ratio_cell} |"
        )
    first_pass = engines.get("ours_compiled", {}).get("first_pass_seconds")
    if first_pass is not None:
        lines += ["", f"ours_compiled's first pass, compiling as it went, took {first_pass:.1f} s."]
    return "\n".join(lines)


def _engine_memory(engine: str | None, folder: str | None, sources: list[str], options, workers: int | None) -> int:
    """Peak RSS of this (fresh) process once it has loaded `engine` ("torch": this package's generate(), or an
    engine of `deploy.engines`) and translated `sources`; None loads nothing but the package and the tokenizer, the
    baseline every engine process pays too."""
    if options.threads:
        torch.set_num_threads(options.threads)
    if engine == "torch":
        model, tokenizer = load_translator(options.model_dir)
        translate(
            model,
            tokenizer,
            sources,
            max_tokens=10**9,
            max_sentences=options.batch_size,
            progress=False,
            compile="never",
            num_beams=options.num_beams,
        )
    elif engine is not None:
        exported = load_export(engine, folder, workers=workers)
        exported.translate(sources, num_beams=options.num_beams, max_batch_size=options.batch_size)
    else:
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(options.model_dir)(sources)
    return peak_rss_bytes()


def engine_memory(
    engine: str | None, folder: str | None, sources: list[str], options, workers: int | None = None
) -> int:
    """`_engine_memory` in a fresh process."""
    return in_fresh_process(_engine_memory, engine, folder, sources, options, workers)


def _time(engine: str, run, references: list[str], tokenizer) -> dict:
    gc.collect()
    start = time.perf_counter()
    hypotheses = run()
    seconds = time.perf_counter() - start
    scores = compute_bleu(hypotheses, references)
    tokens = sum(len(tokenizer(h, add_special_tokens=False)["input_ids"]) + 1 for h in hypotheses)
    figures = {
        "seconds": seconds,
        "sentences_per_second": len(hypotheses) / seconds,
        "target_tokens_per_second": tokens / seconds,
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
    """Every engine on the test split, then each engine's memory in a fresh process; the figures (JSON-ready) with
    speed and memory ratios to ours eager and BLEU differences."""
    if options.threads:
        torch.set_num_threads(options.threads)
    sources, references = _test_pairs(options)
    results = {
        "options": asdict(options),
        "machine": describe_cpu(),
        "threads": options.threads or torch.get_num_threads(),
        "versions": versions(),
        "pairs": len(sources),
        "engines": {},
    }
    model, tokenizer = load_translator(options.model_dir)
    _time_ours(model, tokenizer, sources, references, options, results["engines"])
    model = None  # frees ours before the exports load
    gc.collect()
    with tempfile.TemporaryDirectory() as folder:
        exports = _export_all(options.model_dir, Path(folder))
        _time_exports(exports, tokenizer, sources, references, options, results)
        # Memory: each engine in a fresh process over the first 256 sentences, less what a process that loads only
        # the package and the tokenizer takes.
        memory = _memories(exports, sources[:256], options)
    base = results["engines"]["ours_eager"]
    results["peak_rss_above_baseline_bytes"] = memory
    results["memory_ratios"] = {
        name: value / memory["ours_eager"] for name, value in memory.items() if name != "baseline"
    }
    added = ", ".join(f"{n} {v / 2**20:.0f}" for n, v in memory.items() if n != "baseline")
    print(f"peak RSS above baseline (MiB): {added}", flush=True)
    results["speed_ratios"] = {
        n: e["sentences_per_second"] / base["sentences_per_second"] for n, e in results["engines"].items()
    }
    results["bleu_differences"] = {name: e["bleu"] - base["bleu"] for name, e in results["engines"].items()}
    return results


def _test_pairs(options: DeployBenchmarkConfig) -> tuple[list[str], list[str]]:
    if options.data_files:
        corpus = load_corpus(
            data_files=options.data_files, source_lang=options.source_lang, target_lang=options.target_lang
        )
        pairs = corpus["train"]
    else:
        pairs = load_corpus(options.dataset, options.source_lang, options.target_lang)[options.split]
    return list(pairs["source"]), list(pairs["target"])


def _time_ours(model, tokenizer, sources, references, options, engines: dict) -> None:
    """This package: eager, then compiled with a static cache (its first pass pays the compilation, timed apart)."""

    def ours(compile: str):
        return translate(
            model,
            tokenizer,
            sources,
            max_tokens=10**9,  # batches by sentence count only
            max_sentences=options.batch_size,
            progress=False,
            compile=compile,
            num_beams=options.num_beams,
        )

    engines["ours_eager"] = _time("ours eager", lambda: ours("never"), references, tokenizer)
    first = _time("ours compiled (first pass, compiling)", lambda: ours("always"), references, tokenizer)
    engines["ours_compiled"] = _time("ours compiled", lambda: ours("always"), references, tokenizer)
    engines["ours_compiled"]["first_pass_seconds"] = first["seconds"]


def _export_all(model_dir: str, folder: Path) -> dict[str, tuple[str, Path]]:
    """Every export measured, written under `folder`: {row name: (engine, export folder)}."""
    writers = {"onnx": export_onnx, "ctranslate2": export_ctranslate2}
    exports = {}
    for quantization in QUANTIZATIONS:
        for prefix, engine in EXPORTS:
            path = writers[engine](model_dir, folder / f"{engine}-{quantization}", quantization=quantization)
            exports[f"{prefix}_{quantization}"] = (engine, path)
    return exports


def _time_exports(exports: dict, tokenizer, sources, references, options, results: dict) -> None:
    """ONNX Runtime (the same search as generate(): one alpha), then CTranslate2 as it comes (one worker with every
    thread) and as this package runs it (one worker per thread, batches in parallel) at the model's alpha carried
    over to its own length penalty (the export's default) and at the alphas asked for."""
    engines, threads = results["engines"], results["threads"]

    def time_engine(name: str, engine, label: str | None = None, **decoding) -> None:
        def run():
            return engine.translate(sources, num_beams=options.num_beams, max_batch_size=options.batch_size, **decoding)

        engines[name] = _time(label or name, run, references, tokenizer)

    for quantization in QUANTIZATIONS:
        name = f"onnxruntime_{quantization}"
        time_engine(name, OnnxTranslator(exports[name][1], threads=threads))
    for quantization in QUANTIZATIONS:
        name = f"ctranslate2_{quantization}"
        one_worker = CTranslate2Translator(exports[name][1], threads=threads, workers=1)
        time_engine(f"{name}_one_worker", one_worker, f"{name}, 1 worker x {threads} threads")
        del one_worker
        engine = CTranslate2Translator(exports[name][1], threads=threads)
        results["ctranslate2_default_alpha"] = engine.defaults["length_penalty"]
        for index, alpha in enumerate([engine.defaults["length_penalty"], *options.alphas]):
            time_engine(name + (f"_alpha{alpha}" if index else ""), engine, length_penalty=alpha)
        del engine
        gc.collect()


def _memories(exports: dict, sample: list[str], options) -> dict[str, int]:
    """Peak RSS above the baseline process of ours eager and of every export (CTranslate2 also with one worker)."""
    baseline = engine_memory(None, None, sample, options)
    memory = {"baseline": baseline, "ours_eager": engine_memory("torch", None, sample, options) - baseline}
    for name, (engine, folder) in exports.items():
        memory[name] = engine_memory(engine, str(folder), sample, options) - baseline
        if engine == "ctranslate2":
            memory[f"{name}_one_worker"] = engine_memory(engine, str(folder), sample, options, workers=1) - baseline
    return memory
