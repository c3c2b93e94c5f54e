"""Side-by-side speed and memory of this package's Transformer and transformers' MarianMTModel.

Usage:
    python scripts/benchmark.py --quick                      # under 5 minutes on 2 CPU cores
    python scripts/benchmark.py --json results/benchmark.json
    python scripts/benchmark.py --device cuda --dtype bf16 --attn flash_attention_2 --preset base

Both models get the same architecture (vocabulary, d_model, layers, heads, FFN, ReLU, scaled embeddings, tied
weights, dropout), the same inputs, dtype, threads and optimizer (AdamW, beta2 0.98, fused where available), and the
same label-smoothed loss (Marian computes it from its logits, as `Trainer(label_smoothing_factor=0.1)` would).
They are measured alternately after warm-up; the figures are medians of the repeats. Cases:

* train_dense:  forward + backward + optimizer step, 16 x 32 source -> 16 x 32 target tokens;
* train_ragged: the same with 16 sentences of 8-64 tokens, padded;
* greedy, beam4: generate() on 8 sources of 32 tokens, end-of-sentence suppressed so that both produce 32 tokens;
* peak_memory:  the memory a training step adds (CPU: the profiler's memory timeline in a fresh process; GPU: peak
                allocated).

Speeds are target tokens per second; `ratios` are ours / Marian (speed: higher is better; memory: lower is better).
Model FLOP utilisation divides the matrix-multiply FLOPs of the real (unpadded) tokens per second by a large
matmul's, measured here.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from transformers import MarianConfig, MarianMTModel

from hf_vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from hf_vanilla_transformer.modeling_vanilla_transformer import label_smoothed_loss, shift_tokens_right


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


# ---------------------------------------------------------------------------------------------------------------------
# Models and inputs
# ---------------------------------------------------------------------------------------------------------------------


MARIAN_FIELDS = (
    *("vocab_size", "d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads"),
    *("decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim", "dropout"),
    *("pad_token_id", "eos_token_id", "bos_token_id", "decoder_start_token_id"),
)


def build_models(args) -> dict[str, torch.nn.Module]:
    """Ours and Marian with the same architecture, initialised from the same seed."""
    config = VanillaTransformerConfig.from_preset(args.preset, vocab_size=args.vocab_size, dropout=args.dropout)
    torch.manual_seed(0)
    ours = VanillaTransformerForConditionalGeneration(config)
    # Our config uses Marian's field names: the architecture and special tokens carry over by name.
    marian_config = MarianConfig(
        **{name: getattr(config, name) for name in MARIAN_FIELDS},
        activation_function="relu",
        scale_embedding=True,
        attention_dropout=0.0,
        activation_dropout=0.0,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
        max_position_embeddings=512,
        forced_eos_token_id=None,
    )
    torch.manual_seed(0)
    marian = MarianMTModel(marian_config)
    models = {"ours": ours, "marian": marian}
    for model in models.values():
        model.to(device=args.device, dtype=DTYPES[args.dtype] if args.dtype == "fp16" else torch.float32)
        if args.attn:
            model.set_attn_implementation(args.attn)
        model.generation_config.max_length = None
    return models


def training_batch(config: VanillaTransformerConfig, args, ragged: bool) -> dict[str, torch.Tensor]:
    """16 pairs: 32 -> 32 tokens (dense), or 8-64 tokens each side, right-padded (ragged)."""
    generator = torch.Generator().manual_seed(1)
    batch, pad = 16, config.pad_token_id
    if ragged:
        source_lengths = torch.randint(8, 65, (batch,), generator=generator)
        target_lengths = torch.randint(8, 65, (batch,), generator=generator)
    else:
        source_lengths = target_lengths = torch.full((batch,), 32)
    source = torch.full((batch, int(source_lengths.max())), pad)
    labels = torch.full((batch, int(target_lengths.max())), -100)
    for i in range(batch):
        source[i, : source_lengths[i]] = torch.randint(
            4, args.vocab_size, (int(source_lengths[i]),), generator=generator
        )
        labels[i, : target_lengths[i]] = torch.randint(
            4, args.vocab_size, (int(target_lengths[i]),), generator=generator
        )
    decoder_input_ids = shift_tokens_right(labels, pad, config.decoder_start_token_id)
    inputs = {
        "input_ids": source,
        "attention_mask": (source != pad).long(),
        "decoder_input_ids": decoder_input_ids,
        "decoder_attention_mask": (decoder_input_ids != pad).long(),
        "labels": labels,
    }
    return {key: value.to(args.device) for key, value in inputs.items()}


def mixed_precision(args) -> torch.autocast:
    """bf16 runs under autocast on float32 weights; fp32 and fp16 run as the weights are."""
    return torch.autocast(args.device, dtype=DTYPES[args.dtype], enabled=args.dtype == "bf16")


def make_step(name: str, model, optimizer, inputs: dict, config: VanillaTransformerConfig, args):
    """One training step of `model`: forward, label-smoothed loss, backward, optimizer step.

    Marian's loss is the package's label-smoothed loss of its logits, with our `config.label_smoothing`.
    """
    autocast = mixed_precision(args)

    def step():
        with autocast:
            if name == "ours":
                loss = model(**inputs).loss
            else:
                logits = model(**{k: v for k, v in inputs.items() if k != "labels"}).logits
                loss = label_smoothed_loss(logits, inputs["labels"], config.label_smoothing)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    return step


def make_optimizer(model, device: str):
    # Fused AdamW runs on CPU and CUDA in every torch this package supports (>= 2.6).
    return torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.0, fused=True)


def generation_inputs(args) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(2)
    source = torch.randint(4, args.vocab_size, (8, 32), generator=generator)
    return {"input_ids": source.to(args.device), "attention_mask": torch.ones_like(source).to(args.device)}


def make_generate(model, inputs, num_beams: int, args):
    autocast = mixed_precision(args)
    eos = model.config.eos_token_id

    def run():
        with autocast, torch.no_grad():
            return model.generate(
                **inputs,
                num_beams=num_beams,
                do_sample=False,
                max_new_tokens=args.new_tokens,
                min_new_tokens=args.new_tokens,
                suppress_tokens=[eos],
                early_stopping=False,
            )

    return run


# ---------------------------------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------------------------------


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_alternately(functions: dict, repeats: int, warmup: int, device: str) -> dict[str, list[float]]:
    """Seconds per call of each function, measured in turns (ours, marian, ours, ...) after `warmup` calls each."""
    for _ in range(warmup):
        for function in functions.values():
            function()
    synchronize(device)
    times = {name: [] for name in functions}
    for _ in range(repeats):
        for name, function in functions.items():
            synchronize(device)
            start = time.perf_counter()
            function()
            synchronize(device)
            times[name].append(time.perf_counter() - start)
    return times


def matmul_peak(args) -> float:
    """FLOP/s of a large square matmul in the benchmark dtype: the reference for model FLOP utilisation."""
    size = 2048 if args.device == "cuda" else 1024
    dtype = DTYPES[args.dtype]
    a = torch.randn(size, size, device=args.device, dtype=dtype)
    b = torch.randn(size, size, device=args.device, dtype=dtype)
    times = time_alternately({"mm": lambda: a @ b}, repeats=10, warmup=3, device=args.device)["mm"]
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


# ---------------------------------------------------------------------------------------------------------------------
# Memory
# ---------------------------------------------------------------------------------------------------------------------


def peak_memory(name: str, args) -> float:
    """Bytes a training step adds on top of the model and optimizer (ragged batch)."""
    if args.device == "cuda":
        models = build_models(args)
        config, model = models["ours"].config, models[name].train()
        optimizer = make_optimizer(model, args.device)
        step = make_step(name, model, optimizer, training_batch(config, args, ragged=True), config, args)
        step()  # creates the optimizer state
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step()
        torch.cuda.synchronize()
        return float(torch.cuda.max_memory_allocated() - base)
    # CPU: a fresh process per model, so that one's allocations cannot hide the other's.
    command = [sys.executable, __file__, "--_memory_child", name, *sys.argv[1:]]
    output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return float(output.strip().splitlines()[-1])


def memory_child(name: str, args) -> None:
    """Peak bytes of the tensors a ragged training step allocates, from the profiler's CPU memory timeline."""
    import tempfile
    import warnings

    from torch.profiler import ProfilerActivity, profile

    models = build_models(args)
    config, model = models["ours"].config, models[name].train()
    optimizer = make_optimizer(model, args.device)
    inputs = training_batch(config, args, ragged=True)
    # Optimizer state exists before the measured step: create it with one step on a tiny batch.
    make_step(name, model, optimizer, {k: v[:1, :4] for k, v in inputs.items()}, config, args)()
    del models
    step = make_step(name, model, optimizer, inputs, config, args)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        step()
    with tempfile.TemporaryDirectory() as folder, warnings.catch_warnings():
        warnings.simplefilter(
            "ignore", FutureWarning
        )  # the timeline export is deprecated for CUDA, not replaced on CPU
        timeline = Path(folder) / "timeline.json"
        prof.export_memory_timeline(str(timeline), device="cpu")
        _, sizes = json.loads(timeline.read_text())
    print(max(sum(categories) for categories in sizes))


