"""Side-by-side speed and memory of this package's Transformer and transformers' MarianMTModel.

Both models get the same architecture (vocabulary, d_model, layers, heads, FFN, ReLU, scaled embeddings, `[sin | cos]`
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
                 variant produces `new_tokens` tokens; eager (dynamic cache) and compiled (static cache,
                 `torch.compile(forward)`); the tokens of every variant must equal ours eager.
                 `compile_warmup_seconds` is the compiled variant's first call minus its median call, and
                 `break_even_sentences` the sentences after which compiling has paid for itself.
                 `matrix_products` runs only the matrix products of the same generate() call (encoder, cross-attention
                 keys and values once; then per token each decoder layer's projections and FFN and the output
                 layer), with the same weights, back to back: its time is a floor, and its speed ratio a ceiling, for
                 any implementation that computes these products as one stream of batches over all threads with
                 this machine's kernels, however little else it does.
* peak_memory:   the memory a train_labels step adds (CPU: the profiler's memory timeline in a fresh process; GPU:
                 peak allocated).

Speeds are target tokens per second. Model FLOP utilisation divides the matrix-multiply FLOPs of the real (unpadded)
tokens per second by a large matmul's, measured here.
"""

from __future__ import annotations

import json
import multiprocessing
import platform
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile
from transformers import MarianConfig, MarianMTModel

from .configuration_vanilla_transformer import PRESETS, VanillaTransformerConfig, symmetric_preset
from .loss_vanilla_transformer import label_smoothed_loss
from .modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration, shift_tokens_right


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

# Model sizes: "tiny" is what people train on laptop CPUs (d_model 128, 2 + 2 layers, 2 heads); the others are the
# package's presets; "toy" (d_model 32) only checks that the benchmark runs.
SIZES: dict[str, dict] = {
    "toy": {**PRESETS["tiny"], "dropout": 0.1},
    "tiny": symmetric_preset(128, layers=2, heads=2, ffn_dim=512),
    "small": PRESETS["small"],
    "base": PRESETS["base"],
    "big": PRESETS["big"],
}
TRAINING_CASES = ("train_labels", "train_logits")
GENERATION_CASES = ("greedy", "beam4")


@dataclass
class BenchmarkConfig:
    """What to measure and how; every field is a flag of `scripts/benchmark.py`."""

    sizes: list[str] = field(default_factory=lambda: ["tiny", "small", "base"])
    device: str = "cpu"
    dtype: str = "fp32"
    attn: str | None = None  # attention backend for both models (default: transformers' choice, SDPA)
    vocab_size: int = 8000
    dropout: float = 0.1
    batch_tokens: int = 1500  # target tokens per training batch, about
    generation_batch: int = 8
    new_tokens: int = 32
    threads: int | None = None
    repeats: int = 15
    warmup: int = 2
    compile: bool = True  # add the compiled variants
    memory: bool = True  # measure peak_memory

    def __post_init__(self) -> None:
        unknown = [size for size in self.sizes if size not in SIZES]
        if unknown:
            raise ValueError(f"Unknown benchmark size(s) {unknown}; expected some of {sorted(SIZES)}.")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype={self.dtype!r} is invalid; expected one of {sorted(DTYPES)}.")
        if self.repeats < 1 or self.warmup < 0:
            raise ValueError(f"repeats={self.repeats} and warmup={self.warmup}; expected repeats >= 1, warmup >= 0.")


# ---------------------------------------------------------------------------------------------------------------------
# Models and inputs
# ---------------------------------------------------------------------------------------------------------------------

MARIAN_FIELDS = (
    *("vocab_size", "d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads"),
    *("decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim", "dropout"),
    *("pad_token_id", "eos_token_id", "bos_token_id", "decoder_start_token_id"),
)


def paired_config(size: str, vocab_size: int, dropout: float) -> VanillaTransformerConfig:
    """Our configuration for `size`, with Marian's sinusoid layout so that the two models can hold the same weights."""
    return VanillaTransformerConfig(
        **{**SIZES[size], "vocab_size": vocab_size, "dropout": dropout, "sinusoid_layout": "concat"}
    )


