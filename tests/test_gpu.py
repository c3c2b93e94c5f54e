"""The CUDA equivalences and the GPU's part of the training job, marked `gpu` and skipped without a CUDA device (CI
has none; docs/gpu.md says how they run on a GPU, `make gpu-check` runs them): every attention implementation the
calibration offers gives the eager logits, and flash attention is offered only where it gives SDPA's on padded
cross-attention; the dynamic, static and compiled caches give the same greedy and beam-4 tokens, the compiled
really compiled; an update without host reads synchronises less and computes the same loss and gradients, and the
real Trainer loop with the GPU recipe's workers, pinned memory and non-blocking copies waits for the GPU at no
update (and runs SDPA without cuDNN's attention); the plan predicts the Trainer's seconds per update within 10% on
the GPU recipe's own arguments; the collapse guard stops a tiny model driven into the collapse on the GPU too.
(bf16 and fp16 training that learns: tests/test_scale_out.py; the same logic on a CPU: tests/test_gpu_path.py.)"""

from __future__ import annotations

import collections
import json
import traceback
import warnings

import pytest
import torch
from transformers.utils import is_flash_attn_2_available

from hf_vanilla_transformer import without_host_reads
from hf_vanilla_transformer.evaluation.translation import compiled_decoding

from conftest import FIXTURES, PAD, random_ids, tiny_model


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

ATTENTIONS = ["sdpa", "flex_attention"]  # flash attention: its own test (it is offered only where it agrees)
# Heads of 16 dimensions: Inductor's flex attention kernel on CUDA takes no fewer ("NYI: embedding dimension of the
# query, key, and value must be at least 16", met with the tiny preset's 8 on the first real GPU run, an H200).
WIDE_HEADS = {"encoder_attention_heads": 2, "decoder_attention_heads": 2}


def padded_batch(device: str = "cuda") -> dict[str, torch.Tensor]:
    sources, labels = random_ids(4, 9, seed=4), random_ids(4, 7, seed=5)
    sources[1, 6:] = PAD
    sources[3, 4:] = PAD
    labels[2, 5:] = -100
    batch = {"input_ids": sources, "attention_mask": (sources != PAD).long(), "labels": labels}
    return {key: value.to(device) for key, value in batch.items()}