# ---------------------------------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------------------------------


def describe_machine(args) -> str:
    if args.device == "cuda":
        return torch.cuda.get_device_name(0)
    return f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"


def summarise(case: str, times: dict, tokens: int, flops: float | None = None, peak: float | None = None) -> dict:
    """Per model: median seconds, spread and target tokens per second of `times`, and model FLOP utilisation where
    the FLOPs of a call (`flops`) and the matmul FLOP/s (`peak`) are given; printed on one line."""
    figures = {}
    for name, t in times.items():
        seconds = statistics.median(t)
        figures[name] = {"seconds": seconds, "spread": [min(t), max(t)], "tokens_per_second": tokens / seconds}
        if flops is not None:
            figures[name]["mfu"] = flops / seconds / peak
    print(f"{case}: " + ", ".join(f"{n} {r['tokens_per_second']:.0f} tok/s" for n, r in figures.items()), flush=True)
    return figures


def run(args) -> dict:
    if args.threads:
        torch.set_num_threads(args.threads)
    models = build_models(args)
    config = models["ours"].config
    results = {
        "machine": describe_machine(args),
        "device": args.device,
        "dtype": args.dtype,
        "attn": args.attn or "sdpa",
        "preset": args.preset,
        "vocab_size": args.vocab_size,
        "torch": torch.__version__,
        "repeats": args.repeats,
        "cases": {},
    }
    peak = matmul_peak(args)
    results["matmul_flops_per_second"] = peak

    for case, ragged in (("train_dense", False), ("train_ragged", True)):
        inputs = training_batch(config, args, ragged)
        steps = {}
        for name, model in models.items():
            model.train()
            steps[name] = make_step(name, model, make_optimizer(model, args.device), inputs, config, args)
        times = time_alternately(steps, args.repeats, args.warmup, args.device)
        tokens = int((inputs["labels"] != -100).sum())
        results["cases"][case] = summarise(case, times, tokens, training_flops(config, inputs), peak)

    inputs = generation_inputs(args)
    for case, beams in (("greedy", 1), ("beam4", 4)):
        runs = {name: make_generate(model.eval(), inputs, beams, args) for name, model in models.items()}
        outputs = {name: run() for name, run in runs.items()}
        generated = {name: out.shape[1] - 1 for name, out in outputs.items()}
        if len(set(generated.values())) != 1:
            raise RuntimeError(f"{case}: the models generated different lengths {generated}")
        times = time_alternately(runs, args.repeats, 1, args.device)
        tokens = inputs["input_ids"].shape[0] * args.new_tokens
        results["cases"][case] = summarise(case, times, tokens)

    memory = {name: peak_memory(name, args) for name in ("ours", "marian")}
    results["cases"]["peak_memory"] = {name: {"bytes": value} for name, value in memory.items()}
    print(f"peak_memory: ours {memory['ours'] / 2**20:.1f} MiB, marian {memory['marian'] / 2**20:.1f} MiB", flush=True)

    cases = results["cases"]
    results["ratios"] = {
        case: cases[case]["ours"]["tokens_per_second"] / cases[case]["marian"]["tokens_per_second"]
        for case in ("train_dense", "train_ragged", "greedy", "beam4")
    }
    results["ratios"]["peak_memory"] = memory["ours"] / memory["marian"] if memory["marian"] else float("nan")
    return results