def marian_twin(ours: VanillaTransformerForConditionalGeneration, max_positions: int = 512) -> MarianMTModel:
    """A MarianMTModel with our architecture and a copy of our weights (same names, Marian's layout)."""
    config = ours.config
    marian_config = MarianConfig(
        **{name: getattr(config, name) for name in MARIAN_FIELDS},
        activation_function="relu",
        scale_embedding=True,
        attention_dropout=config.attention_dropout,
        activation_dropout=config.activation_dropout,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
        max_position_embeddings=max_positions,
        forced_eos_token_id=None,
    )
    marian = MarianMTModel(marian_config)
    # Our names are Marian's except that our FFN is a module of its own (`ffn.fc1`, Marian: `fc1`).
    state = {
        name.replace(".ffn.", "."): tensor
        for name, tensor in ours.state_dict().items()
        if "embed_positions" not in name and not name.endswith("embed_tokens.weight")
    }
    missing, unexpected = marian.load_state_dict(state, strict=False)
    # What Marian has and we lack: its position tables (the same sinusoids, tabulated), its zero output bias, and
    # the tied names of the one embedding matrix.
    left = {name for name in missing if "embed_positions" not in name and "embed_tokens" not in name}
    if unexpected or left - {"final_logits_bias", "lm_head.weight"}:
        raise RuntimeError(f"Weights do not map onto Marian: missing {sorted(left)}, unexpected {unexpected}.")
    marian.tie_weights()
    return marian


def build_models(size: str, options: BenchmarkConfig) -> dict[str, torch.nn.Module]:
    """Ours and its Marian twin, in the benchmark's dtype and attention backend."""
    torch.manual_seed(0)
    ours = VanillaTransformerForConditionalGeneration(paired_config(size, options.vocab_size, options.dropout))
    models = {"ours": ours, "marian": marian_twin(ours)}
    for model in models.values():
        model.to(device=options.device, dtype=torch.float16 if options.dtype == "fp16" else torch.float32)
        if options.attn:
            model.set_attn_implementation(options.attn)
        model.generation_config.max_length = None
    return models


def training_batch(config: VanillaTransformerConfig, options: BenchmarkConfig) -> dict[str, torch.Tensor]:
    """Pairs of 8-64 tokens each side (about `batch_tokens` target tokens in all), right-padded."""
    generator = torch.Generator().manual_seed(1)
    batch = max(1, round(options.batch_tokens / 36))  # 36: the mean of 8..64
    lengths = torch.randint(8, 65, (2, batch), generator=generator)
    source = torch.full((batch, int(lengths[0].max())), config.pad_token_id)
    labels = torch.full((batch, int(lengths[1].max())), -100)
    for i in range(batch):
        source[i, : lengths[0, i]] = torch.randint(4, config.vocab_size, (int(lengths[0, i]),), generator=generator)
        labels[i, : lengths[1, i]] = torch.randint(4, config.vocab_size, (int(lengths[1, i]),), generator=generator)
    decoder_input_ids = shift_tokens_right(labels, config.pad_token_id, config.decoder_start_token_id)
    inputs = {
        "input_ids": source,
        "attention_mask": (source != config.pad_token_id).long(),
        "decoder_input_ids": decoder_input_ids,
        "decoder_attention_mask": (decoder_input_ids != config.pad_token_id).long(),
        "labels": labels,
    }
    return {key: value.to(options.device) for key, value in inputs.items()}


def autocast(options: BenchmarkConfig) -> torch.autocast:
    """bf16 runs under autocast on float32 weights; fp32 and fp16 run as the weights are."""
    return torch.autocast(options.device, dtype=DTYPES[options.dtype], enabled=options.dtype == "bf16")


def make_optimizer(model) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=True)


