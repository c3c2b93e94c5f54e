"""Shared fixtures and helpers: tiny configs and models (seeded, dropout off unless a test turns it on), a word-level
tokenizer, the fixtures folder, the script and no-package subprocess runners, the losses a Trainer logged."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from hf_vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration


BOS, PAD, EOS = 0, 1, 2


def tiny_config(**overrides) -> VanillaTransformerConfig:
    """The `tiny` preset without dropout, so that every equivalence is exact."""
    return VanillaTransformerConfig.from_preset("tiny", **{"dropout": 0.0, **overrides})


def tiny_model(seed: int = 0, **overrides) -> VanillaTransformerForConditionalGeneration:
    torch.manual_seed(seed)
    return VanillaTransformerForConditionalGeneration(tiny_config(**overrides)).eval()


def random_ids(batch: int, length: int, vocab: int = 99, seed: int = 0) -> torch.Tensor:
    """Token ids drawn from the ordinary tokens (no pad, bos or eos)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (batch, length), generator=generator)


@pytest.fixture
def model() -> VanillaTransformerForConditionalGeneration:
    return tiny_model()


FIXTURES = Path(__file__).parent / "fixtures"
ROOT = Path(__file__).parent.parent


def run_script(name: str, *args: str, timeout: int = 600, **kwargs) -> subprocess.CompletedProcess:
    """`python scripts/<name> args...` with its output captured as text; `kwargs` go to `subprocess.run`."""
    command = [sys.executable, str(ROOT / "scripts" / name), *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, **kwargs)


@pytest.fixture(scope="session")
def trained_folder(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """A model folder written by scripts/train.py: a tiny model trained 30 updates on 200 real pairs, evaluated
    (validation BLEU every 15 updates, test BLEU), averaged, with its card and plots; its progress output goes to
    pipes, as into a log file. Shared by the tests that read such a folder (training, sharing, pipeline); they must
    not modify it."""
    output = tmp_path_factory.mktemp("trained") / "run"
    result = run_script(
        "train.py",
        *("--preset", "tiny", "--max_steps", "30", "--output_dir", output),
        *("--data_files", FIXTURES / "libreoffice_help_en_de_200.tsv"),
        *("--validation_files", FIXTURES / "libreoffice_help_en_de_test_40.tsv"),
        *("--test_files", FIXTURES / "libreoffice_help_en_de_test_40.tsv"),
        *("--vocab_size", "500", "--save_steps", "10", "--average_last", "3"),
        *("--test_beams", "2", "--logging_steps", "5"),
        *("--eval_strategy", "steps", "--eval_steps", "15", "--max_eval_samples", "10", "--generation_num_beams", "1"),
        cwd=output.parent,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return output, result


def run_without_package(script: str, tmp_path, **env) -> subprocess.CompletedProcess:
    """Run `script` in a new interpreter in which `import hf_vanilla_transformer` fails."""
    guard = "import sys\nsys.modules['hf_vanilla_transformer'] = None  # the package is not importable\n"
    environment = {
        **os.environ,
        "HF_HOME": str(tmp_path / "hf_home"),  # remote-code modules are copied here, not into ~/.cache
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": "",
        **env,
    }
    return subprocess.run(
        [sys.executable, "-c", guard + textwrap.dedent(script)],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )


def word_tokenizer(words: list[str]) -> PreTrainedTokenizerFast:
    """A real fast tokenizer over a fixed word list, ids 0-3 for <s> <pad> </s> <unk>."""
    vocab = {token: i for i, token in enumerate(["<s>", "<pad>", "</s>", "<unk>", *words])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


def logged_losses(log_history: list[dict]) -> list[float]:
    """The training losses a `Trainer` logged (its `state.log_history`), in order."""
    return [entry["loss"] for entry in log_history if "loss" in entry]