def markdown_table(results: dict) -> str:
    cases = results["cases"]
    lines = [
        f"Machine: {results['machine']}; torch {results['torch']}; {results['device']} {results['dtype']}, "
        f"attention {results['attn']}; preset {results['preset']}, vocabulary {results['vocab_size']}; "
        f"medians of {results['repeats']} alternated repeats.",
        "",
        "| case | ours (tok/s) | Marian (tok/s) | ours / Marian | MFU ours | MFU Marian |",
        "|---|---|---|---|---|---|",
    ]
    for case in ("train_dense", "train_ragged", "greedy", "beam4"):
        ours, marian = cases[case]["ours"], cases[case]["marian"]
        mfu = (f"{ours['mfu']:.1%} | {marian['mfu']:.1%}") if "mfu" in ours else "– | –"
        lines.append(
            f"| {case} | {ours['tokens_per_second']:,.0f} | {marian['tokens_per_second']:,.0f} | "
            f"**{results['ratios'][case]:.2f}x** | {mfu} |"
        )
    memory = cases["peak_memory"]
    lines.append(
        f"| peak memory of a training step (MiB) | {memory['ours']['bytes'] / 2**20:,.1f} | "
        f"{memory['marian']['bytes'] / 2**20:,.1f} | **{results['ratios']['peak_memory']:.2f}x** (lower is better) | | |"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repeats (under 5 minutes on 2 CPU cores)")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    parser.add_argument("--attn", choices=["eager", "sdpa", "flash_attention_2"], help="attention backend for both")
    parser.add_argument("--preset", default="base", help="model size for both (base, small, big, tiny)")
    parser.add_argument("--vocab_size", type=int, default=8000)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--new_tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    parser.add_argument("--repeats", type=int, help="timed repeats per case (default 15, --quick 5)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--_memory_child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.repeats = args.repeats or (5 if args.quick else 15)
    if args._memory_child:
        memory_child(args._memory_child, args)
        return
    results = run(args)
    print("\n" + markdown_table(results))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
