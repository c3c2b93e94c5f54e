"""The guard against a model that stopped using its source (training/collapse.py): the measurement at each
validation, the rule that judges it, and real runs of scripts/train.py: a tiny model driven into the collapse by too
high a learning rate is stopped and named, and the same model at a sane rate trains through, silently."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest
import torch
from transformers import TrainerControl, TrainerState

from hf_vanilla_transformer.training.arguments import TransformerTrainingArguments
from hf_vanilla_transformer.training.collapse import (
    LOW_IN_A_ROW,
    NOTHING_BELOW,
    SOURCE_GAIN_AT_LEAST,
    SourceCheckCallback,
    source_dependence,
)

from conftest import ROOT, random_ids, tiny_model


def test_the_measurement_compares_the_real_sources_with_each_batchs_sources_rolled():
    model = tiny_model().eval()
    same = random_ids(1, 6).repeat(3, 1)  # three identical sources: rolling them changes nothing
    batch = {"input_ids": same, "attention_mask": torch.ones_like(same), "labels": random_ids(3, 5, seed=1)}
    found = source_dependence(model, [batch], torch.no_grad, lambda totals: totals)
    assert found["source_gain"] == 0.0 and found["loss"] == found["loss_shuffled_sources"]
    sources = random_ids(3, 6, seed=2)
    batch = {"input_ids": sources, "attention_mask": torch.ones_like(sources), "labels": random_ids(3, 5, seed=1)}
    single = {key: value[:1] for key, value in batch.items()}  # a batch of one pair cannot be shuffled: skipped
    found = source_dependence(model, [batch, single], torch.no_grad, lambda totals: totals)
    rolled = model(**{**batch, "input_ids": sources.roll(1, 0)}).loss.item()
    assert found["loss"] == pytest.approx(model(**batch).loss.item())
    assert found["loss_shuffled_sources"] == pytest.approx(rolled)
    assert found["source_gain"] == pytest.approx(rolled - model(**batch).loss.item())
    assert source_dependence(model, [single], torch.no_grad, lambda totals: totals) is None


def validate(callback, step: int, gain: float, max_steps: int = 1000, warmup: int = 100) -> TrainerControl:
    args = TransformerTrainingArguments(output_dir="unused", warmup_steps=warmup, use_cpu=True)
    state = TrainerState(global_step=step, max_steps=max_steps)
    metrics = {"eval_source_loss": 3.0, "eval_loss_shuffled_sources": 3.0 + gain, "eval_source_gain": gain}
    return callback.on_evaluate(args, state, TrainerControl(), metrics=metrics)


def test_a_collapse_is_a_source_worth_nothing_three_times_after_warmup_or_at_the_end():
    nothing, little = NOTHING_BELOW / 2, SOURCE_GAIN_AT_LEAST / 2
    check = SourceCheckCallback("stop")
    assert not validate(check, 100, 0.0).should_training_stop  # at the end of warmup: not judged
    for step in (200, 300):
        assert not validate(check, step, nothing).should_training_stop  # worth nothing yet: said, not judged
    control = validate(check, 400, nothing)
    assert control.should_training_stop and control.should_save and check.collapsed_at == 400
    # A model that reads its source a little is never stopped before its end, nor one that starts in time.
    slow = SourceCheckCallback("stop")
    for step, gain in ((200, nothing), (300, nothing), (400, little), (500, nothing), (600, 0.7), (700, little)):
        assert not validate(slow, step, gain).should_training_stop
    assert slow.collapsed_at is None
    warn = SourceCheckCallback("warn")
    for step in range(200, 200 + 100 * (LOW_IN_A_ROW + 2), 100):
        assert not validate(warn, step, 0.0).should_training_stop
    assert warn.collapsed_at is None
    # The last validation judges alone: the model the run ends with reads nothing of its source; one that reads a
    # little was trained too short, and is only told so.
    short = SourceCheckCallback("stop")
    assert not validate(short, 1000, little).should_training_stop and short.collapsed_at is None
    assert not validate(warn, 1000, nothing).should_training_stop and warn.collapsed_at == 1000
    record = warn.record()
    assert record["mode"] == "warn" and record["collapsed_at"] == 1000 and len(record["history"]) == LOW_IN_A_ROW + 3


def synthetic_pairs(folder, pairs: int = 600) -> dict[str, str]:
    """Files of an artificial language pair a tiny model learns in 200 updates: 3-7 words of 24, each translated by a
    word of its own, in the same order."""
    words = [f"w{c}{d}" for c in "abcdefgh" for d in "xyz"]
    translation = {word: "v" + word[1:][::-1] for word in words}
    files = {}
    for name, count, seed in (("train", pairs, 1), ("validation", 40, 2), ("test", 40, 3)):
        draw = random.Random(seed)
        lines = []
        for _ in range(count):
            sentence = [draw.choice(words) for _ in range(draw.randint(3, 7))]
            lines.append(" ".join(sentence) + "\t" + " ".join(translation[word] for word in sentence))
        files[name] = str(folder / f"{name}.tsv")
        (folder / f"{name}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return files


def train_synthetic(
    tmp_path, lr_scale: float, steps: int = 200, seed: int = 42, extra: tuple = ()
) -> subprocess.CompletedProcess:
    files = synthetic_pairs(tmp_path)
    command = [
        sys.executable,
        str(ROOT / "scripts" / "train.py"),
        *("--preset", "tiny", "--dropout", "0", "--max_steps", str(steps), "--warmup_steps", "50"),
        *("--lr_scale", str(lr_scale), "--output_dir", str(tmp_path / "run"), "--vocab_size", "600"),
        *("--data_files", files["train"], "--validation_files", files["validation"], "--test_files", files["test"]),
        *("--max_tokens", "512", "--save_steps", "100", "--average_last", "1", "--test_beams", "1"),
        *("--eval_strategy", "steps", "--eval_steps", "60", "--generation_num_beams", "1", "--logging_steps", "60"),
        *("--disable_tqdm", "true", "--seed", str(seed), *extra),
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path)


@pytest.mark.slow  # a training run in a subprocess (about 14 s on a 2-core machine)
def test_a_tiny_model_driven_into_the_collapse_is_stopped_and_named(tmp_path):
    """At lr_scale 1.5 (a peak of 0.053 for d_model 32; 0.2 trains it) the tiny model learns the target side alone:
    its source is worth nothing at its three validations after warmup, and the run stops there (update 180 of 300),
    writes its folder, says so in its card and results, and fails with one line naming the cause and a remedy."""
    result = train_synthetic(tmp_path, lr_scale=1.5, steps=300)
    assert result.returncode == 1, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("train.py: the model stopped using its source at update 180: validation loss ")
    assert "Lower the peak learning rate" in last and "warm up longer" in last
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    check = results["source_check"]
    assert check["collapsed_at"] == 180 and results["training"]["steps"] == 180
    assert results["plan"]["ended_by"] == "source collapse"
    assert [entry["step"] for entry in check["history"]] == [60, 120, 180]
    assert all(abs(entry["source_gain"]) < NOTHING_BELOW for entry in check["history"])
    assert "**Warning: this model does not use its source.**" in (tmp_path / "run" / "README.md").read_text()


@pytest.mark.slow
def test_the_same_tiny_model_at_a_sane_rate_trains_through_silently(tmp_path):
    """At lr_scale 0.2 the same model reads its source only after a while (a few hundredths of a nat at its first
    validations after warmup, on this machine): it is told so, not stopped, and ends reading it."""
    result = train_synthetic(tmp_path, lr_scale=0.2, steps=300)
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    check = results["source_check"]
    assert check["collapsed_at"] is None and results["training"]["steps"] == 300
    assert check["history"][-1]["source_gain"] > 1.0
    assert results["test"]["bleu"] > 20
    assert "Warning" not in (tmp_path / "run" / "README.md").read_text()
