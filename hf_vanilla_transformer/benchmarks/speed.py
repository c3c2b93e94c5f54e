"""Side-by-side speed and memory of this package's Transformer and transformers' MarianMTModel.

Both models (`twins.py`) get the same architecture (vocabulary, d_model, layers, heads, FFN, ReLU, scaled embeddings, `[sin | cos]`
sinusoids, tied weights, dropout), the same weights (Marian's are copied from ours, so both compute the same function:
`tests/test_benchmark.py` proves it), the same inputs, dtype, threads and optimizer (AdamW, beta2 0.98, fused), and the
same label-smoothed loss. Every case times its variants in turns (ours, Marian, ours, ...) after warm-up, in one
process; the figures are medians of the repeats and `ratios` divide each variant's speed by Marian eager's.

Cases, for each model size:

* train_labels:  forward + backward + optimizer step on a ragged batch (sentences of 8-64 tokens, padded, about
                 `batch_tokens` target tokens). Ours computes its loss from `labels` (padding skipped, no logits);
                 Marian returns logits and the package's loss is computed from them, as `Trainer` would.
* train_logits:  the same batch, both models given `decoder_input_ids` and the loss computed from their `logits`
                 (the plain training loop many users write).
  With `compile`, train_labels also times both forwards compiled (`torch.compile`, ours with `fullgraph=True`;
  compiled, ours takes the dense path: no padding skip, full logits).
* greedy, beam4: generate() on `generation_batch` sources of 32 tokens, end-of-sentence suppressed so that every
                 variant produces `new_tokens` tokens; eager (dynamic cache) and compiled (static cache, the
                 decoding step compiled by generate() itself: transformers 5 compiles greedy search only, our
                 model its beam search too); the tokens of every variant must equal ours eager.
                 `compile_warmup_seconds` is the compiled variant's first call minus its median call, and
                 `break_even_sentences` the sentences after which compiling has paid for itself.
                 `matrix_products` runs only the matrix products of the same generate() call (encoder, cross-attention
                 keys and values once; then per token each decoder layer's projections and FFN and the output
                 layer), with the same weights, back to back: its time is a floor, and its speed ratio a ceiling, for
                 any implementation that computes these products as one stream of batches over all threads with
                 this machine's kernels, however little else it does.
* peak_memory:   the memory a train_labels step adds (CPU: the profiler's memory timeline in a fresh process; GPU:
                 peak allocated).

On CUDA both models run SDPA without cuDNN's attention kernels, as the package trains and decodes
(`utils/kernels.py`). Speeds are target tokens per second. Model FLOP utilisation divides the matrix-multiply FLOPs
of the real (unpadded) tokens per second by a large matmul's, measured here.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
import warnings
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from ..model.configuration_vanilla_transformer import VanillaTransformerConfig
from ..utils.device import tf32_matmuls
from ..utils.kernels import without_cudnn_attention
from ..utils.machine import cpu_extensions, describe_machine
from .config import DTYPES, GENERATION_CASES, TRAINING_CASES, BenchmarkConfig
from .measure import in_fresh_process, time_in_turns
from .twins import (
    build_models,
    generation_inputs,
    make_generate,
    make_matrix_products,
    make_optimizer,
    make_step,
    paired_config,
    training_batch,
)


# ---------------------------------------------------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------------------------------------------------


def matmul_peak(options: BenchmarkConfig) -> float:
    """FLOP/s of a large square matmul in the benchmark dtype: the reference for model FLOP utilisation."""
    size = 2048 if options.device == "cuda" else 1024
    a, b = (torch.randn(size, size, device=options.device, dtype=DTYPES[options.dtype]) for _ in range(2))
    times = time_in_turns({"mm": lambda: a @ b}, repeats=10, warmup=3, device=options.device)["mm"]
    return 2 * size**3 / statistics.median(times)


def training_flops(config: VanillaTransformerConfig, inputs: dict) -> float:
    """Matrix-multiply FLOPs of one training step (3 x forward) on the real tokens: projections, FFNs, attention
    and output layer, sentence by sentence. Work on padding is not counted: a model that skips it is not penalised,
    one that computes it gets no credit."""
    d, v = config.d_model, config.vocab_size
    sources = inputs["attention_mask"].sum(-1).tolist()
    targets = (inputs["labels"] != -100).sum(-1).tolist()
    total = 0
    for s, t in zip(sources, targets, strict=True):
        encoder = config.encoder_layers * (2 * s * (4 * d * d + 2 * d * config.encoder_ffn_dim) + 4 * s * s * d)
        decoder = config.decoder_layers * (
            2 * t * (4 * d * d + 2 * d * config.decoder_ffn_dim)  # self-attention projections + FFN
            + 2 * (t * 2 * d * d + s * 2 * d * d)  # cross-attention: q, out on the target; k, v on the source
            + 4 * t * t * d  # self-attention scores and mixing (the causal half counted whole, as is usual)
            + 4 * t * s * d  # cross-attention scores and mixing
        )
        total += encoder + decoder + 2 * t * d * v
    return 3 * total


@dataclass
class CaseResult:
    """Per variant: median seconds, spread, target tokens per second; MFU where FLOPs are known."""

    variants: dict[str, dict] = field(default_factory=dict)

    @classmethod
    def of(cls, times: dict, tokens: int, flops: float | None = None, peak: float | None = None) -> CaseResult:
        result = cls()
        for name, t in times.items():
            if name == "first":
                continue
            seconds = statistics.median(t)
            figures = {"seconds": seconds, "spread": [min(t), max(t)], "tokens_per_second": tokens / seconds}
            figures["first_call_seconds"] = times["first"][name]
            if flops is not None:
                figures["mfu"] = flops / seconds / peak
            result.variants[name] = figures
        return result


# ---------------------------------------------------------------------------------------------------------------------
# Memory
# ---------------------------------------------------------------------------------------------------------------------


def peak_memory(size: str, name: str, options: BenchmarkConfig) -> float:
    """Bytes a train_labels step adds on top of the model and optimizer state."""
    if options.device == "cuda":
        return _peak_memory_here(size, name, options)
    # CPU: a fresh process per model, so that one's allocations cannot hide the other's.
    return in_fresh_process(_peak_memory_here, size, name, options)


def _peak_memory_here(size: str, name: str, options: BenchmarkConfig) -> float:
    if options.threads:
        torch.set_num_threads(options.threads)
    model = build_models(size, options)[name].train()
    inputs = training_batch(paired_config(size, options.vocab_size, options.dropout), options)
    optimizer = make_optimizer(model)
    # The optimizer state exists before the measured step: create it with one step on a tiny batch.
    make_step(name, "train_labels", model, optimizer, {key: value[:1, :4] for key, value in inputs.items()}, options)()
    step = make_step(name, "train_labels", model, optimizer, inputs, options)
    if options.device == "cuda":
        step()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step()
        torch.cuda.synchronize()
        return float(torch.cuda.max_memory_allocated() - base)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        step()
    with tempfile.TemporaryDirectory() as folder, warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # the timeline export is deprecated for CUDA, not on CPU
        timeline = Path(folder) / "timeline.json"
        prof.export_memory_timeline(str(timeline), device="cpu")
        _, sizes = json.loads(timeline.read_text())
    return float(max(sum(categories) for categories in sizes))


# ---------------------------------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------------------------------


def benchmark_training(size: str, models: dict, options: BenchmarkConfig, peak: float) -> dict[str, CaseResult]:
    config = models["ours"].config
    inputs = training_batch(config, options)
    tokens = int((inputs["labels"] != -100).sum())
    flops = training_flops(config, inputs)
    results = {}
    for case in [case for case in TRAINING_CASES if case in options.cases]:
        steps = {}
        for name, model in models.items():
            model.train()
            steps[name] = make_step(name, case, model, make_optimizer(model), inputs, options)
            if compiles(name, options) and case == "train_labels":
                steps[f"{name}_compiled"] = make_step(
                    f"{name}_compiled", case, model, make_optimizer(model), inputs, options
                )
        times = time_in_turns(steps, options.repeats, max(options.warmup, 1), options.device)
        results[case] = CaseResult.of(times, tokens, flops, peak)
        report(size, case, results[case])
    return results


def benchmark_generation(size: str, models: dict, options: BenchmarkConfig) -> dict[str, CaseResult]:
    inputs = generation_inputs(options)
    results = {}
    for case, beams in zip(GENERATION_CASES, (1, 4), strict=True):
        if case not in options.cases:
            continue
        runs = {}
        for name, model in models.items():
            runs[name] = make_generate(model.eval(), inputs, beams, False, options)
            if compiles(name, options):
                runs[f"{name}_compiled"] = make_generate(model, inputs, beams, True, options)
        if options.matrix_products:
            runs["matrix_products"] = make_matrix_products(models["ours"], inputs, beams, options)
        outputs, first = {}, {}
        for name, run in runs.items():  # the first call of each variant: the compiled ones compile here
            start = time.perf_counter()
            outputs[name] = run()
            first[name] = time.perf_counter() - start
        agreement = token_agreement(size, case, outputs, options)
        if options.dtype != "fp32":  # the same function in fp32: the tokens must be equal there
            check_fp32_parity(size, case, beams, inputs, options)
        times = {**time_in_turns(runs, options.repeats, 0, options.device), "first": first}
        results[case] = CaseResult.of(times, options.generation_batch * options.new_tokens)
        for name, share in agreement.items():
            results[case].variants[name]["tokens_equal_to_ours"] = share
        for name in list(results[case].variants):
            if name.endswith("_compiled"):
                add_break_even(results[case], name, options.generation_batch)
        report(size, case, results[case])
    return results


def compiles(name: str, options: BenchmarkConfig) -> bool:
    """Whether the variant `name` ("ours", "marian") is also timed compiled."""
    return options.compile and (name == "ours" or options.compile_peers)


def token_agreement(size: str, case: str, outputs: dict, options: BenchmarkConfig) -> dict[str, float]:
    """Each variant's share of tokens equal to ours eager. In fp32 every variant computes the same function and must
    give the same tokens (else a RuntimeError); in bf16 or fp16 two correct implementations round differently, and a
    different token early changes the rest: the share is recorded, the parity checked in fp32 instead."""
    shares = {}
    for name, output in outputs.items():
        if name == "matrix_products":
            continue
        same = output.shape == outputs["ours"].shape and torch.equal(output, outputs["ours"])
        if not same and options.dtype == "fp32":
            raise RuntimeError(f"{size} {case}: {name} generated other tokens than ours eager.")
        if output.shape != outputs["ours"].shape:
            shares[name] = 0.0
        else:
            shares[name] = float((output == outputs["ours"]).float().mean())
    return shares


def check_fp32_parity(size: str, case: str, beams: int, inputs: dict, options: BenchmarkConfig) -> None:
    """Ours and Marian, eager, with the same weights in fp32: the same tokens, or a RuntimeError."""
    fp32 = replace(options, dtype="fp32")
    models = build_models(size, fp32)
    outputs = {name: make_generate(model.eval(), inputs, beams, False, fp32)() for name, model in models.items()}
    if not torch.equal(outputs["ours"], outputs["marian"]):
        raise RuntimeError(f"{size} {case}: in fp32, marian generated other tokens than ours eager.")


def add_break_even(result: CaseResult, name: str, sentences_per_call: int) -> None:
    """What compiling costs once (first call minus a steady call) and the sentences after which it has paid."""
    compiled, eager = result.variants[name], result.variants[name.removesuffix("_compiled")]
    warmup = max(0.0, compiled["first_call_seconds"] - compiled["seconds"])  # noise can make it negative
    saved_per_sentence = (eager["seconds"] - compiled["seconds"]) / sentences_per_call
    compiled["compile_warmup_seconds"] = warmup
    compiled["break_even_sentences"] = warmup / saved_per_sentence if saved_per_sentence > 0 else None


def report(size: str, case: str, result: CaseResult) -> None:
    speeds = ", ".join(f"{name} {v['tokens_per_second']:,.0f}" for name, v in result.variants.items())
    print(f"{size} {case} (target tok/s): {speeds}", flush=True)


def run_benchmark(options: BenchmarkConfig) -> dict:
    """Every case for every size; returns the figures (JSON-ready) with `ratios` to Marian eager."""
    if options.threads:
        torch.set_num_threads(options.threads)
    # Each compiled variant adds graphs for the same forward code (training, prefill and decoding steps, per batch
    # shape): more than dynamo's default limit of 8, after which it would silently run eager.
    limit = max(torch._dynamo.config.recompile_limit, 64)
    tf32 = tf32_matmuls(options.dtype == "tf32") if options.device == "cuda" else nullcontext()
    with torch._dynamo.config.patch(recompile_limit=limit), without_cudnn_attention(options.device), tf32:
        return _run_benchmark(options)


def _run_benchmark(options: BenchmarkConfig) -> dict:
    results = {
        "machine": describe_machine(options.device),
        "amx_bf16": "amx_bf16" in cpu_extensions(),
        "torch": torch.__version__,
        "options": asdict(options),
        "matmul_flops_per_second": matmul_peak(options),
        "sizes": {},
    }
    training = any(case in TRAINING_CASES for case in options.cases)
    for size in options.sizes:
        cases = (
            benchmark_training(size, build_models(size, options), options, results["matmul_flops_per_second"])
            if training
            else {}
        )
        # Fresh twins for generation: training steps have moved the two models' weights apart.
        if any(case in GENERATION_CASES for case in options.cases):
            cases.update(benchmark_generation(size, build_models(size, options), options))
        figures = {case: result.variants for case, result in cases.items()}
        ratios = {
            case: {
                name: v["tokens_per_second"] / variants["marian"]["tokens_per_second"]
                for name, v in variants.items()
                if name != "marian"
            }
            for case, variants in figures.items()
        }
        if options.memory:
            memory = {name: peak_memory(size, name, options) for name in ("ours", "marian")}
            figures["peak_memory"] = {name: {"bytes": value} for name, value in memory.items()}
            ratios["peak_memory"] = {"ours": memory["ours"] / memory["marian"] if memory["marian"] else float("nan")}
            print(
                f"{size} peak_memory: ours {memory['ours'] / 2**20:.1f} MiB, marian {memory['marian'] / 2**20:.1f} MiB"
            )
        results["sizes"][size] = {"cases": figures, "ratios": ratios}
    return results


def speed_table(results: dict) -> str:
    """One row per size and case: tokens/s of each variant and its ratio to Marian eager."""
    options = results["options"]
    lines = [
        f"Machine: {results['machine']} (amx_bf16: {results['amx_bf16']}); torch {results['torch']}; "
        f"{options['device']} {options['dtype']}, attention {options['attn'] or 'sdpa'}; vocabulary "
        f"{options['vocab_size']}; training batches of about {options['batch_tokens']} target tokens; generation "
        f"{options['generation_batch']} x {options['new_tokens']} tokens; medians of {options['repeats']} repeats "
        "taken in turns. Ratios: speed / Marian eager's (memory: lower is better).",
        "",
        "| size | case | ours | ours compiled | Marian | Marian compiled | compile warm-up, break-even | "
        "matrix products alone (ceiling) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for size, figures in results["sizes"].items():
        for case, variants in figures["cases"].items():
            ratios = figures["ratios"][case]
            if case == "peak_memory":
                mib = {name: v["bytes"] / 2**20 for name, v in variants.items()}
                lines.append(
                    f"| {size} | {case} (MiB) | {mib['ours']:,.1f} (**{ratios['ours']:.2f}x**) | | "
                    f"{mib['marian']:,.1f} | | | |"
                )
                continue
            cells = []
            for name in ("ours", "ours_compiled", "marian", "marian_compiled"):
                if name not in variants:
                    cells.append("–")
                    continue
                speed = f"{variants[name]['tokens_per_second']:,.0f}"
                cell = speed if name == "marian" else f"{speed} (**{ratios[name]:.2f}x**)"
                share = variants[name].get("tokens_equal_to_ours", 1.0)
                cells.append(cell + (f", {share:.0%} of ours' tokens" if share < 1.0 else ""))
            warmup = ""
            compiled = variants.get("ours_compiled", {})
            if "compile_warmup_seconds" in compiled:
                even = compiled["break_even_sentences"]
                warmup = f"{compiled['compile_warmup_seconds']:.0f} s, " + (
                    "never" if even is None else f"{even:,.0f} sentences" if even > 0 else "at once"
                )
            ceiling = ""
            if "matrix_products" in variants:
                speed = variants["matrix_products"]["tokens_per_second"]
                ceiling = f"{speed:,.0f} (**{ratios['matrix_products']:.2f}x**)"
            lines.append(f"| {size} | {case} | " + " | ".join(cells) + f" | {warmup} | {ceiling} |")
    return "\n".join(lines)
