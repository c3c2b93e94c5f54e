"""What decoding costs on a GPU, measured: the latency of a decoding step. On a CPU decoding is bound by the work of
its matrix products, which the time of a training update predicts (`costs.decode_seconds`); on a GPU a step of a
batch of sentences takes about the same time whatever its batch (kernel launches and small matrices), so the test
decoding of 1,152 sentences with beam 4 takes tens of seconds where the update's time predicts a few: the plan
measures a step's latency there, greedy and with the test's beams, and counts the steps the decoding will take
(`costs.decoding_steps`)."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable

import torch

from ...data.batching import inference_batches
from ...utils.device import AUTOCAST, cuda_kernels, synchronizer


@torch.no_grad()
def measure_decode_step(
    model: torch.nn.Module,
    batch: dict,
    beams: int,
    precision: str,
    attention: str | None,
    device: torch.device | str | None = None,
    steps: tuple[int, int] = (8, 24),
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """Seconds of one decoding step with `beams` beams over `batch` (input_ids, attention_mask) on `device` (default:
    the model's), in `precision` with `attention`, on a copy of `model` (left as it is): `generate()` run to exactly
    `steps[0]` and `steps[1]` new tokens (after an untimed first run), the difference over the extra steps (the
    encoder and the set-up cancel). A GPU's decoding is bound by this latency, not by its matrix products."""
    device = torch.device(device) if device is not None else next(model.parameters()).device
    decoder = copy.deepcopy(model).to(device).eval()
    batch = {key: value.to(device) for key, value in batch.items()}
    if attention:
        decoder.set_attn_implementation(attention)
    synchronize = synchronizer(device)
    dtype = AUTOCAST.get(precision)

    def seconds(new: int) -> float:
        synchronize()
        began = clock()
        autocast = torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None)
        with autocast, cuda_kernels(device, precision == "tf32"):
            decoder.generate(**batch, num_beams=beams, do_sample=False, min_new_tokens=new, max_new_tokens=new)
        synchronize()
        return clock() - began

    seconds(steps[0])
    return (seconds(steps[1]) - seconds(steps[0])) / (steps[1] - steps[0])


def median_batch(tokenizer, sentences: list[str], device) -> tuple[dict, list[int]]:
    """(the middle one of the batches `translate()` makes of `sentences`, padded and on `device`; every sentence's
    length in tokens)."""
    ids = [tokenizer(sentence)["input_ids"] for sentence in sentences]
    lengths = [len(one) for one in ids]
    batches = inference_batches(lengths, 4000, 128)
    middle = batches[len(batches) // 2]
    padded = tokenizer.pad({"input_ids": [ids[i] for i in middle]}, return_tensors="pt")
    return {key: value.to(device) for key, value in padded.items()}, lengths
