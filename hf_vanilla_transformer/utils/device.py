"""Where and how an update runs, in one place for the calibration and the Trainer: the run's device, what each
precision means there (autocast, TF32, a loss scale), and the clock's synchronisation.

Precisions: `fp32` (TF32 off), `tf32` (float32 weights and activations, matrix products in TensorFloat-32 on CUDA
GPUs from Ampere on), `bf16` and `fp16` (autocast on float32 weights; fp16 with a loss scale). On a CPU only `fp32`
and `bf16` exist.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator

import torch
from transformers.utils import is_flash_attn_2_available

from ..model.configuration_vanilla_transformer import VanillaTransformerConfig
from ..model.inputs_vanilla_transformer import without_host_reads
from ..model.modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from .kernels import without_cudnn_attention
from .machine import cpu_has_fast_bf16


PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


def pad_multiple(device: torch.device) -> int:
    """What the training batches' lengths are padded to a multiple of: 8 on CUDA (tensor-core tiles; fewer distinct
    shapes, each of which costs its first update more), 1 on a CPU (padding is work there)."""
    return 8 if device.type == "cuda" else 1


def training_device(args) -> torch.device:
    """The device this process trains on: `args.device` (TrainingArguments: cuda:<local rank> under a launch, the CPU
    with `use_cpu`); the CPU for None."""
    return torch.device("cpu") if args is None else torch.device(args.device)


def device_precisions(device: torch.device) -> list[str]:
    """The precisions worth measuring on `device`, the preferred first (a tie goes to it): on CUDA bf16 where the GPU
    has it natively, else fp16 (with its loss scale), and tf32 from Ampere on, else fp32 (fp32 is tf32 with slower
    matrix products and nothing faster: never the faster where TF32 exists, and it cost the H100's plan 1.7 s of big's
    updates); on a CPU fp32, and bf16 where it has bf16 matrix units (AMX, AVX512-BF16). `--precision fp32` still
    trains in fp32, `--precision fp16` in fp16.

    fp16 is not measured beside a native bf16: on an H200 it timed within noise of bf16 (75.2 against 78.6 ms an
    update of big at 25,000 tokens in one plan, 74.5 against 72.9 in the next), won the first, and big trained in it
    never read its source (a gain of 0.000 nats per token at all five validations, validation BLEU 0.26 at best,
    2026-12-04), where bf16 has fp32's range and needs no loss scale."""
    if device.type == "cuda":
        major, _ = torch.cuda.get_device_capability(device)
        native_bf16 = torch.cuda.is_bf16_supported(including_emulation=False)
        return ["bf16" if native_bf16 else "fp16", "tf32" if major >= 8 else "fp32"]
    return ["fp32", "bf16"] if cpu_has_fast_bf16() else ["fp32"]


def attention_choices(device: torch.device, flex: bool = True) -> list[str]:
    """The attention implementations worth measuring on `device`: eager and SDPA; on CUDA flex attention too where
    `flex` (a compiled kernel: the run measures compiled steps), and flash attention where it is installed, the GPU
    has its kernels (Ampere on) and it gives SDPA's logits on a padded batch whose target length is not its source's
    (`flash_attention_agrees`): transformers' unpadding helper has unpadded the query with the key's mask
    (transformers issue #35032), which breaks cross-attention."""
    if device.type != "cuda":
        return ["eager", "sdpa"]
    flash = is_flash_attn_2_available() and torch.cuda.get_device_capability(device)[0] >= 8
    return [
        "eager",
        "sdpa",
        *(["flex_attention"] if flex else []),
        *(["flash_attention_2"] if flash and flash_attention_agrees(device) else []),
    ]


@functools.cache
def flash_attention_agrees(device: torch.device) -> bool:
    """Whether flash attention gives SDPA's logits (bf16, within 0.05) for a tiny model on `device`, on three padded
    sources of 9, 6 and 3 tokens and targets of 5: the cross-attention of a padded batch (checked once a process;
    an install that fails to run there does not agree)."""
    config = VanillaTransformerConfig.from_preset("tiny", dropout=0.0)
    generator = torch.Generator().manual_seed(0)
    model = VanillaTransformerForConditionalGeneration(config).to(device, torch.bfloat16).eval()
    sources = torch.randint(3, config.vocab_size, (3, 9), generator=generator)
    mask = (torch.arange(9) < torch.tensor([[9], [6], [3]])).long()
    targets = torch.randint(3, config.vocab_size, (3, 5), generator=generator)
    batch = {
        "input_ids": sources.to(device),
        "attention_mask": mask.to(device),
        "decoder_input_ids": targets.to(device),
    }
    logits = {}
    try:
        with torch.no_grad():
            for attention in ("sdpa", "flash_attention_2"):
                model.set_attn_implementation(attention)
                logits[attention] = model(**batch).logits.float()
    except (RuntimeError, ValueError, ImportError):  # installed but broken, or no kernel for this GPU
        return False
    return bool(torch.allclose(logits["sdpa"], logits["flash_attention_2"], atol=0.05, rtol=0.05))


