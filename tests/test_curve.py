"""The recipe as a curve of minutes (`vanilla-transformer curve`, issue 63): the kernels capped at AVX2 as on a laptop
(the package then sees no bf16 units, and the probe shows every library took the cap), the curve's options, its table
read from each point's results.json, and a real curve of two budgeted runs that resumes where it stopped."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hf_vanilla_transformer.benchmarks import curve as curve_module
from hf_vanilla_transformer.benchmarks.curve import (
    KERNEL_ENVIRONMENT,
    CurveOptions,
    fired_rules,
    kernels_check,
    point_flags,
    render,
)
from hf_vanilla_transformer.utils import machine
from hf_vanilla_transformer.utils.device import device_precisions

from conftest import FIXTURES, ROOT


XEON_WITH_AMX = ["avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16"]


def test_kernels_capped_at_avx2_leave_no_bf16_units(monkeypatch):
    """A CPU with AMX under the AVX2 caps is, for the package, a laptop's: no bf16 units, so `precision: auto` trains
    in fp32; describe_cpu names the caps and what the CPU has."""
    monkeypatch.setattr(machine, "hardware_extensions", lambda: list(XEON_WITH_AMX))
    for variable in KERNEL_ENVIRONMENT["avx2"]:
        monkeypatch.delenv(variable, raising=False)
    assert machine.cpu_has_fast_bf16() and "bf16" in device_precisions(torch.device("cpu"))
    for variable, value in KERNEL_ENVIRONMENT["avx2"].items():
        monkeypatch.setenv(variable, value)
    assert machine.cpu_extensions() == ["avx2"]
    assert not machine.cpu_has_fast_bf16() and device_precisions(torch.device("cpu")) == ["fp32"]
    said = machine.describe_cpu()
    assert "(avx2; kernels capped by ATEN_CPU_CAPABILITY=avx2" in said and "the CPU has avx2, avx512f" in said
    # oneDNN's cap alone is what withholds the bf16 units; one that allows them withholds only AMX.
    monkeypatch.delenv("ATEN_CPU_CAPABILITY")
    monkeypatch.delenv("MKL_ENABLE_INSTRUCTIONS")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")
    assert machine.cpu_extensions() == XEON_WITH_AMX[:-1] and machine.cpu_has_fast_bf16()
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "ALL")  # not a cap
    assert machine.cpu_extensions() == XEON_WITH_AMX and machine.kernel_caps() == {}


@pytest.mark.slow  # four interpreters importing torch
def test_the_avx2_probe_sees_every_library_capped():
    """The probe a curve runs before its points, for real: PyTorch dispatches to AVX2, oneDNN and MKL say AVX2 in
    their verbose output; without the caps it reports what the CPU has, and a cap that did not take is not `ok`."""
    if "avx2" not in machine.hardware_extensions() or not torch.backends.mkl.is_available():
        pytest.skip("the caps are those of x86 CPUs with AVX2 and of PyTorch's MKL build")
    check = kernels_check("avx2")
    assert check["ok"], check
    assert check["torch"] == "AVX2" and "AVX2" in check["onednn"] and curve_module.mkl_capped(check["mkl"])
    assert "512" not in check["onednn"] + check["mkl"]
    native = kernels_check("native")
    assert native["ok"] and native["torch"] is not None and "capped" not in native["machine"]


@pytest.mark.slow  # an interpreter importing torch, twice
def test_a_cap_that_did_not_take_stops_the_curve(monkeypatch, tmp_path):
    """Where the caps are not in the points' environment, a CPU with AVX-512 shows it: the probe is not `ok`, and
    the curve runs no point."""
    if "avx512f" not in machine.hardware_extensions():
        pytest.skip("this CPU has no AVX-512: capped or not, its kernels are AVX2's")
    monkeypatch.setitem(KERNEL_ENVIRONMENT, "avx2", {})
    check = kernels_check("avx2")
    assert not check["ok"] and check["torch"] != "AVX2"
    with pytest.raises(RuntimeError, match="the kernels were not capped as asked"):
        curve_module.run_curve(CurveOptions(str(tmp_path), minutes=(1.0,), kernels="avx2"), progress=False)
    assert not any(tmp_path.glob("1min-seed*"))


def test_mkls_verbose_line_shows_the_cap_on_intel_and_names_nothing_beyond_it_elsewhere():
    """What MKL_VERBOSE says it runs for, as MKL 2025 prints it: capped on a Xeon with AMX, uncapped there, and on an
    AMD EPYC (which MKL names by no extension, capped or not)."""
    assert curve_module.mkl_capped("Intel(R) Advanced Vector Extensions 2 (Intel(R) AVX2) enabled processors, Lnx")
    assert curve_module.mkl_capped("Intel(R) Architecture processors, Lnx 2.45GHz lp64 gnu_thread")
    uncapped = "Intel(R) Advanced Vector Extensions 512 (Intel(R) AVX-512) with support for INT8, BF16, FP16 (limited)"
    assert not curve_module.mkl_capped(
        uncapped + " instructions, and Intel(R) Advanced Matrix Extensions (Intel(R) AMX)"
    )
    assert not curve_module.mkl_capped("Intel(R) Advanced Vector Extensions (Intel(R) AVX) enabled processors")


def test_curve_options_refuse_what_they_cannot_run(tmp_path):
    with pytest.raises(ValueError, match=r"--max_minutes, --seed are the curve's own"):
        CurveOptions(str(tmp_path), extra=("--seed", "3", "--max_minutes=5"))
    with pytest.raises(ValueError, match=r"minutes=\(26.0, 0.0\) is invalid"):
        CurveOptions(str(tmp_path), minutes=(26.0, 0.0))
    with pytest.raises(ValueError, match="kernels='sse' is invalid; expected one of native, avx2"):
        CurveOptions(str(tmp_path), kernels="sse")
    options = CurveOptions(str(tmp_path), minutes=(13.0,), seeds=(1,), extra=("--recipe", "cpu"))
    assert point_flags(options, 13.0, 1) == [
        *("main", "--max_minutes", "13", "--seed", "1", "--output_dir", str(tmp_path / "13min-seed1")),
        *("--disable_tqdm", "true", "--recipe", "cpu"),
    ]


def test_the_table_reads_each_point_from_its_results(trained_folder, tmp_path):
    """A point's row is its results.json's figures (a real run's folder), the rules its plan shows, and the plot is
    drawn; a point with no results yet is listed by its status."""
    folder, _ = trained_folder
    curve_dir = tmp_path / "curve"
    (curve_dir / "26min-seed42").mkdir(parents=True)
    shutil.copy(folder / "results.json", curve_dir / "26min-seed42" / "results.json")
    options = CurveOptions(str(curve_dir), minutes=(13.0, 26.0), command="train", extra=("--preset", "tiny"))
    recorded = {
        "options": options.same_curve(),
        "label": "tiny",
        "points": {"26min-seed42": {"status": "ok"}, "13min-seed42": {"status": "failed (exit status 1)"}},
    }
    (curve_dir / "curve.json").write_text(json.dumps(recorded))
    rendered = render(str(curve_dir))
    results = json.loads((folder / "results.json").read_text())
    first, second = rendered["rows"]
    assert first == {"point": "13min-seed42", "minutes": 13.0, "seed": 42, "status": "failed (exit status 1)"}
    assert second["bleu"] == results["test"]["bleu"] and second["updates"] == results["training"]["steps"]
    assert second["epochs"] == results["training"]["epochs"] and second["chrf"] == results["test"]["chrf"]
    table = (curve_dir / "curve.md").read_text()
    assert second["seconds_per_update"] == results["training"]["seconds_per_update"]
    assert (
        f"| 26 | 42 | {second['size']} | {second['precision']} | {results['training']['steps']:,} | "
        f"{results['training']['seconds_per_update']:.3f} | {results['training']['epochs']:.1f} |"
    ) in table
    assert (
        f"{results['test']['bleu']:.2f}" in table and "| 13 | 42 | | | | | | | | | | failed (exit status 1) |" in table
    )
    assert (curve_dir / "curve.png").stat().st_size > 10_000
    # The rules: recorded ones as said; else what the plan shows.
    assert fired_rules({"rules": [{"rule": "preset_choices", "said": "size base"}]}) == ["size base"]
    legacy = {
        "recipe": {"warmup_steps": 1000},
        "plan": {"warmup_steps": 391, "reasons": ["4,000 updates; capped at 3,700 = 20 epochs of this corpus"]},
        "length_penalty_choice": {"chosen": 1.5, "validation_bleu": {"0.6": 1.0, "1.0": 2.0, "1.5": 3.0}},
    }
    assert fired_rules(legacy) == ["epoch cap", "warmup cut to 391", "alpha 1.5 at the grid's edge"]


def curve_command(output: Path, *more: str) -> list[str]:
    return [
        sys.executable,
        str(ROOT / "scripts" / "curve.py"),
        *("--output_dir", str(output), "--command", "train", "--no_progress"),
        *("--recipe", "cpu", "--preset", "tiny", "--preset_choices", "tiny", "--vocab_size", "500"),
        *("--data_files", str(FIXTURES / "libreoffice_help_en_de_200.tsv")),
        *("--validation_files", str(FIXTURES / "libreoffice_help_en_de_test_40.tsv")),
        *("--test_files", str(FIXTURES / "libreoffice_help_en_de_test_40.tsv")),
        *("--max_eval_samples", "10", "--source_check", "warn"),
        *more,
    ]


@pytest.mark.slow
def test_a_curve_runs_its_points_and_goes_on_where_it_stopped(tmp_path):
    """Two budgets of the real train command, one after the other, each in its folder; the table and plot; started
    again with a point's results gone, only that point runs (from its last checkpoint) and the other is kept; the
    same folder with other flags is refused."""
    output = tmp_path / "curve"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_VANILLA_TRANSFORMER_ALLOCATOR": "system"}
    command = curve_command(output, "--minutes", "1,1.3")
    first = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env)
    assert first.returncode == 0, first.stderr[-3000:] + first.stdout[-3000:]
    assert "time nothing else on this machine meanwhile" in first.stdout
    recorded = json.loads((output / "curve.json").read_text())
    assert [row["point"] for row in recorded["rows"]] == ["1min-seed42", "1.3min-seed42"]
    for row in recorded["rows"]:
        results = json.loads((output / row["point"] / "results.json").read_text())
        assert row["status"] == "ok" and row["bleu"] == results["test"]["bleu"]
        assert results["plan"]["max_minutes"] == row["minutes"] and results["recipe"]["seed"] == 42
    kept_log = (output / "1min-seed42.log").stat().st_mtime_ns
    (output / "1.3min-seed42" / "results.json").unlink()
    again = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env)
    assert again.returncode == 0, again.stderr[-3000:] + again.stdout[-3000:]
    assert "point 1/1: 1.3 minutes, seed 42 (resumed)" in again.stdout
    assert (output / "1min-seed42.log").stat().st_mtime_ns == kept_log
    assert (output / "1.3min-seed42" / "results.json").is_file()
    assert json.loads((output / "curve.json").read_text())["points"]["1.3min-seed42"]["resumed"] is True
    other = subprocess.run([*command, "--dropout", "0.1"], capture_output=True, text=True, timeout=300, env=env)
    assert other.returncode != 0 and "holds a curve of other settings" in other.stderr
