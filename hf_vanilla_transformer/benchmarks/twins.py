"""The two models the speed benchmark compares, and what it runs them on: this package's Transformer and
transformers' `MarianMTModel` with the same architecture and the same weights (Marian's are copied from ours, so both
compute the same function: `tests/test_benchmark.py` proves it), the same inputs, dtype, threads, optimizer and loss.
Each `make_*` returns a function of no arguments: one training step, one generate() call, or only its matrix
products."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext

import torch
from transformers import MarianConfig, MarianMTModel
from transformers.generation import CompileConfig

from ..evaluation.translation import decoding_compile_config
from ..model.configuration_vanilla_transformer import VanillaTransformerConfig
from ..model.inputs_vanilla_transformer import without_host_reads
from ..model.loss_vanilla_transformer import label_smoothed_loss
from ..model.modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration, shift_tokens_right
from .config import DTYPES, SIZES, BenchmarkConfig


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
    its loss from `labels` except in train_logits; Marian always from its logits. On CUDA ours reads no tensor value
    on the host, as the Trainer runs it there (`without_host_reads`)."""
    from_labels = name.startswith("ours") and case != "train_logits"
    forward = model.forward
    if name.endswith("_compiled"):
        forward = torch.compile(model.forward, fullgraph=name.startswith("ours"))
    no_labels = {key: value for key, value in inputs.items() if key != "labels"}

    def step() -> torch.Tensor:
        with autocast(options), without_host_reads() if options.device == "cuda" else nullcontext():
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


def compile_config(model, options: BenchmarkConfig) -> CompileConfig:
    """generate()'s own compile path for `model`, as `translate()` compiles: ours with `fullgraph=True` (any graph
    break fails), Marian as it compiles."""
    return decoding_compile_config(
        options.device, fullgraph=isinstance(model, VanillaTransformerForConditionalGeneration)
    )


def make_generate(model, inputs: dict, num_beams: int, compiled: bool, options: BenchmarkConfig) -> Callable:
    """generate() with `num_beams`; compiled: a static cache and the decoding step compiled by generate() itself
    (transformers keeps the compiled function; the eager variant of the same model, timed in turns with it, stays
    eager: a dynamic cache never compiles)."""
    extra = {"cache_implementation": "static", "compile_config": compile_config(model, options)} if compiled else {}

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