def check_precision(precision: str, device: torch.device) -> None:
    """A ValueError naming a precision that does not exist on `device`."""
    allowed = PRECISIONS if device.type == "cuda" else ("fp32", "bf16")
    if precision not in allowed:
        raise ValueError(f"precision={precision!r} is invalid on {device.type}; expected one of {list(allowed)}.")


@contextlib.contextmanager
def forward_context(device: torch.device, precision: str) -> Iterator[None]:
    """What a training forward pass runs in, as the Trainer runs it: autocast for bf16 and fp16, and on CUDA no host
    read of a tensor value (`without_host_reads`: each would wait for the queued kernels)."""
    with contextlib.ExitStack() as stack:
        if device.type == "cuda":
            stack.enter_context(without_host_reads())
        dtype = AUTOCAST.get(precision)
        stack.enter_context(torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None))
        yield


@contextlib.contextmanager
def tf32_matmuls(enabled: bool) -> Iterator[None]:
    """CUDA matrix products and convolutions in TensorFloat-32 or not, within the block: a whole update (its backward
    pass too) runs in it; after it, TF32 as it was in effect before (`tf32_in_effect`).

    PyTorch (2.9 and later) keeps TF32 in two families of settings, the `fp32_precision` strings of each backend and
    the older flags; a mix of the two (transformers' `enable_tf32` sets the generic string, accelerate the old matmul
    flag) leaves `torch.get_float32_matmul_precision()` and `torch.backends.cudnn.allow_tf32` raising "a mix of the
    legacy and new APIs", and Inductor reads the first in its caches: a compiled step would fail. `set_tf32` puts
    every setting in one consistent state, readable by both families."""
    before = tf32_in_effect()
    set_tf32(enabled)
    try:
        yield
    finally:
        set_tf32(before)


@contextlib.contextmanager
def cuda_kernels(device: torch.device | str, tf32: bool) -> Iterator[None]:
    """The kernels an update or a decoding step runs with on `device`, within the block: on CUDA matrix products in
    TF32 or not (`tf32_matmuls`) and SDPA without cuDNN's attention (`utils/kernels.py`: a plan per batch shape);
    elsewhere as they are (TF32's setting would reach oneDNN's matrix products on a CPU)."""
    if torch.device(device).type != "cuda":
        yield
        return
    with tf32_matmuls(tf32), without_cudnn_attention(device):
        yield


def set_tf32(enabled: bool) -> None:
    """TF32 for CUDA matrix products (and oneDNN's), cuDNN convolutions and RNNs, on or off, in the one combination
    of settings that both of PyTorch's families read back without an error (tests/test_gpu_path.py proves it from
    each state transformers and accelerate leave)."""
    torch.set_float32_matmul_precision("high" if enabled else "highest")
    torch.backends.cudnn.allow_tf32 = enabled
    if hasattr(torch.backends.cudnn, "conv") and hasattr(torch.backends.cudnn.conv, "fp32_precision"):
        torch.backends.cudnn.conv.fp32_precision = "tf32" if enabled else "ieee"
        torch.backends.cudnn.rnn.fp32_precision = "tf32" if enabled else "ieee"


def tf32_in_effect() -> bool:
    """Whether CUDA matrix products run in TF32 now: read from the setting that never raises (the matmul backend's
    `fp32_precision`, else the generic one it inherits), else the older flag."""
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        matmul = torch.backends.cuda.matmul.fp32_precision
        if matmul == "none" and hasattr(torch.backends, "fp32_precision"):
            matmul = torch.backends.fp32_precision
        return matmul == "tf32"
    return bool(torch.backends.cuda.matmul.allow_tf32)


def synchronizer(device: torch.device) -> Callable[[], None]:
    """A function that returns once `device` has finished the work queued on it: CUDA runs kernels asynchronously, so
    a clock read without it measures the time to queue them. On a CPU, nothing to wait for."""
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None
