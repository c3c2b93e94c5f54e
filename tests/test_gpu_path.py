"""The logic of the GPU path that runs on a CPU, proven here (issue 39): TF32 set in one consistent state whatever
transformers and accelerate set before (and a compiled step under it), the attention implementations and the
precisions offered on CUDA, the learning rate of the size and batch the GPU recipe trains, an update that reads no
tensor on the host (a CUDA-free stand-in for the GPU's waits) and batches copied to the device without waiting."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import subprocess
import sys
import textwrap

import pytest
import torch
from torch.overrides import TorchFunctionMode

from hf_vanilla_transformer import without_host_reads
from hf_vanilla_transformer.training import settings as settings_module
from hf_vanilla_transformer.training.arguments import ModelDataArguments, TransformerTrainingArguments
from hf_vanilla_transformer.training.budget import BudgetPlan, apply_plan
from hf_vanilla_transformer.training.budget.costs import (
    BudgetRules,
    DecodeSteps,
    HeldOut,
    decoding_steps,
    validation_decoding_steps,
)
from hf_vanilla_transformer.training.budget.decode_speed import measure_decode_step
from hf_vanilla_transformer.training.budget.schedule import EventRule, learning_rate
from hf_vanilla_transformer.training.recipes import parse_run
from hf_vanilla_transformer.utils import device as device_module

from conftest import PAD, random_ids, tiny_model


# Run in a child: TF32 is a process setting, and the compile leaves graphs behind.
TF32_CHILD = textwrap.dedent(
    """
    import torch
    from transformers.utils.import_utils import enable_tf32
    from hf_vanilla_transformer.utils.device import tf32_in_effect, tf32_matmuls

    def reads():
        return (
            torch.get_float32_matmul_precision(),
            torch.backends.cudnn.allow_tf32,
            torch.backends.cuda.matmul.allow_tf32,
        )

    starts = {
        "default": lambda: None,
        "transformers on": lambda: enable_tf32(True),  # TrainingArguments(tf32=True), or bf16 with torch_compile
        "transformers off": lambda: enable_tf32(False),
        "accelerate": lambda: setattr(torch.backends.cuda.matmul, "allow_tf32", True),  # its compiled fp32 runs
    }
    for name, start in starts.items():
        start()
        before = tf32_in_effect()
        for enabled in (True, False):
            with tf32_matmuls(enabled):
                expected = ("high", True, True) if enabled else ("highest", False, False)
                assert reads() == expected, (name, enabled, reads())
            assert tf32_in_effect() == before, (name, enabled)
            reads()  # readable after the block too
    enable_tf32(True)  # the worst start: what the Trainer's arguments leave
    step = torch.compile(lambda a, b: torch.nn.functional.relu(a @ b).sum())
    with tf32_matmuls(True):
        assert step(torch.ones(8, 8), torch.ones(8, 8)).item() == 512.0  # Inductor reads the matmul precision
    print("ok")
    """
)


def with_held_out(rules: BudgetRules, **held_out) -> BudgetRules:
    return dataclasses.replace(rules, held_out=dataclasses.replace(rules.held_out, **held_out))


@pytest.mark.slow  # a compiled training step (about 11 s on a 2-core machine)
def test_tf32_is_set_in_one_state_both_apis_read_from_whatever_came_before_and_a_compiled_step_runs_in_it():
    result = subprocess.run([sys.executable, "-c", TF32_CHILD], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]


def test_flash_attention_is_offered_only_where_it_gives_sdpas_logits_on_padded_cross_attention(monkeypatch):
    cuda = torch.device("cuda")
    monkeypatch.setattr(device_module, "is_flash_attn_2_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(device_module, "flash_attention_agrees", lambda device: False)  # the unpadding bug
    assert device_module.attention_choices(cuda) == ["eager", "sdpa", "flex_attention"]
    monkeypatch.setattr(device_module, "flash_attention_agrees", lambda device: True)
    assert device_module.attention_choices(cuda)[-1] == "flash_attention_2"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))  # no kernels before Ampere
    assert "flash_attention_2" not in device_module.attention_choices(cuda)
    assert device_module.attention_choices(torch.device("cpu")) == ["eager", "sdpa"]
    args = TransformerTrainingArguments(output_dir="unused", use_cpu=True)
    recipe = ModelDataArguments(precision="fp32", attn_implementation="auto")
    assert settings_module.update_choices(recipe, args, cuda).attentions == ("eager", "sdpa", "flex_attention")


def test_flex_attention_is_measured_only_in_runs_that_measure_a_compiled_step(monkeypatch):
    """Flex attention compiles its kernel at its first batch: on the first real GPU run (an H200, 2026-11-27) that
    took 23 s of a 4.5-minute budget's plan, for an update 2.4 times slower than SDPA's. It is a candidate where the
    compiled step is one (a run of an hour or more), as it was for the compiled step itself."""
    cuda = torch.device("cuda")
    monkeypatch.setattr(device_module, "is_flash_attn_2_available", lambda: False)
    args = TransformerTrainingArguments(output_dir="unused", use_cpu=True)
    for minutes, flex in ((26, False), (settings_module.COMPILE_AFTER_MINUTES, True)):
        recipe = ModelDataArguments(precision="fp32", attn_implementation="auto", max_minutes=minutes)
        choices = settings_module.update_choices(recipe, args, cuda)
        assert (True in choices.compiles) == flex and ("flex_attention" in choices.attentions) == flex, minutes
    recipe = ModelDataArguments(precision="fp32", attn_implementation="flex_attention", max_minutes=26)
    assert settings_module.update_choices(recipe, args, cuda).attentions == ("flex_attention",)  # asked for: kept
    assert device_module.attention_choices(cuda, flex=False) == ["eager", "sdpa"]


def test_bf16_is_offered_where_the_gpu_has_it_natively_not_emulated(monkeypatch):
    asked = []

    def bf16_supported(including_emulation=True):
        asked.append(including_emulation)
        return including_emulation  # a GPU that emulates bf16 (before Ampere)

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", bf16_supported)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    assert device_module.device_precisions(torch.device("cuda")) == ["fp16", "fp32"] and asked == [False]
    # From Ampere on: bf16 where native, not fp16 beside it (an H200 chose fp16 for a few percent and big trained in
    # it never read its source), and tf32, not fp32 (the same with slower matrix products).
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert device_module.device_precisions(torch.device("cuda")) == ["bf16", "tf32"]


def test_the_gpu_recipe_follows_the_papers_schedule_at_every_batch_size_and_a_short_run_keeps_its_peak(tmp_path):
    """The paper's peak for each size (lr_scale 1, warmup 4,000) whatever the batch; a run too short for that warmup
    warms up for 35% of it to the same peak (the H100's check: on the ramp's lower peak, 2.7e-4 for small, its model
    had learned nothing of its source by update 948). The CPU recipe keeps its measured ramp."""
    settings = parse_run(["--output_dir", str(tmp_path)], default_recipe="gpu")
    assert settings.rate.reference_tokens is None and settings.rate.lr_scale == 1.0 and settings.rate.cut_keeps_peak
    assert learning_rate(settings.rate, 1024, 4000, 25000).peak == pytest.approx(4.941e-4, rel=1e-3)  # the paper's
    assert learning_rate(settings.rate, 1024, 4000, 4096).peak == pytest.approx(4.941e-4, rel=1e-3)
    assert learning_rate(settings.rate, 512, 4000, 4096).peak == pytest.approx(6.988e-4, rel=1e-3)  # base, its width
    assert learning_rate(settings.rate, 512, 1300, 4096).peak == pytest.approx(6.988e-4, rel=1e-3)  # a short run's
    assert learning_rate(settings.rate, 256, 1085, 25000).peak == pytest.approx(9.882e-4, rel=1e-3)  # the check's
    ramp = dataclasses.replace(settings.rate, cut_keeps_peak=False)
    assert learning_rate(ramp, 256, 1085, 25000).peak == pytest.approx(2.68e-4, rel=1e-2)  # what the H100 trained
    cpu = parse_run(["--output_dir", str(tmp_path)], default_recipe="cpu")
    assert not cpu.rate.cut_keeps_peak


class HostReads(TorchFunctionMode):
    """A CUDA-free stand-in for the GPU's synchronisations: every read of a tensor's value on the host (what waits
    for a GPU's queued kernels) recorded by name."""

    READS = ("__bool__", "item", "tolist", "__int__", "__float__", "__index__", "numpy")

    def __init__(self):
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in self.READS:
            self.calls.append(func.__name__)
        return func(*args, **(kwargs or {}))


def test_an_update_without_host_reads_reads_no_tensor_on_the_host_and_computes_the_same_loss():
    """The mask builders once let transformers ask whether every token is real (`padding_mask.all()`): two waits
    per forward on a GPU. Counted here on a CPU by the same rule: no read of a tensor value in the update."""
    results = {}
    for reads in (True, False):
        model = tiny_model(seed=3).train()
        model.set_attn_implementation("sdpa")
        sources, labels = random_ids(4, 9, seed=4), random_ids(4, 7, seed=5)
        sources[1, 6:] = PAD
        batch = {"input_ids": sources, "attention_mask": (sources != PAD).long(), "labels": labels}
        with contextlib.nullcontext() if reads else without_host_reads(), HostReads() as counted:
            loss = model(**batch).loss
            loss.backward()
        results[reads] = (counted.calls, loss.item())
    assert results[False][0] == [] and results[True][0], results  # the eager checks read; the update reads nothing
    assert results[False][1] == pytest.approx(results[True][1], rel=1e-6)


def test_the_gpu_recipe_copies_batches_to_the_device_without_waiting_for_it(tmp_path):
    """accelerate copied each batch with non_blocking=False (a wait per update) although the recipe pins memory."""
    from hf_vanilla_transformer.training.trainer import TransformerTrainer

    from conftest import reversal_task

    settings = parse_run(["--output_dir", str(tmp_path)], default_recipe="gpu")
    assert settings.args.dataloader_pin_memory and settings.args.accelerator_config.non_blocking
    tokenizer, dataset = reversal_task()
    model = tiny_model(vocab_size=len(tokenizer))
    args = apply_plan(BudgetPlan.of(max_steps=1, peak_learning_rate=1e-3), settings.args)
    args.dataloader_num_workers, args.dataloader_persistent_workers, args.eval_strategy = 0, False, "no"
    trainer = TransformerTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
    assert trainer.accelerator.non_blocking and trainer.get_train_dataloader()._non_blocking


def test_a_gpus_test_decoding_is_predicted_from_its_steps_latency_not_the_updates_throughput():
    """On a GPU the 1,152 test sentences with beam 4 take tens of seconds where the update's time predicts a few: the
    plan counts the steps the decoding takes and a step's measured latency, and takes the longer prediction."""
    assert decoding_steps([10, 10, 20]) == 23  # one batch: its longest source and a tenth, plus the end token
    assert decoding_steps([10, 10, 20], max_sentences=1) == 23 + 12 + 12
    rules = BudgetRules(EventRule(), validates=True, held_out=HeldOut(200, test_sentences=1152, test_beams=4))
    throughput = rules.test_decode_seconds(0.03, 4096)
    assert throughput == pytest.approx(1152 * 47 * 0.03 / 4096 * 3.0)  # the CPU's model: about 1.2 s
    on_gpu = dataclasses.replace(
        rules, steps=DecodeSteps(test_steps=2000, step_seconds=0.012, greedy_step_seconds=0.010)
    )
    assert on_gpu.test_decode_seconds(0.03, 4096) == pytest.approx(24.0)  # 2,000 steps of 12 ms
    # A validation's greedy decoding predicts the test's beam-4 decoding by the measured ratio of their steps.
    assert on_gpu.beam_cost == pytest.approx(1.2) and rules.beam_cost == pytest.approx(3.0)


def test_a_gpus_validation_is_predicted_from_its_steps_latency_in_the_trainers_own_batches():
    """The first real GPU run (an H200, 2026-11-27) validated 500 pairs in 30 s where the update's time put the
    validation at 0.2 s: a validation's greedy decoding is predicted from a step's latency too, over the steps of
    the batches the Trainer's validation really makes (`evaluation_batches`, shared with `get_eval_dataloader`)."""
    from hf_vanilla_transformer.data.batching import evaluation_batches

    lengths = [5, 30, 6, 29, 7, 28, 8, 27]
    batches = list(evaluation_batches(lengths, 2))  # 2 sentences of the mean length (17): 34 padded tokens a batch
    assert sorted(i for batch in batches for i in batch) == list(range(8))
    steps = sum(math.ceil(1.1 * max(lengths[i] for i in batch)) + 1 for batch in batches)
    assert validation_decoding_steps(lengths, 2) == steps and validation_decoding_steps([], 2) == 0
    assert steps < decoding_steps(lengths, max_sentences=1)  # batched together, short with short
    # Under two processes each decodes every other batch (accelerate's shards): the busier one's steps.
    shares = [sum(math.ceil(1.1 * max(lengths[i] for i in batch)) + 1 for batch in batches[r::2]) for r in (0, 1)]
    assert validation_decoding_steps(lengths, 2, world_size=2) == max(shares) < steps

    rules = BudgetRules(
        EventRule(evaluations_per_run=4), validates=True, held_out=HeldOut(500, test_sentences=1152, test_beams=4)
    )
    throughput = rules.validation_seconds(0.02, 4096)
    on_gpu = dataclasses.replace(
        rules, steps=DecodeSteps(validation_steps=800, step_seconds=0.012, greedy_step_seconds=0.010)
    )
    loss_passes = 1 * 500 / 640 * 0.02
    assert on_gpu.validation_seconds(0.02, 4096) == pytest.approx(800 * 0.010 + loss_passes)  # 8 s, not 0.2
    assert throughput == pytest.approx(500 * 47 * 0.02 / 4096 + loss_passes)
    beams = with_held_out(on_gpu, validation_beams=4)  # a validation with the test's beams: their step
    assert beams.validation_seconds(0.02, 4096) == pytest.approx(800 * 0.012 + loss_passes)
    silent = dataclasses.replace(on_gpu, validates=False)
    assert silent.validation_seconds(0.02, 4096) == 0.0
    # Beams the steps were not measured with: between greedy's and the test's step, in proportion to the beams.
    assert with_held_out(on_gpu, validation_beams=2).validation_step_seconds == pytest.approx(0.010 + 0.002 / 3)
    greedy_test = with_held_out(on_gpu, test_beams=1, validation_beams=4)
    greedy_test = dataclasses.replace(greedy_test, steps=dataclasses.replace(greedy_test.steps, step_seconds=0.010))
    assert greedy_test.validation_step_seconds == 0.010


def test_the_planner_counts_a_gpus_validation_steps_in_the_trainers_batches_over_its_processes(tmp_path):
    """`measuring.decoding_on_gpu` on a stand-in of the prepared data: the validation split's lengths, the Trainer's
    evaluation batch size and the processes, kept in the rules through a choice's and a plan's copies of them."""
    import types

    from hf_vanilla_transformer.training.budget.measuring import decoding_on_gpu

    from conftest import reversal_task

    tokenizer, dataset = reversal_task()
    lengths = [len(ids) for ids in dataset["input_ids"]]
    data = types.SimpleNamespace(
        tokenizer=tokenizer,
        test={"source": ["w1 w2 w3", "w4 w5", "w6"]},
        evaluation={"input_ids": list(dataset["input_ids"])},
    )
    rules = BudgetRules(EventRule(evaluations_per_run=4), validates=True, held_out=HeldOut(len(lengths)))
    rules = decoding_on_gpu(rules, data, 3, torch.device("cpu"), eval_batch=4, world_size=2)
    assert rules.steps.batch["input_ids"].shape[0] >= 1
    assert rules.steps.validation_steps == validation_decoding_steps(lengths, 4, 2) > 0
    test_lengths = [len(tokenizer(text)["input_ids"]) for text in data.test["source"]]
    assert rules.steps.test_steps == decoding_steps(test_lengths) + 3 * decoding_steps(lengths)
    measured = dataclasses.replace(rules.steps, step_seconds=0.012, greedy_step_seconds=0.010)
    chosen = dataclasses.replace(rules, steps=measured)  # as choose() does
    assert chosen.steps.validation_steps == rules.steps.validation_steps


def test_the_trainers_validation_runs_in_the_batches_the_plan_counts(tmp_path):
    from hf_vanilla_transformer.data.batching import evaluation_batches
    from hf_vanilla_transformer.training.trainer import TransformerTrainer

    from conftest import reversal_task

    tokenizer, dataset = reversal_task()
    model = tiny_model(vocab_size=len(tokenizer))
    settings = parse_run(["--output_dir", str(tmp_path)], default_recipe="gpu")
    args = apply_plan(BudgetPlan.of(max_steps=1, peak_learning_rate=1e-3), settings.args)
    args.dataloader_num_workers, args.dataloader_persistent_workers, args.per_device_eval_batch_size = 0, False, 4
    trainer = TransformerTrainer(
        model=model, args=args, train_dataset=dataset, eval_dataset=dataset, processing_class=tokenizer
    )
    lengths = [len(ids) for ids in dataset["input_ids"]]
    expected = list(evaluation_batches(lengths, 4))
    assert len(expected) > 2 and list(trainer.get_eval_dataloader(dataset).batch_sampler) == expected


def test_a_decoding_steps_latency_is_the_extra_steps_time_over_their_number():
    """Measured on a clock that counts the model's forward calls: one per decoding step, whatever the beams."""
    model = tiny_model(seed=1)
    model.set_attn_implementation("eager")
    calls = [0]
    model.register_forward_pre_hook(lambda module, args: calls.__setitem__(0, calls[0] + 1))
    batch = {"input_ids": random_ids(3, 6), "attention_mask": torch.ones(3, 6, dtype=torch.long)}
    for beams in (1, 4):
        step = measure_decode_step(model, batch, beams, "fp32", "sdpa", clock=lambda: float(calls[0]))
        assert step == pytest.approx(1.0), beams
    assert model.training is False and model.config._attn_implementation == "eager"  # the copy was switched


def test_an_install_of_flash_attention_that_cannot_run_here_does_not_agree():
    """flash-attn installed but broken, or without kernels for this device, is left out rather than stopping every
    run at its start: here (no flash-attn, a CPU) the check runs and says no."""
    assert device_module.flash_attention_agrees.__wrapped__(torch.device("cpu")) is False


def test_training_validation_and_translation_run_sdpa_without_cudnns_attention_on_cuda(monkeypatch, tmp_path):
    """cuDNN's attention builds a plan per input shape (0.38-0.48 s an update of base at its first batch shape on an
    H200, 0.016 s more without it): the update, the decoding step's measurement, the Trainer's validation and
    `translate()` run SDPA without it on CUDA, and leave the setting as they found it; a CPU's is left alone."""
    from hf_vanilla_transformer.evaluation import translation
    from hf_vanilla_transformer.utils.kernels import without_cudnn_attention

    for before in (True, False):
        torch.backends.cuda.enable_cudnn_sdp(before)
        with without_cudnn_attention("cuda"):
            assert not torch.backends.cuda.cudnn_sdp_enabled()
        with device_module.cuda_kernels("cuda", tf32=False):
            assert not torch.backends.cuda.cudnn_sdp_enabled() and not device_module.tf32_in_effect()
        with pytest.raises(RuntimeError), without_cudnn_attention(torch.device("cuda", 0)):
            raise RuntimeError("an update that fails")
        assert torch.backends.cuda.cudnn_sdp_enabled() == before
        with without_cudnn_attention("cpu"):
            assert torch.backends.cuda.cudnn_sdp_enabled() == before
    torch.backends.cuda.enable_cudnn_sdp(True)
    devices, seen = [], []

    def as_if_on_cuda(device):  # the device the call names, with the block CUDA's would be
        devices.append(torch.device(device).type)
        return without_cudnn_attention("cuda")

    def stand_in(*args):  # what _translate returns: {None: translations}, or {alpha: translations} for alphas
        seen.append(torch.backends.cuda.cudnn_sdp_enabled())
        return {key: [""] for key in (args[-1] or [None])}

    monkeypatch.setattr(translation, "_translate", stand_in)
    monkeypatch.setattr(translation, "without_cudnn_attention", as_if_on_cuda)
    translation.translate(tiny_model(), None, ["a sentence"], progress=False)
    assert devices == ["cpu"] and seen == [False] and torch.backends.cuda.cudnn_sdp_enabled()
    # the choice of alpha's one search too
    assert translation.translate_each_alpha(tiny_model(), None, ["a sentence"], [0.6, 1.5], progress=False) == {
        0.6: [""],
        1.5: [""],
    }
    assert devices == ["cpu", "cpu"] and seen == [False, False] and torch.backends.cuda.cudnn_sdp_enabled()
    # The Trainer's validation, outside its training loop too (its decoding meets a new key length at every step).
    from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments

    from hf_vanilla_transformer.training import trainer as trainer_module

    devices.clear(), seen.clear()
    monkeypatch.setattr(trainer_module, "without_cudnn_attention", as_if_on_cuda)
    monkeypatch.setattr(
        Seq2SeqTrainer, "evaluate", lambda self, *a, **k: seen.append(torch.backends.cuda.cudnn_sdp_enabled())
    )
    model = tiny_model()
    arguments = Seq2SeqTrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True)
    trainer_module.TransformerTrainer(model=model, args=arguments).evaluate()
    assert devices == ["cpu"] and seen == [False] and torch.backends.cuda.cudnn_sdp_enabled()


