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
import multiprocessing
import platform
import resource
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from .export import CTranslate2Translator, export_ctranslate2
from .export_onnx import OnnxTranslator, export_onnx
from .inference import load_export, load_translator, translate
from .metrics import compute_bleu


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


def peak_rss_bytes() -> int:
    """The process's peak resident set so far (Linux reports KiB)."""
    try:  # Linux: the high-water mark of this process's own memory (ru_maxrss survives exec, so a spawned child
        # would report its parent's peak when that was higher)
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def describe_cpu() -> str:
    """The CPU's `model name` and the matrix extensions that decide what runs fast on it."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    lines = cpuinfo.splitlines()
    name = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "unknown CPU")
    flags = next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), [])
    extensions = [flag for flag in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16") if flag in flags]
    return f"{name} ({', '.join(extensions) or 'no AVX2'})"


def versions() -> dict[str, str]:
    """The versions of the engines measured."""
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in ("torch", "transformers", "ctranslate2", "onnxruntime"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "not installed"
    return found


def markdown_table(results: dict) -> str:
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


def _engine_memory(
    engine: str, folder: str | None, model_dir: str, sources: list[str], options, workers: int | None = None
) -> int:
    """Peak RSS of a fresh process that loads `engine` and translates `sources` (None: loads nothing but the
    package and the tokenizer, the baseline every engine process pays too)."""
    if options.threads:
        torch.set_num_threads(options.threads)
    if engine == "ours":
        model, tokenizer = load_translator(model_dir)
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
    elif engine in ("ctranslate2", "onnxruntime"):
        exported = load_export("onnx" if engine == "onnxruntime" else engine, folder, workers=workers)
        exported.translate(sources, num_beams=options.num_beams, max_batch_size=options.batch_size)
    else:
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(model_dir)(sources)
    return peak_rss_bytes()


def engine_memory(
    engine: str, folder: str | None, model_dir: str, sources: list[str], options, workers: int | None = None
) -> int:
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(_engine_memory, (engine, folder, model_dir, sources, options, workers))


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
    from .data import load_corpus

    if options.threads:
        torch.set_num_threads(options.threads)
    threads = options.threads or torch.get_num_threads()
    if options.data_files:
        pairs = load_corpus(
            data_files=options.data_files, source_lang=options.source_lang, target_lang=options.target_lang
        )["train"]
    else:
        pairs = load_corpus(options.dataset, options.source_lang, options.target_lang)[options.split]
    sources, references = list(pairs["source"]), list(pairs["target"])
    model, tokenizer = load_translator(options.model_dir)
    results = {
        "options": asdict(options),
        "machine": describe_cpu(),
        "threads": threads,
        "versions": versions(),
        "pairs": len(sources),
        "engines": {},
    }
    engines = results["engines"]

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

    # 1. This package: eager, then compiled with a static cache (its first pass pays the compilation, timed apart).
    engines["ours_eager"] = _time("ours eager", lambda: ours("never"), references, tokenizer)
    first = _time("ours compiled (first pass, compiling)", lambda: ours("always"), references, tokenizer)
    engines["ours_compiled"] = _time("ours compiled", lambda: ours("always"), references, tokenizer)
    engines["ours_compiled"]["first_pass_seconds"] = first["seconds"]
    model = None  # frees ours before the exports load (the closure above is done with it)
    gc.collect()
    with tempfile.TemporaryDirectory() as folder:
        exports = {}
        for quantization in ("float32", "int8"):
            exports[f"onnxruntime_{quantization}"] = export_onnx(
                options.model_dir, Path(folder) / f"onnx-{quantization}", quantization=quantization
            )
            exports[f"ctranslate2_{quantization}"] = export_ctranslate2(
                options.model_dir, Path(folder) / f"ct2-{quantization}", quantization=quantization
            )

        def time_engine(name: str, engine, label: str | None = None, **decoding) -> None:
            """Time `engine` over the split with the benchmark's beams and batches (and `decoding`) as `name`."""

            def run():
                return engine.translate(
                    sources, num_beams=options.num_beams, max_batch_size=options.batch_size, **decoding
                )

            engines[name] = _time(label or name, run, references, tokenizer)

        # 2. ONNX Runtime: the same search as generate() (GNMT's length penalty), so one alpha.
        for quantization in ("float32", "int8"):
            name = f"onnxruntime_{quantization}"
            time_engine(name, OnnxTranslator(exports[name], threads=threads))
        # 3. CTranslate2 as it comes (one worker with every thread), then as this package runs it (one worker per
        #    thread, batches in parallel) at the model's α carried over to its own length penalty (the export's
        #    default) and at the alphas asked for.
        for quantization in ("float32", "int8"):
            name = f"ctranslate2_{quantization}"
            one_worker = CTranslate2Translator(exports[name], threads=threads, workers=1)
            time_engine(f"{name}_one_worker", one_worker, f"{name}, 1 worker x {threads} threads")
            del one_worker
            engine = CTranslate2Translator(exports[name], threads=threads)
            results["ctranslate2_default_alpha"] = engine.defaults["length_penalty"]
            for index, alpha in enumerate([engine.defaults["length_penalty"], *options.alphas]):
                time_engine(name + (f"_alpha{alpha}" if index else ""), engine, length_penalty=alpha)
            del engine
            gc.collect()
        # 4. Memory: each engine in a fresh process over the first 256 sentences, less what a process that loads
        #    only the package and the tokenizer takes.
        sample = sources[:256]
        baseline = engine_memory("none", None, options.model_dir, sample, options)
        memory = {"ours_eager": engine_memory("ours", None, options.model_dir, sample, options) - baseline}
        for name, exported in exports.items():
            kind = name.split("_")[0]
            memory[name] = engine_memory(kind, str(exported), options.model_dir, sample, options) - baseline
            if kind == "ctranslate2":
                one = engine_memory(kind, str(exported), options.model_dir, sample, options, workers=1)
                memory[f"{name}_one_worker"] = one - baseline
    results["peak_rss_above_baseline_bytes"] = {"baseline": baseline, **memory}
    results["memory_ratios"] = {name: value / memory["ours_eager"] for name, value in memory.items()}
    print("peak RSS above baseline (MiB): " + ", ".join(f"{n} {v / 2**20:.0f}" for n, v in memory.items()), flush=True)
    base = engines["ours_eager"]["sentences_per_second"]
    results["speed_ratios"] = {name: e["sentences_per_second"] / base for name, e in engines.items()}
    results["bleu_differences"] = {name: e["bleu"] - engines["ours_eager"]["bleu"] for name, e in engines.items()}
    return results
