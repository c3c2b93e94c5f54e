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
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import DataCollatorForSeq2Seq, PreTrainedTokenizerFast, Seq2SeqTrainer, Seq2SeqTrainingArguments

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
    (validation BLEU every 15 updates, GNMT alpha chosen on validation, test BLEU), averaged, with its card and plots; its progress output goes to
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
        *("--test_beams", "2", "--logging_steps", "5", "--length_penalty_choices", "0.6,3"),
        *("--eval_strategy", "steps", "--eval_steps", "15", "--max_eval_samples", "10", "--generation_num_beams", "1"),
        *("--publish_examples", "true"),  # local files, but public ones: the folder shows its examples
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


def plan_of(**fields):
    """A run's plan (`BudgetPlan`) with the given fields, the others the least a plan holds."""
    from hf_vanilla_transformer.training.budget.plan import BudgetPlan

    defaults = dict(max_steps=100, warmup_steps=1, save_steps=100, eval_steps=None, precision="fp32")
    return BudgetPlan.of(**{**defaults, "attn_implementation": "sdpa", **fields})


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


def train_on_reversal(model, tokenizer, dataset, output_dir, **args) -> list[float]:
    """Train `model` on `reversal_task()`'s dataset through the real Seq2SeqTrainer and DataCollatorForSeq2Seq, at a
    constant learning rate of 3e-3, on the CPU, logging every update; `args` add to or override the training
    arguments (max_steps, batch size, seed, torch_compile, ...). Returns the logged losses."""
    defaults = dict(learning_rate=3e-3, lr_scheduler_type="constant", logging_steps=1, save_strategy="no")
    arguments = Seq2SeqTrainingArguments(
        output_dir=str(output_dir), report_to=[], use_cpu=True, disable_tqdm=True, **{**defaults, **args}
    )
    collator = DataCollatorForSeq2Seq(tokenizer, model=model)
    trainer = Seq2SeqTrainer(
        model=model, args=arguments, train_dataset=dataset, data_collator=collator, processing_class=tokenizer
    )
    trainer.train()
    return logged_losses(trainer.state.log_history)


def reversal_task(words: int = 40, pairs: int = 16):
    """(word tokenizer, tokenized dataset) of a toy task a tiny model learns in a few updates: `pairs` sentences of
    3-6 words `w0 w1 ...`, each to be reversed; labels end with </s>."""
    vocabulary = [f"w{i}" for i in range(words)]
    tokenizer = word_tokenizer(vocabulary)
    sources = [" ".join(vocabulary[i : i + 3 + i % 4]) for i in range(pairs)]
    targets = [" ".join(reversed(source.split())) for source in sources]

    def encode(batch):
        features = tokenizer(batch["source"], add_special_tokens=False)
        labels = tokenizer(batch["target"], add_special_tokens=False)["input_ids"]
        features["labels"] = [[*ids, tokenizer.eos_token_id] for ids in labels]
        return features

    dataset = Dataset.from_dict({"source": sources, "target": targets}).map(encode, batched=True)
    return tokenizer, dataset.remove_columns(["source", "target"])


# The GPU check (`vanilla-transformer gpu-check`) stops its test step at a time limit, before pytest's summary and its
# tracebacks: where it names a file here, each failure's traceback is added to it as it happens.
FAILURES_FILE = "HF_VANILLA_TRANSFORMER_TEST_FAILURES"


def pytest_runtest_logreport(report):
    path = os.environ.get(FAILURES_FILE)
    # Under pytest-xdist the controller receives each worker's reports and writes them: a worker writing too would
    # write each failure twice.
    if path and report.failed and "PYTEST_XDIST_WORKER" not in os.environ:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(f"=== failed test: {report.nodeid} ({report.when})\n{report.longreprtext}\n")
