"""Where and how an update runs, in one place for the calibration and the Trainer: the run's device, what each
precision means there (autocast, TF32, a loss scale), and the clock's synchronisation.

Precisions: `fp32` (TF32 off), `tf32` (float32 weights and activations, matrix products in TensorFloat-32 on CUDA
GPUs from Ampere on), `bf16` and `fp16` (autocast on float32 weights; fp16 with a loss scale). On a CPU only `fp32`
and `bf16` exist.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

from ..model.inputs_vanilla_transformer import without_host_reads
from ..utils.machine import cpu_has_fast_bf16


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
    """The precisions worth measuring on `device`, the preferred first (a tie goes to it): on CUDA bf16 (where the GPU
    has it), fp16, tf32 (Ampere and later) and fp32; on a CPU fp32, and bf16 where it has bf16 matrix units (AMX,
    AVX512-BF16)."""
    if device.type == "cuda":
        major, _ = torch.cuda.get_device_capability(device)
        bf16 = ["bf16"] if torch.cuda.is_bf16_supported() else []
        return [*bf16, "fp16", *(["tf32"] if major >= 8 else []), "fp32"]
    return ["fp32", "bf16"] if cpu_has_fast_bf16() else ["fp32"]


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
    """CUDA matrix products and convolutions in TensorFloat-32 or not, within the block (restored after): a whole
    update (its backward pass too) runs in it. Through torch's `fp32_precision` settings where it has them (2.9 and
    later, where transformers' `enable_tf32` sets them too: torch refuses a mix of those and the older flags)."""
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        settings = (torch.backends.cuda.matmul, torch.backends.cudnn.conv)
        saved = [setting.fp32_precision for setting in settings]
        for setting in settings:
            setting.fp32_precision = "tf32" if enabled else "ieee"
        try:
            yield
        finally:
            for setting, value in zip(settings, saved, strict=True):
                setting.fp32_precision = value
        return
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def synchronizer(device: torch.device) -> Callable[[], None]:
    """A function that returns once `device` has finished the work queued on it: CUDA runs kernels asynchronously, so
    a clock read without it measures the time to queue them. On a CPU, nothing to wait for."""
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None
