"""The benchmark script runs both models side by side and reports the ratios the README quotes (no timing asserts)."""

from __future__ import annotations

import json

import pytest

from conftest import run_script


@pytest.mark.slow
def test_benchmark_reports_every_case_and_ratio(tmp_path):
    output = tmp_path / "benchmark.json"
    result = run_script(
        "benchmark.py",
        *("--preset", "tiny", "--vocab_size", "99", "--repeats", "1", "--warmup", "1", "--new_tokens", "4"),
        *("--json", output),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    figures = json.loads(output.read_text())
    assert set(figures["ratios"]) == {"train_dense", "train_ragged", "greedy", "beam4", "peak_memory"}
    assert all(value > 0 for value in figures["ratios"].values())
    for case in ("train_dense", "train_ragged"):
        assert 0 < figures["cases"][case]["ours"]["mfu"] < 1
    assert "| train_dense |" in result.stdout