def make_step(name: str, case: str, model, optimizer, inputs: dict, options: BenchmarkConfig) -> Callable:
    """One training step: forward, label-smoothed loss (epsilon 0.1 for both), backward, AdamW step. Ours computes
    its loss from `labels` except in train_logits; Marian always from its logits."""
    from_labels = name.startswith("ours") and case != "train_logits"
    forward = model.forward
    if name.endswith("_compiled"):
        forward = torch.compile(model.forward, fullgraph=name.startswith("ours"))
    no_labels = {key: value for key, value in inputs.items() if key != "labels"}

    def step() -> torch.Tensor:
        with autocast(options):
            if from_labels:
                loss = forward(**inputs).loss
            else:
                loss = label_smoothed_loss(forward(**no_labels).logits, inputs["labels"], 0.1)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    return step


def generation_inputs(options: BenchmarkConfig) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(2)
    source = torch.randint(4, options.vocab_size, (options.generation_batch, 32), generator=generator)
    return {"input_ids": source.to(options.device), "attention_mask": torch.ones_like(source).to(options.device)}


def make_generate(model, inputs: dict, num_beams: int, compiled: bool, options: BenchmarkConfig) -> Callable:
    """generate() with `num_beams`; compiled: a static cache and the forward compiled once, on this model."""
    if compiled:
        model = CompiledForward(model)
    extra = {"cache_implementation": "static"} if compiled else {}

    def run() -> torch.Tensor:
        with autocast(options), torch.no_grad():
            return model.generate(
                **inputs,
                num_beams=num_beams,
                do_sample=False,
                max_new_tokens=options.new_tokens,
                min_new_tokens=options.new_tokens,
                suppress_tokens=[model.config.eos_token_id],
                early_stopping=False,
                **extra,
            )

    return run


def make_matrix_products(model, inputs: dict, num_beams: int, options: BenchmarkConfig) -> Callable:
    """Only the matrix products of `make_generate(model, inputs, num_beams, ...)`, each an `F.linear` with the
    model's own weights and biases on as many rows as generate() gives it: the floor of that call's time.

    generate() runs the encoder once on the sources, then repeats each encoder output for the beams, so the
    cross-attention keys and values are computed once on (sentences x beams x source length) rows; every step after
    that runs each decoder layer's self-attention projections, its cross-attention query and output and its FFN, and
    the output layer, on one row per beam."""
    sentences, source_length = inputs["input_ids"].shape
    rows = sentences * num_beams
    encoder, decoder = model.get_encoder(), model.get_decoder()

    def linears(layers, part: str, names: tuple[str, ...]) -> list[torch.nn.Linear]:
        return [getattr(getattr(layer, part), name) for layer in layers for name in names]

    once = [
        (sentences * source_length, linears(encoder.layers, "self_attn", ("q_proj", "k_proj", "v_proj", "out_proj"))),
        (sentences * source_length, linears(encoder.layers, "ffn", ("fc1", "fc2"))),
        (rows * source_length, linears(decoder.layers, "encoder_attn", ("k_proj", "v_proj"))),
    ]
    per_step = linears(decoder.layers, "self_attn", ("q_proj", "k_proj", "v_proj", "out_proj"))
    per_step += linears(decoder.layers, "encoder_attn", ("q_proj", "out_proj"))
    per_step += linears(decoder.layers, "ffn", ("fc1", "fc2"))
    dtype = next(model.parameters()).dtype
    shapes = {(count, linear.in_features) for count, group in once for linear in group}
    shapes |= {(rows, linear.in_features) for linear in per_step}
    # One input per shape, reused: only the products are timed.
    data = {shape: torch.randn(*shape, device=options.device, dtype=dtype) for shape in shapes}
    output_layer = model.get_output_embeddings().weight  # (V, d): the projection onto the vocabulary
    last = torch.randn(rows, output_layer.shape[1], device=options.device, dtype=dtype)
    linear = torch.nn.functional.linear

    def run() -> None:
        with autocast(options), torch.no_grad():
            for count, group in once:
                for layer in group:
                    linear(data[count, layer.in_features], layer.weight, layer.bias)
            for _ in range(options.new_tokens):
                for layer in per_step:
                    linear(data[rows, layer.in_features], layer.weight, layer.bias)
                linear(last, output_layer)

    return run


