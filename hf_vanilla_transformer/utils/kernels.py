"""Which attention kernels PyTorch's SDPA may pick on CUDA while this package trains, validates and translates.

PyTorch 2.11 puts cuDNN's attention first on Hopper (an H200 picks it for the model's masked, causal and plain
attention alike), and cuDNN builds an execution plan for every new shape of its inputs: on an H200 an update of base
in bf16 (about 4,000 target tokens) took 0.38-0.48 s at its first batch shape against 0.047-0.055 s again, where
without cuDNN (FlashAttention, memory-efficient attention) the first took 0.082 s and the next 0.066
(issue 39's second GPU session, 12 shapes each, medians; docs/gpu.md). Training meets hundreds of batch shapes
(664 on the help corpus), and eager decoding a new key length at every step, so cuDNN's plans cost more than its
kernels save; the package runs SDPA without them (`without_cudnn_attention`).

The setting is the process's, saved and restored around each block: two threads translating at once could leave it
either way. A compiled graph keeps the kernel it was traced with (dynamo does not guard on this setting): a decoding
step compiled inside the block serves a later `generate()` outside it, and the other way round; a compiled step meets
one shape, so it pays one plan either way.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def without_cudnn_attention(device: torch.device | str | None) -> Iterator[None]:
    """Within the block SDPA on CUDA takes no cuDNN attention kernel (FlashAttention, memory-efficient attention or
    math instead); after it, cuDNN's attention is allowed as it was. On another device, nothing changes."""
    if device is None or torch.device(device).type != "cuda":
        yield
        return
    before = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(False)
    try:
        yield
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)