@pytest.mark.parametrize("attention", ATTENTIONS)
def test_every_attention_implementation_gives_the_eager_logits(attention):
    eager = tiny_model(seed=1, **WIDE_HEADS).cuda()
    eager.set_attn_implementation("eager")
    other = tiny_model(seed=1, **WIDE_HEADS).cuda()
    other.set_attn_implementation(attention)
    batch = padded_batch()
    dtype = torch.bfloat16 if attention == "flash_attention_2" else None  # flash attention runs in 16 bits only
    with torch.no_grad(), torch.autocast("cuda", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        expected, logits = eager(**batch).logits, other(**batch).logits
    real = batch["labels"] != -100
    tolerance = 2e-2 if dtype is not None else 1e-5
    torch.testing.assert_close(logits[real].float(), expected[real].float(), rtol=tolerance, atol=tolerance)


@pytest.mark.skipif(not is_flash_attn_2_available(), reason="flash-attn is not installed")
def test_flash_attention_is_offered_exactly_where_it_gives_sdpas_logits_on_padded_cross_attention():
    """transformers' unpadding helper has unpadded the query with the key's mask (transformers issue #35032): a padded
    source with a target of another length is then wrong. The calibration offers flash attention only where it
    agrees (`device.flash_attention_agrees`), and there it gives SDPA's logits on this test's padded batch."""
    from hf_vanilla_transformer.utils.device import attention_choices, flash_attention_agrees

    cuda = torch.device("cuda")
    agrees = flash_attention_agrees(cuda)
    assert ("flash_attention_2" in attention_choices(cuda)) == agrees
    if agrees:
        models = {name: tiny_model(seed=1).cuda().to(torch.bfloat16) for name in ("sdpa", "flash_attention_2")}
        batch = padded_batch()
        logits = {}
        with torch.no_grad():
            for name, model in models.items():
                model.set_attn_implementation(name)
                logits[name] = model(**batch).logits.float()
        real = batch["labels"] != -100
        torch.testing.assert_close(logits["flash_attention_2"][real], logits["sdpa"][real], rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("beams", [1, 4])
def test_the_dynamic_static_and_compiled_caches_give_the_same_tokens(monkeypatch, beams):
    """Greedy and beam-4 search. The compiled decoding really compiled: transformers falls back to eager, with a
    warning, where its criteria fail; the test counts the graphs dynamo made and that generate() chose the compiled
    call. The shared embedding is scaled so that the logits lie far apart: two correct kernels round differently,
    and a random model's near-ties would flip a token on a rounding difference, not on a defect."""
    from torch._dynamo.utils import counters

    model = tiny_model(seed=2).cuda()
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(10)
    batch = padded_batch()
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    decoding = dict(num_beams=beams, do_sample=False, max_new_tokens=12)
    dynamic = model.generate(**inputs, **decoding)
    static = model.generate(**inputs, **decoding, cache_implementation="static")
    chosen, steps = [], []
    criteria = type(model)._valid_auto_compile_criteria
    monkeypatch.setattr(
        type(model), "_valid_auto_compile_criteria", lambda self, *a: chosen.append(criteria(self, *a)) or chosen[-1]
    )
    compiled_call = model.get_compiled_call
    model.get_compiled_call = lambda config: lambda *a, **k: steps.append(1) or compiled_call(config)(*a, **k)
    torch._dynamo.reset()  # the static cache on a GPU compiled already (generate()'s default): its graphs would serve
    counters.clear()
    with compiled_decoding("cuda") as compiled:
        first = model.generate(**inputs, **decoding, **compiled)
        again = model.generate(**inputs, **decoding, **compiled)  # replayed from the captured graphs
    assert chosen and all(chosen), chosen
    assert counters["stats"]["unique_graphs"] > 0, dict(counters["stats"])
    assert len(steps) >= first.shape[1] + again.shape[1] - 4, (len(steps), first.shape, again.shape)
    for name, tokens in (("static", static), ("compiled", first), ("compiled again", again)):
        assert torch.equal(tokens, dynamic), (name, tokens.tolist(), dynamic.tolist())


# What torch's sync debug mode warns at each wait for the GPU. Not any warning that names a synchronization: turning
# the mode on warns once that it is a prototype, which the first H100 run counted as a wait of the Trainer's loop.
SYNC_WARNING = "called a synchronizing CUDA operation"


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
    return sum(SYNC_WARNING in str(warning.message) for warning in caught)


def test_an_update_without_host_reads_waits_less_and_computes_the_same_loss_and_gradients():
    """In fp32: the two paths may reach different attention kernels (a padding mask the host found all real is
    dropped), which in bf16 round gradients differently enough to hide a real difference."""
    batch = padded_batch()
    results = {}
    for reads in (True, False):
        model = tiny_model(seed=3).cuda().train()
        losses = []

        def step(model=model, losses=losses):
            loss = model(**batch).loss
            loss.backward()
            losses.append(loss.item())

        with without_host_reads() if not reads else torch.enable_grad():
            count = synchronisations(step)
        results[reads] = (count, losses[0], [p.grad.clone() for p in model.parameters()])
    waits = {reads: result[0] for reads, result in results.items()}
    assert waits[False] < waits[True], waits
    assert results[False][1] == pytest.approx(results[True][1], rel=1e-5)
    for with_reads, without in zip(results[True][2], results[False][2], strict=True):
        torch.testing.assert_close(without, with_reads, rtol=1e-4, atol=1e-6)


def gpu_recipe_run(tmp_path, *flags: str):
    """A run of the GPU recipe's own arguments (its workers, pinned memory, non-blocking copies, no NaN filter) on
    the 200-pair fixture, ready to train."""
    from hf_vanilla_transformer.training.recipes import parse_run
    from hf_vanilla_transformer.training.run import prepare_run

    fixture = str(FIXTURES / "libreoffice_help_en_de_200.tsv")
    flags = ("--data_files", fixture, "--vocab_size", "500", "--source_check", "off", "--disable_tqdm", "true", *flags)
    return prepare_run(parse_run(["--output_dir", str(tmp_path / "run"), *flags], default_recipe="gpu"))


def test_the_real_trainer_loop_waits_for_the_gpu_at_no_update(tmp_path):
    """From the 10th update to the 40th, with no log, checkpoint or validation in the run (each reads tensors back
    on purpose: the second GPU run counted 4,554 waits in a checkpoint's optimizer state and 627 in a validation),
    the Trainer with the GPU recipe's data loading reads nothing on the host: torch's sync debug mode reports every
    wait, and the test names where each was asked for. Its updates run SDPA without cuDNN's attention kernels."""
    from transformers import TrainerCallback

    cudnn_attention = []

    class Watch(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 10:
                cudnn_attention.append(torch.backends.cuda.cudnn_sdp_enabled())
                torch.cuda.set_sync_debug_mode("warn")
            elif state.global_step == 40:
                torch.cuda.set_sync_debug_mode("default")

    quiet = ("--save_strategy", "no", "--eval_strategy", "no", "--logging_steps", "1000")
    run = gpu_recipe_run(tmp_path, "--preset", "base", "--max_tokens", "1024", "--max_steps", "50", *quiet)
    run.trainer.add_callback(Watch())
    waits = collections.Counter()

    def record(message, category, filename, lineno, file=None, line=None):
        if SYNC_WARNING in str(message):  # where in Python the wait was asked for, not the C++ line that warns
            waits["".join(traceback.format_stack(limit=8)[:-2])] += 1

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        try:
            run.trainer.train()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert not waits, "\n".join(f"{count} waits at:\n{stack}" for stack, count in waits.most_common())
    assert cudnn_attention == [False]


@pytest.mark.slow  # 77 s on an H200: the GPU check's main job judges its own plan instead
def test_the_plan_predicts_the_trainers_seconds_per_update_within_ten_percent_on_the_gpu_recipe(tmp_path):
    """A budgeted run of base on 4,096-token batches in bf16 with SDPA and the GPU recipe's own arguments (an update
    of tens of milliseconds, not the Python overhead of a tiny model): the plan's seconds per update (the
    calibration's and the Trainer's own work, measured) against the Trainer's own, apart from validation and
    checkpoints. Two minutes (one leaves no time to train once the test decoding and the folder are paid)."""
    from hf_vanilla_transformer.training.run import train

    run = gpu_recipe_run(
        tmp_path,
        *("--preset_choices", "base", "--max_tokens_choices", "4096", "--max_minutes", "2", "--max_epochs", "1000"),
        *("--precision", "bf16", "--attn_implementation", "sdpa", "--eval_strategy", "no", "--min_updates", "1"),
    )
    end = train(run.training)
    planned, measured = run.plan.update.seconds_per_update, end.measured_seconds_per_update
    assert measured == pytest.approx(planned, rel=0.10), (planned, measured, run.plan.record.reasons)


def test_the_collapse_guard_stops_a_tiny_model_driven_into_the_collapse_on_the_gpu(tmp_path):
    from test_collapse import train_synthetic

    result = train_synthetic(tmp_path, lr_scale=1.5, extra=("--use_cpu", "false"))
    assert result.returncode == 1, result.stderr[-3000:]
    assert "the model stopped using its source" in result.stderr.strip().splitlines()[-1]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["source_check"]["collapsed_at"] is not None and "NVIDIA" in results["hardware"]
