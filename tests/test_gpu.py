"""The CUDA equivalences and the GPU's part of the training job, marked `gpu` and skipped without a CUDA device (CI
has none; docs/gpu.md says how they run on a GPU): every attention implementation gives the eager logits; the
dynamic, static and compiled caches give the same greedy tokens; an update without host reads synchronises less
and computes the same loss and gradients; the calibration predicts the Trainer's seconds per update within 10%;
the collapse guard stops a tiny model driven into the collapse on the GPU too. (bf16 and fp16 training that learns:
tests/test_scale_out.py.)"""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from transformers.utils import is_flash_attn_2_available

from hf_vanilla_transformer import without_host_reads
from hf_vanilla_transformer.evaluation.translation import compiled_decoding

from conftest import FIXTURES, PAD, random_ids, tiny_model


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

ATTENTIONS = ["sdpa", "flex_attention", *(["flash_attention_2"] if is_flash_attn_2_available() else [])]


def padded_batch(device: str = "cuda") -> dict[str, torch.Tensor]:
    sources, labels = random_ids(4, 9, seed=4), random_ids(4, 7, seed=5)
    sources[1, 6:] = PAD
    sources[3, 4:] = PAD
    labels[2, 5:] = -100
    batch = {"input_ids": sources, "attention_mask": (sources != PAD).long(), "labels": labels}
    return {key: value.to(device) for key, value in batch.items()}


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_every_attention_implementation_gives_the_eager_logits(attention):
    eager = tiny_model(seed=1).cuda()
    eager.set_attn_implementation("eager")
    other = tiny_model(seed=1).cuda()
    other.set_attn_implementation(attention)
    batch = padded_batch()
    dtype = torch.bfloat16 if attention == "flash_attention_2" else None  # flash attention runs in 16 bits only
    with torch.no_grad(), torch.autocast("cuda", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        expected, logits = eager(**batch).logits, other(**batch).logits
    real = batch["labels"] != -100
    tolerance = 2e-2 if dtype is not None else 1e-5
    torch.testing.assert_close(logits[real].float(), expected[real].float(), rtol=tolerance, atol=tolerance)


def test_the_dynamic_static_and_compiled_caches_give_the_same_greedy_tokens():
    model = tiny_model(seed=2).cuda()
    batch = padded_batch()
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    decoding = dict(num_beams=1, do_sample=False, max_new_tokens=12)
    dynamic = model.generate(**inputs, **decoding)
    static = model.generate(**inputs, **decoding, cache_implementation="static")
    with compiled_decoding("cuda") as compiled:
        first = model.generate(**inputs, **decoding, **compiled)
        again = model.generate(**inputs, **decoding, **compiled)  # replayed from the captured graphs
    for tokens in (static, first, again):
        assert torch.equal(tokens, dynamic)


def synchronisations(step) -> int:
    """How many times `step()` makes the host wait for the GPU (torch's sync debug mode warns at each)."""
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(warning.message) for warning in caught)


def test_an_update_without_host_reads_waits_less_and_computes_the_same_loss_and_gradients():
    batch = padded_batch()
    results = {}
    for reads in (True, False):
        model = tiny_model(seed=3).cuda().train()
        losses = []

        def step(model=model, losses=losses):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(**batch).loss
            loss.backward()
            losses.append(loss.item())

        with without_host_reads() if not reads else torch.enable_grad():
            count = synchronisations(step)
        results[reads] = (count, losses[0], [p.grad.clone() for p in model.parameters()])
    assert results[False][0] < results[True][0], results
    assert results[False][1] == pytest.approx(results[True][1], rel=1e-3)
    for with_reads, without in zip(results[True][2], results[False][2], strict=True):
        torch.testing.assert_close(without, with_reads, rtol=2e-2, atol=1e-4)


def test_the_calibration_predicts_the_trainers_seconds_per_update_within_ten_percent(tmp_path):
    """Calibrated on the run's own batch shapes (their first-update costs counted), then trained: the plan's seconds
    per update against the Trainer's own, measured apart from validation and checkpoints."""
    from hf_vanilla_transformer.training.arguments import ModelDataArguments, TransformerTrainingArguments
    from hf_vanilla_transformer.training.run import prepare_run
    from hf_vanilla_transformer.training.settings import settle

    recipe = ModelDataArguments(
        preset="small",
        data_files=str(FIXTURES / "libreoffice_help_en_de_200.tsv"),
        vocab_size=500,
        max_tokens=1024,
        precision="auto",
        attn_implementation="auto",
        source_check="off",
    )
    args = TransformerTrainingArguments(
        output_dir=str(tmp_path / "run"), max_steps=600, save_steps=10**6, warmup_steps=100, disable_tqdm=True
    )
    run = prepare_run(settle(recipe, args))
    run.trainer.train()
    planned, measured = run.plan.predicted_seconds_per_update, run.training.budget.end().measured_seconds_per_update
    assert measured == pytest.approx(planned, rel=0.10), (planned, measured, run.plan.reasons)


def test_the_collapse_guard_stops_a_tiny_model_driven_into_the_collapse_on_the_gpu(tmp_path):
    from test_collapse import train_synthetic

    result = train_synthetic(tmp_path, lr_scale=1.5, extra=("--use_cpu", "false"))
    assert result.returncode == 1, result.stderr[-3000:]
    assert "the model stopped using its source" in result.stderr.strip().splitlines()[-1]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["source_check"]["collapsed_at"] is not None and "NVIDIA" in results["hardware"]