class CompiledForward:
    """A model whose `forward` is compiled only while this wrapper calls it, so that its eager variant, timed in
    turns with it, stays eager."""

    def __init__(self, model):
        self.model, self.config = model, model.config
        self.eager = model.forward
        self.compiled = torch.compile(
            model.forward, fullgraph=isinstance(model, VanillaTransformerForConditionalGeneration)
        )

    def generate(self, **kwargs) -> torch.Tensor:
        self.model.forward = self.compiled
        try:
            return self.model.generate(**kwargs)
        finally:
            self.model.forward = self.eager


# ---------------------------------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------------------------------


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_in_turns(functions: dict[str, Callable], repeats: int, warmup: int, device: str) -> dict[str, list[float]]:
    """Seconds per call of each function, in turns (a, b, c, a, b, c, ...) after `warmup` calls each. The first
    call of each is timed too, as `first` (what a compiled function's warm-up costs)."""
    times: dict[str, list[float]] = {name: [] for name in functions}
    first: dict[str, float] = {}
    for index in range(warmup + repeats):
        for name, function in functions.items():
            synchronize(device)
            start = time.perf_counter()
            function()
            synchronize(device)
            elapsed = time.perf_counter() - start
            if index == 0:
                first[name] = elapsed
            if index >= warmup:
                times[name].append(elapsed)
    return {"first": first, **times}


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
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(_peak_memory_here, (size, name, options))


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


def describe_machine(options: BenchmarkConfig) -> str:
    if options.device == "cuda":
        return torch.cuda.get_device_name(0)
    name = next(
        (line.split(":", 1)[1].strip() for line in _cpuinfo().splitlines() if line.startswith("model name")),
        platform.processor() or platform.machine(),
    )
    return f"{name}, {torch.get_num_threads()} threads"


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def benchmark_training(size: str, models: dict, options: BenchmarkConfig, peak: float) -> dict[str, CaseResult]:
    config = models["ours"].config
    inputs = training_batch(config, options)
    tokens = int((inputs["labels"] != -100).sum())
    flops = training_flops(config, inputs)
    results = {}
    for case in TRAINING_CASES:
        steps = {}
        for name, model in models.items():
            model.train()
            steps[name] = make_step(name, case, model, make_optimizer(model), inputs, options)
            if options.compile and case == "train_labels":
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
        runs = {}
        for name, model in models.items():
            runs[name] = make_generate(model.eval(), inputs, beams, False, options)
            if options.compile:
                runs[f"{name}_compiled"] = make_generate(model, inputs, beams, True, options)
        runs["matrix_products"] = make_matrix_products(models["ours"], inputs, beams, options)
        outputs, first = {}, {}
        for name, run in runs.items():  # the first call of each variant: the compiled ones compile here
            start = time.perf_counter()
            outputs[name] = run()
            first[name] = time.perf_counter() - start
        for name, output in outputs.items():
            if name != "matrix_products" and not torch.equal(output, outputs["ours"]):
                raise RuntimeError(f"{size} {case}: {name} generated other tokens than ours eager.")
        times = {**time_in_turns(runs, options.repeats, 0, options.device), "first": first}
        results[case] = CaseResult.of(times, options.generation_batch * options.new_tokens)
        for name in list(results[case].variants):
            if name.endswith("_compiled"):
                add_break_even(results[case], name, options.generation_batch)
        report(size, case, results[case])
    return results


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
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    results = {
        "machine": describe_machine(options),
        "amx_bf16": "amx_bf16" in _cpuinfo(),
        "torch": torch.__version__,
        "options": asdict(options),
        "matmul_flops_per_second": matmul_peak(options),
        "sizes": {},
    }
    for size in options.sizes:
        cases = benchmark_training(size, build_models(size, options), options, results["matmul_flops_per_second"])
        # Fresh twins for generation: training steps have moved the two models' weights apart.
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


def markdown_table(results: dict) -> str:
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
                cells.append(speed if name == "marian" else f"{speed} (**{ratios[name]:.2f}x**)")
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