def test_the_replans_count_with_the_decoding_step_the_plan_measured():
    """The chosen size's decoding step, measured on a GPU, is recorded in the plan and in what its re-plans count
    with: the test decoding predicted after a validation scales by the measured beam cost, not by the CPU's."""
    import types

    from hf_vanilla_transformer.training.budget.fitting import PlanInputs, replan_rules
    from hf_vanilla_transformer.training.budget.plan import BudgetPlan

    settings = types.SimpleNamespace(
        updates={1024: types.SimpleNamespace(accumulation=1, world_size=1)}, device=torch.device("cuda")
    )

    class Sampler:  # an epoch of 100 batches, of shapes all met before
        def __len__(self):
            return 100

        def shapes_met(self, batches, multiple=1):
            return 0.0

    data = types.SimpleNamespace(batches=types.SimpleNamespace(of=lambda size: Sampler()))
    rules = BudgetRules(EventRule(evaluations_per_run=4), validates=True, held_out=HeldOut(500, 1152, test_beams=4))
    plan = BudgetPlan.of(max_steps=1000, save_steps=100, max_tokens=1024, peak_learning_rate=1e-3)
    measured = plan.but(decode_step_seconds=0.012, greedy_step_seconds=0.010)
    assert BudgetPlan.from_dict(measured.to_dict()) == measured  # recorded in budget.json and the checkpoints
    replanned = replan_rules(PlanInputs(settings, data, None, rules), measured)
    assert (replanned.steps.step_seconds, replanned.steps.greedy_step_seconds) == (0.012, 0.010)
    assert (
        replanned.beam_cost == pytest.approx(1.2)
        and replan_rules(PlanInputs(settings, data, None, rules), plan).beam_cost == 3.0
    )
    assert replanned.room.first_check == 50 and replanned.room.max_updates == 10_000
