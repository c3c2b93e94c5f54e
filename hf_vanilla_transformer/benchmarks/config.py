"""What the speed benchmark measures and how: its sizes, dtypes and cases, and `BenchmarkConfig`, whose every field
is a flag of `scripts/benchmark.py`."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..model.configuration_vanilla_transformer import PRESETS, symmetric_preset


# tf32: float32 weights and activations, CUDA's matrix products in TensorFloat-32 (as a run in `--precision tf32`).
DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

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
    compile_peers: bool = True  # with compile: MarianMTModel's compiled variants too (else ours alone)
    cases: list[str] = field(default_factory=lambda: [*TRAINING_CASES, *GENERATION_CASES])
    matrix_products: bool = True  # the generation cases' floor of matrix products alone
    memory: bool = True  # measure peak_memory

    def __post_init__(self) -> None:
        unknown = [size for size in self.sizes if size not in SIZES]
        if unknown:
            raise ValueError(f"Unknown benchmark size(s) {unknown}; expected some of {sorted(SIZES)}.")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype={self.dtype!r} is invalid; expected one of {sorted(DTYPES)}.")
        if self.dtype == "tf32" and self.device != "cuda":
            raise ValueError(f"dtype='tf32' is a CUDA precision; device={self.device!r}: use fp32 there.")
        unknown = [case for case in self.cases if case not in (*TRAINING_CASES, *GENERATION_CASES)]
        if unknown or not self.cases:
            raise ValueError(f"cases={self.cases} is invalid; expected some of {[*TRAINING_CASES, *GENERATION_CASES]}.")
        if self.repeats < 1 or self.warmup < 0:
            raise ValueError(f"repeats={self.repeats} and warmup={self.warmup}; expected repeats >= 1, warmup >= 0.")


# ---------------------------------------------------------------------------------------------------------------------
