"""The logic of the GPU path that runs on a CPU, proven here (issue 39): TF32 set in one consistent state whatever
transformers and accelerate set before (and a compiled step under it), the attention implementations and the
precisions offered on CUDA, the learning rate of the size and batch the GPU recipe trains."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from hf_vanilla_transformer.training import settings as settings_module
from hf_vanilla_transformer.training.arguments import ModelDataArguments, TransformerTrainingArguments
from hf_vanilla_transformer.training.budget import device as device_module
from hf_vanilla_transformer.training.budget.schedule import learning_rate
from hf_vanilla_transformer.training.recipes import parse_run


# Run in a child: TF32 is a process setting, and the compile leaves graphs behind.
TF32_CHILD = textwrap.dedent(
    """
    import torch
    from transformers.utils.import_utils import enable_tf32
    from hf_vanilla_transformer.training.budget.device import tf32_in_effect, tf32_matmuls

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


def test_bf16_is_offered_where_the_gpu_has_it_natively_not_emulated(monkeypatch):
    asked = []

    def bf16_supported(including_emulation=True):
        asked.append(including_emulation)
        return including_emulation  # a GPU that emulates bf16 (before Ampere)

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", bf16_supported)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    assert device_module.device_precisions(torch.device("cuda")) == ["fp16", "fp32"] and asked == [False]


def test_the_gpu_recipe_names_its_peak_for_the_papers_batch_and_a_smaller_batch_gets_its_share(tmp_path):
    """The plan picks big at 4,096 tokens on the help corpus (the epoch cap binds): the peak of 25,000-token updates
    scaled by the square root of 4,096/25,000, on the ramp cut to 35% of an 11,000-update run (issue 39)."""
    settings = parse_run(["--output_dir", str(tmp_path)], default_recipe="gpu")
    assert settings.rate.reference_tokens == 25000 and settings.rate.owner_d_model == 1024
    assert learning_rate(settings.rate, 1024, 4000, 25000).peak == pytest.approx(4.941e-4, rel=1e-3)  # the paper's
    assert learning_rate(settings.rate, 1024, 3850, 4096).peak == pytest.approx(1.925e-4, rel=1e-3)
    assert learning_rate(settings.rate, 512, 3850, 4096).peak == pytest.approx(2.722e-4, rel=1e-3)  # base, its width
