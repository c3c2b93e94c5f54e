"""The GPU check (`vanilla-transformer gpu-check`): the table's arithmetic and goal marks from fixed step outputs
(pinned figures), the pytest lines it counts, its modes, corpus and exit status, a step's time limit stopping the
whole process group; and (slow) the CPU mode end to end, its rows computed from what its steps wrote."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time

import pytest

from hf_vanilla_transformer.benchmarks import gpu_check
from hf_vanilla_transformer.benchmarks.gpu_check import (
    CPU_MODE,
    GPU_MODE,
    CheckOptions,
    benchmark_step,
    check_mode,
    corpus_flags,
    exit_status,
    main_job_minutes,
    main_job_step,
)
from hf_vanilla_transformer.benchmarks.gpu_check_steps import count_tests, failure_tracebacks, gpu_tests_step, run_step
from hf_vanilla_transformer.benchmarks.gpu_check_table import (
    TESTS_CHECK,
    CheckOutputs,
    benchmark_size,
    bleu_row,
    check_rows,
    choice_row,
    gpu_tests_row,
    marian_rows,
    plan_cost_row,
    render_table,
    source_gain_row,
    training_speed_row,
    update_time_row,
)

from conftest import FIXTURES, ROOT


def results_json(**plan) -> dict:
    """A main job's results.json, as much of it as the table reads."""
    return {
        "model": {"vocab_size": 8000, "dropout": 0.1},
        "plan": {
            **dict(preset="base", precision="bf16", attn_implementation="sdpa", max_tokens=4096),
            **dict(gradient_accumulation_steps=1, predicted_seconds_per_update=0.084, seconds_per_update=0.07),
            **dict(measured_seconds_per_update=0.080, torch_compile=False, max_minutes=5),
            **plan,
        },
        "training": {"target_tokens_per_second": 240_000.0},
        "source_check": {
            "gain_at_least": 0.1,
            "history": [{"step": 500, "source_gain": 0.4}, {"step": 1000, "source_gain": 1.25}],
        },
        "test": {"bleu": 38.45},
    }


def benchmark_json(size: str = "base", compiled: bool = True, dtype: str = "bf16", batch: int = 4096) -> dict:
    """The benchmark's JSON of one size: Marian eager at 100,000 tok/s training and 10,000 decoding."""
    speeds = {
        "train_labels": {"ours": 300_000.0, "ours_compiled": 400_000.0, "marian": 100_000.0 * 3},
        "greedy": {"ours": 11_000.0, "ours_compiled": 21_000.0, "marian": 10_000.0},
        "beam4": {"ours": 9_000.0, "ours_compiled": 19_000.0, "marian": 10_000.0},
    }
    cases, ratios = {}, {}
    for case, variants in speeds.items():
        kept = {name: v for name, v in variants.items() if compiled or not name.endswith("_compiled")}
        cases[case] = {name: {"tokens_per_second": v} for name, v in kept.items()}
        ratios[case] = {name: v / kept["marian"] for name, v in kept.items() if name != "marian"}
    return {
        "options": {"dtype": dtype, "batch_tokens": batch, "vocab_size": 8000},
        "sizes": {size: {"cases": cases, "ratios": ratios}},
    }


# ---------------------------------------------------------------------------------------------------------------------
# The rows from fixed outputs
# ---------------------------------------------------------------------------------------------------------------------


def test_the_choice_passes_in_bf16_with_base_or_big_and_the_plan_within_45_seconds():
    row = choice_row(results_json(max_minutes=26), "")
    assert (row.reads, row.mark) == ("base, bf16, sdpa, 4,096 tokens x 1 per update in a 26-minute run", "pass")
    assert choice_row(results_json(preset="small", max_minutes=4.5), "").mark == "fail"  # the H200's first check
    assert choice_row(results_json(preset="big", precision="fp16"), "").mark == "fail"
    assert choice_row(None, "the main job timed out").reads == "n/a: the main job timed out"
    timed = {**results_json(), "setup": {"corpus": {"seconds": 9.0}, "plan": {"seconds": 44.6}}}
    assert (plan_cost_row(timed, "").reads, plan_cost_row(timed, "").mark) == ("44.6 s", "pass")
    timed["setup"]["plan"]["seconds"] = 138.0  # the H200's first check
    assert plan_cost_row(timed, "").mark == "fail" and plan_cost_row(results_json(), "").mark == "n/a"


def test_planned_against_measured_passes_within_ten_percent_over_200_updates():
    row = update_time_row(results_json(), "")
    assert row.figures == {"planned": 0.084, "measured": 0.080, "ratio": pytest.approx(1.05), "updates": None}
    assert (row.reads, row.mark) == ("0.0840 / 0.0800 s = 1.05", "pass")
    assert update_time_row(results_json(predicted_seconds_per_update=0.090), "").mark == "fail"  # 1.125
    assert update_time_row(results_json(predicted_seconds_per_update=0.070), "").mark == "fail"  # 0.875
    # A plan recorded without the new shapes' figure: its seconds per update.
    older = update_time_row(results_json(predicted_seconds_per_update=None), "")
    assert older.figures["ratio"] == pytest.approx(0.875) and older.mark == "fail"
    assert update_time_row(results_json(measured_seconds_per_update=None), "").mark == "n/a"
    counted = results_json()
    counted["training"]["steps"] = 3210
    assert update_time_row(counted, "").reads == "0.0840 / 0.0800 s = 1.05 over 3,210 updates"
    counted["training"]["steps"] = 7  # the H200's first check: 1.17 over 7 updates, each a new shape
    short = update_time_row(counted, "")
    assert short.mark == "fail" and short.reads.endswith("over 7 updates (fewer than 200)")


def test_the_main_jobs_training_speed_against_the_benchmarks_step_of_its_size_batch_and_dtype():
    outputs = CheckOutputs({}, results_json(), "", {"base": benchmark_json()})
    row = training_speed_row(outputs)
    assert row.figures == {"main_job": 240_000.0, "benchmark": 300_000.0, "variant": "ours", "ratio": 0.8}
    assert (row.reads, row.mark) == ("240,000 / 300,000 (base, ours) = 0.80", "pass")
    # A compiled training step is compared with the benchmark's compiled step: 0.6 of it.
    compiled = training_speed_row(CheckOutputs({}, results_json(torch_compile=True), "", {"base": benchmark_json()}))
    assert compiled.figures["ratio"] == 0.6 and compiled.mark == "fail"
    other = CheckOutputs({}, results_json(), "", {"base": benchmark_json(dtype="fp32", batch=8192)})
    assert training_speed_row(other).reads == (
        "n/a: the benchmark's dtype fp32 against the main job's bf16, batch_tokens 8192 against the main job's 4096"
    )
    missing = CheckOutputs({}, results_json(preset="big"), "", {"base": benchmark_json()}, {"big": "timed out"})
    assert training_speed_row(missing).reads == "n/a: no benchmark of big (timed out)"


def test_compiled_decoding_needs_twice_marian_eager_and_training_1_3_times():
    training, greedy, beam = marian_rows("base", benchmark_json())
    assert training.figures == {"compiled": pytest.approx(4 / 3), "eager": 1.0, "marian_tokens_per_second": 300_000}
    assert training.reads == "compiled 400,000 tok/s = 1.33x, eager 300,000 tok/s = 1.00x; Marian eager 300,000"
    assert (training.mark, greedy.mark, beam.mark) == ("pass", "pass", "fail")  # 1.33, 2.10, 1.90
    assert (greedy.figures["compiled"], beam.figures["compiled"], beam.figures["eager"]) == (2.1, 1.9, 0.9)
    eager_only = marian_rows("base", benchmark_json(compiled=False))
    assert [row.mark for row in eager_only] == ["n/a"] * 3
    assert eager_only[1].reads == "eager 11,000 tok/s = 1.10x; Marian eager 10,000 (compiled not measured)"


def test_the_source_gain_is_the_last_validations_against_the_checks_own_threshold():
    row = source_gain_row(results_json(), "")
    assert (row.figures["last"], row.mark) == (1.25, "pass")
    assert row.reads == "1.250 at update 1,000 (2 validations: 0.400, 1.250)"
    weak = results_json()
    weak["source_check"]["history"][-1]["source_gain"] = 0.05
    assert source_gain_row(weak, "").mark == "fail"
    assert source_gain_row({**weak, "source_check": None}, "").mark == "n/a"
    # Before the warmup's end the check itself judges nothing (the H200's 4.5-minute check: 7 updates of 16).
    early = results_json(warmup_steps=16)
    early["source_check"]["history"] = [{"step": 7, "source_gain": -0.00006}]
    row = source_gain_row(early, "")
    assert (row.mark, row.reads) == (
        "n/a",
        "-0.000 at update 7 (1 validations: -0.000); before the warmup's end (16): not judged",
    )
    early["plan"]["warmup_steps"] = 4
    assert source_gain_row(early, "").mark == "fail"


def test_the_bleu_of_the_checks_main_job_is_judged_against_40_its_length_said():
    row = bleu_row(results_json(), "")
    assert (row.reads, row.goal, row.mark) == ("38.45 after a 5-minute run", ">= 40", "fail")
    passed = results_json()
    passed["test"]["bleu"] = 40.2
    assert bleu_row(passed, "").mark == "pass" and bleu_row(None, "no results").mark == "n/a"


def test_the_gpu_tests_row_fails_on_a_failure_or_timeout_and_is_not_judged_when_all_skip():
    skipped = gpu_tests_row({"status": "ok", "skipped": 8, "skip_reasons": ["needs a CUDA GPU"]})
    assert (skipped.reads, skipped.mark) == (
        "0 passed, 0 failed, 0 errors, 8 skipped (skipped: needs a CUDA GPU)",
        "n/a",
    )
    assert gpu_tests_row({"status": "ok", "passed": 7, "skipped": 1}).mark == "pass"
    assert gpu_tests_row({"status": "failed (exit status 1)", "passed": 7, "failed": 1}).mark == "fail"
    timed_out = gpu_tests_row({"status": "timed out", "timed_out": True, "limit_seconds": 110, "passed": 3})
    assert timed_out.mark == "fail" and timed_out.reads.startswith("timed out after 110 s: 3 passed")
    assert gpu_tests_row({"status": "not run: no tests/ folder here"}).mark == "n/a"


def test_the_table_has_every_row_in_order_and_a_size_the_benchmark_missed():
    outputs = CheckOutputs(
        {"status": "ok", "passed": 8},
        results_json(),
        "",
        {"base": benchmark_json()},
        {"big": "the benchmark timed out"},
    )
    rows = check_rows(outputs)
    assert [row.check for row in rows] == [
        TESTS_CHECK,
        "main job: size, precision, attention, batch",
        "main job: the plan's seconds",
        "seconds per update: planned / measured",
        "training tokens/s: main job / benchmark",
        "base training / Marian eager",
        "base greedy decoding / Marian eager",
        "base beam-4 decoding / Marian eager",
        "big against Marian eager",
        "source gain (nats per token)",
        "test BLEU",
    ]
    marks = ["pass", "pass", "n/a", "pass", "pass", "pass", "pass", "fail", "n/a", "pass", "fail"]
    assert [row.mark for row in rows] == marks
    table = render_table(rows).splitlines()
    assert table[:2] == ["| check | reads | goal | mark |", "|---|---|---|---|"] and len(table) == 13
    assert table[5] == (
        "| seconds per update: planned / measured | 0.0840 / 0.0800 s = 1.05 | within 10% over 200+ updates | pass |"
    )
    # Without the main job's results every row that reads them says why.
    empty = check_rows(CheckOutputs({"status": "ok"}, None, "the main job timed out after 330 s", {}, {}))
    assert [row.mark for row in empty] == ["n/a"] * 7 and "timed out after 330 s" in empty[3].reads


def test_the_benchmarks_size_of_a_preset_is_the_one_of_its_architecture():
    assert [benchmark_size(p) for p in ("tiny", "small", "base", "big", "compact", None)] == [
        *("toy", "small", "base", "big"),
        *(None, None),
    ]


# ---------------------------------------------------------------------------------------------------------------------
# The steps and the modes
# ---------------------------------------------------------------------------------------------------------------------

PYTEST_OUTPUT = """\
tests/test_gpu.py::test_logits[sdpa] PASSED                                [ 20%]
tests/test_gpu.py::test_logits[flex_attention] FAILED                      [ 40%]
tests/test_gpu.py::test_caches SKIPPED (needs flash-attn)                  [ 60%]
tests/test_gpu.py::test_sync PASSED                                        [ 80%]
tests/test_gpu.py::test_sync ERROR                                         [ 80%]
tests/test_scale_out.py::test_bf16 SKIPPED (needs two GPUs)                [100%]
=========================== short test summary info ============================
SKIPPED [1] tests/test_gpu.py:52: needs flash-attn
SKIPPED [1] tests/test_scale_out.py:309: needs two GPUs
FAILED tests/test_gpu.py::test_logits[flex_attention] - AssertionError
"""


def test_the_gpu_tests_are_counted_from_pytests_lines_a_teardown_error_counting_against_its_test():
    assert count_tests(PYTEST_OUTPUT) == {
        "passed": 1,
        "failed": 1,
        "errors": 1,
        "skipped": 2,
        "skip_reasons": ["needs flash-attn", "needs two GPUs"],
        "failed_tests": ["tests/test_gpu.py::test_logits[flex_attention]", "tests/test_gpu.py::test_sync"],
    }


XDIST_OUTPUT = """\
created: 8/8 workers
8 workers [4 items]

[gw1] [ 25%] PASSED tests/test_gpu.py::test_logits[sdpa]
[gw0] [ 50%] FAILED tests/test_gpu.py::test_caches[4]
[gw2] [ 75%] SKIPPED tests/test_gpu.py::test_flash
[gw3] [100%] ERROR tests/test_gpu.py::test_loop
=========================== short test summary info ============================
SKIPPED [1] tests/test_gpu.py:61: flash-attn is not installed
"""


def test_pytest_xdists_lines_are_counted_as_one_processs():
    assert count_tests(XDIST_OUTPUT) == {
        "passed": 1,
        "failed": 1,
        "errors": 1,
        "skipped": 1,
        "skip_reasons": ["flash-attn is not installed"],
        "failed_tests": ["tests/test_gpu.py::test_caches[4]", "tests/test_gpu.py::test_loop"],
    }


def stand_in_clone(tmp_path, tests: str):
    """A clone of the repository for `gpu_tests_step` holding only tests/conftest.py and `tests` (the source of
    tests/test_stand_in.py, marked gpu): (clone, the check's folder, the environment that imports this package)."""
    clone = tmp_path / "clone"
    (clone / "tests").mkdir(parents=True)
    (clone / "tests" / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text())
    (clone / "tests" / "test_stand_in.py").write_text(tests)
    (clone / "pyproject.toml").write_text('[tool.pytest.ini_options]\nmarkers = ["gpu: needs a GPU"]\n')
    folder = tmp_path / "check"
    folder.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return clone, folder, env


@pytest.mark.slow  # two pytest worker processes started (about 20 s on a 2-core machine)
@pytest.mark.skipif(importlib.util.find_spec("xdist") is None, reason="pytest-xdist is not installed")
def test_the_gpu_tests_run_in_parallel_processes_and_a_failure_is_counted_and_kept_once(tmp_path):
    """Two tests run in two worker processes, and a failure's traceback is
    written once, by pytest-xdist's controller (each worker's report reaches it)."""
    clone, folder, env = stand_in_clone(
        tmp_path,
        "import os, time, pytest\n"
        "pytestmark = pytest.mark.gpu\n"
        "def test_a():\n    time.sleep(3)\n    assert os.environ['PYTEST_XDIST_WORKER']\n"
        "def test_b():\n    time.sleep(3)\n    assert 1 == 2, 'the failure'\n",
    )
    step = gpu_tests_step(clone, folder, env, GPU_MODE.tests_seconds, workers=2)
    assert "-n" in step["command"].split() and (step["passed"], step["failed"]) == (1, 1), step
    assert list(step["tracebacks"]) == ["tests/test_stand_in.py::test_b (call)"]
    assert (folder / "gpu_tests_failures.log").read_text().count("=== failed test: ") == 1


def test_the_mode_and_the_main_jobs_corpus():
    with pytest.raises(ValueError, match="mode='fast' is invalid; expected one of auto, gpu, cpu"):
        check_mode("fast")
    assert check_mode("cpu") is CPU_MODE
    flags, said = corpus_flags(CPU_MODE, "auto", ROOT)
    assert flags == [
        *("--data_files", str(FIXTURES / "libreoffice_help_en_de_200.tsv")),
        *("--validation_files", str(FIXTURES / "libreoffice_help_en_de_test_40.tsv")),
        *("--test_files", str(FIXTURES / "libreoffice_help_en_de_test_40.tsv")),
    ]
    assert said.startswith("the fixture pairs")
    help_alone = ["--dataset", "libreoffice-help"]  # the cpu recipe's own joins the UI strings
    assert (
        corpus_flags(GPU_MODE, "auto", ROOT)[0] == help_alone and corpus_flags(CPU_MODE, "help", ROOT)[0] == help_alone
    )
    assert corpus_flags(CPU_MODE, "auto", None)[0] == help_alone  # an installed wheel: no fixtures, the help corpus
    with pytest.raises(ValueError, match="corpus='fixtures' but no clone holds no"):
        corpus_flags(CPU_MODE, "fixtures", None)
    with pytest.raises(ValueError, match="corpus='wmt' is invalid"):
        corpus_flags(CPU_MODE, "wmt", ROOT)


def test_the_exit_status_fails_a_failed_step_and_on_a_gpu_a_failed_row():
    steps = {"gpu_tests": {"status": "ok"}, "main_job": {"status": "ok"}, "benchmark": {"status": "ok"}}
    rows = [{"mark": "pass"}, {"mark": "fail"}, {"mark": "n/a"}]
    assert exit_status({"mode": "cpu", "steps": steps, "rows": rows}) == 0  # the CPU mode's figures are no goals
    assert exit_status({"mode": "gpu", "steps": steps, "rows": rows}) == 1
    assert exit_status({"mode": "gpu", "steps": steps, "rows": rows[::2]}) == 0
    timed_out = {**steps, "main_job": {"status": "timed out after 330 s"}}
    assert exit_status({"mode": "cpu", "steps": timed_out, "rows": []}) == 1
    not_run = {**steps, "gpu_tests": {"status": "not run: no tests/ folder here"}}
    assert exit_status({"mode": "cpu", "steps": not_run, "rows": []}) == 0


def test_on_a_gpu_the_main_job_has_the_time_left_and_the_benchmark_times_base_compiled_and_its_size(
    tmp_path, monkeypatch
):
    """What only a GPU runs, with the steps stood in: the main job's minutes, the commands and their limits."""
    ran = []

    def stand_in(command, log, seconds, env, cwd=None):
        ran.append((command, round(seconds)))
        if "benchmark" in command and "small" not in command:  # small's process writes no JSON
            path = command[command.index("--json") + 1]
            size = command[command.index("--sizes") + 1]
            (tmp_path / path).write_text(json.dumps(benchmark_json(size)))
        return {"status": "ok", "seconds": 1.0}

    # 9.5 minutes in all: 450 s left after set-up and tests, 120 for the benchmark, 10 for the end: 5.3 minutes.
    assert GPU_MODE.total_seconds == 570 and main_job_minutes(GPU_MODE, None, 450) == 5.3
    assert main_job_minutes(GPU_MODE, 7, 450) == 7 and main_job_minutes(CPU_MODE, None, None) == 3
    with pytest.raises(ValueError, match="240 s are left of the check's 570 s, 1.8 minutes for the main job after"):
        main_job_minutes(GPU_MODE, None, 240)
    monkeypatch.setattr(gpu_check, "run_step", stand_in)
    step, results = main_job_step(GPU_MODE, [], 4.8, tmp_path, {})
    (main, limit), *_ = ran
    assert main[1:] == [
        *("-m", "hf_vanilla_transformer", "main", "--max_minutes", "4.8", "--output_dir", str(tmp_path / "main-job")),
        *("--disable_tqdm", "true"),
    ]
    assert limit == 4.8 * 60 + 30 and results is None and step["results_json"] is None
    (tmp_path / "main-job").mkdir()
    (tmp_path / "main-job" / "results.json").write_text("{}")
    with pytest.raises(ValueError, match="main-job is not empty: the main job would resume it"):
        main_job_step(GPU_MODE, [], 5, tmp_path, {})
    ran.clear()
    step, measured, missing = benchmark_step(GPU_MODE, results_json(preset="small"), tmp_path, {}, seconds=140)
    # big's eager rows have no goal: not timed (48 s on the H100); the main job's size where it is another is
    assert [command[command.index("--sizes") + 1] for command, _ in ran] == ["base", "small"]
    assert ran[0][0][6:14] == [
        *("--device=cuda", "--dtype=bf16", "--attn=sdpa", "--batch_tokens=4096", "--vocab_size=8000"),
        *("--dropout=0.1", "--compile=true", "--generation_batch"),
    ]
    assert [command[12] for command, _ in ran] == ["--compile=true", "--compile=false"]
    flags = ran[0][0]
    assert flags[flags.index("--cases") + 1 : flags.index("--cases") + 4] == ["train_labels", "greedy", "beam4"]
    assert flags[flags.index("--compile_peers") + 1] == "false"  # Marian's compiled variants are no goal's
    assert 135 <= ran[0][1] <= 140  # the sizes share the seconds given
    assert list(measured) == ["base"] and missing == {"small": "the benchmark wrote no benchmark_small.json"}
    assert step["settings"]["compiled_sizes"] == ["base"]
    # The benchmark's step in the main job's precision where it has it alike (the H100's main job trained in tf32,
    # the benchmark's bf16 step was not its step); its fp16 is fp16 weights, not the Trainer's autocast: bf16 then.
    for trained, timed in (("tf32", "tf32"), ("fp16", "bf16")):
        ran.clear()
        benchmark_step(GPU_MODE, results_json(precision=trained), tmp_path, {}, seconds=140)
        assert ran[0][0][7] == f"--dtype={timed}", trained


def test_the_check_counts_its_limit_from_its_set_up_and_leaves_its_files_in_its_folder(tmp_path, monkeypatch):
    """The three steps stood in: a check whose set-up began 100 s ago gives its main job the rest of the 570 s less
    the benchmark's 120 s and 10 s for the end, and leaves the table, the JSON and the main job's
    results.json in its folder."""
    asked = {}

    def main_job(mode, data, minutes, folder, env):
        asked["minutes"] = minutes
        return {"status": "ok", "seconds": 1.0, "results_json": "r"}, results_json(max_minutes=minutes)

    def benchmark(mode, results, folder, env, seconds=None):
        asked["benchmark_seconds"] = seconds
        return {"status": "ok", "seconds": 1.0}, {"base": benchmark_json()}, {}

    monkeypatch.setattr(gpu_check, "check_mode", lambda mode: GPU_MODE)
    monkeypatch.setattr(gpu_check, "gpu_tests_step", lambda *a: {"status": "ok", "seconds": 1.0, "passed": 9})
    monkeypatch.setattr(gpu_check, "main_job_step", main_job)
    monkeypatch.setattr(gpu_check, "benchmark_step", benchmark)
    monkeypatch.setattr(gpu_check, "describe_machine", lambda device: "a stand-in GPU")
    folder = tmp_path / "check"
    report = gpu_check.run_gpu_check(CheckOptions(output_dir=str(folder), started_at=time.time() - 100))
    assert asked["minutes"] == pytest.approx(5.6, abs=0.11)  # (570 - 100 - 120 - 10) s, in tenths of a minute
    assert asked["benchmark_seconds"] == pytest.approx(460, abs=2)  # a main job that took no time left it all
    assert json.loads((folder / "gpu_check.json").read_text()) == json.loads(json.dumps(report))
    assert json.loads((folder / "main_job_results.json").read_text())["plan"]["max_minutes"] == asked["minutes"]
    table = (folder / "gpu_check.md").read_text()
    assert table.startswith("GPU check on cuda, a stand-in GPU") and "| test BLEU | 38.45 after a 5." in table
    assert report["main_job_minutes"] == asked["minutes"]


@pytest.mark.slow  # a process of its own: 8-11 s on a Zen 3
def test_a_failed_gpu_tests_traceback_is_kept_even_when_the_step_is_stopped_at_its_limit(tmp_path):
    """The first real GPU run stopped the gpu tests at their limit with three failures and no traceback (pytest
    prints them in its summary): tests/conftest.py adds each failure's traceback to a file as it happens, and the
    step reads the file whatever became of pytest. Here a test of the clone fails, then pytest is killed as the
    limit kills it (SIGKILL, no summary)."""
    clone, folder, env = stand_in_clone(
        tmp_path,
        "import os, signal, pytest\n"
        "pytestmark = pytest.mark.gpu\n"
        "def test_a_kernel():\n    assert 8 >= 16, '=== Inductor === NYI: embedding dimension must be at least 16'\n"
        "def test_b_killed():\n    os.kill(os.getpid(), signal.SIGKILL)\n",
    )
    step = gpu_tests_step(clone, folder, env, GPU_MODE.tests_seconds)  # one process: killed
    assert step["status"] == "failed (exit status -9)" and step["failed"] == 1, step
    assert "short test summary" not in (folder / "gpu_tests.log").read_text()  # no summary, no traceback there
    ((name, traceback),) = step["tracebacks"].items()
    assert name == "tests/test_stand_in.py::test_a_kernel (call)"
    assert "=== Inductor === NYI: embedding dimension must be at least 16" in traceback  # a banner in it: one test
    assert failure_tracebacks(folder / "missing.log") == {}


@pytest.mark.slow  # waits out a 20-second limit
def test_gpu_tests_that_all_ran_and_whose_pytest_outlasts_the_limit_at_its_exit_are_not_a_timeout(tmp_path):
    """On an H200 pytest printed its summary and took 10-20 s more to exit (compile and data-loading workers): a step
    stopped there ran every test; its row counts them and says how it ended, and a failure still fails it."""
    clone = tmp_path / "clone"
    (clone / "tests").mkdir(parents=True)
    (clone / "tests" / "conftest.py").write_text("import atexit, time\natexit.register(time.sleep, 120)\n")
    (clone / "tests" / "test_stand_in.py").write_text(
        "import pytest\npytestmark = pytest.mark.gpu\ndef test_a():\n    pass\n"
        "@pytest.mark.slow\ndef test_slow_left_out():\n    assert False\n"
    )
    (clone / "pyproject.toml").write_text('[tool.pytest.ini_options]\nmarkers = ["gpu: a GPU", "slow: slow"]\n')
    folder = tmp_path / "check"
    folder.mkdir()
    step = gpu_tests_step(clone, folder, dict(os.environ), seconds=20)
    assert step["status"].startswith("ok (pytest printed its summary") and not step["timed_out"], step
    assert (step["passed"], step["failed"]) == (1, 0)
    row = gpu_tests_row(step)
    assert row.mark == "pass" and row.reads.endswith("(pytest stopped at the limit while exiting, after its summary)")
    assert gpu_tests_row({**step, "failed": 1}).mark == "fail"


def test_a_step_past_its_limit_is_stopped_with_its_whole_process_group(tmp_path):
    child = tmp_path / "child.pid"
    command = ["sh", "-c", f"sleep 60 & echo $! > {child}; echo started; wait"]
    started = time.monotonic()
    step = run_step(command, tmp_path / "step.log", 1.5, dict(os.environ))
    assert step["status"] == "timed out after 2 s" and step["timed_out"] and step["returncode"] is None
    assert time.monotonic() - started < 20 and (tmp_path / "step.log").read_text() == "started\n"
    pid = int(child.read_text())
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid), "the step's child outlived its limit"
    failed = run_step(["sh", "-c", "exit 3"], tmp_path / "failed.log", 10, dict(os.environ))
    assert failed["status"] == "failed (exit status 3)" and not failed["timed_out"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as handle:  # a zombie has ended
        return handle.read().split(")")[-1].split()[0] != "Z"


# ---------------------------------------------------------------------------------------------------------------------
# The CPU mode, end to end
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_cpu_mode_runs_end_to_end_and_its_rows_are_its_steps_figures(tmp_path):
    output = tmp_path / "gpu_check.json"
    command = [sys.executable, "-m", "hf_vanilla_transformer", "gpu-check", "--mode", "cpu"]
    command += ["--output", str(output), "--output_dir", str(tmp_path / "check")]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_VANILLA_TRANSFORMER_ALLOCATOR": "system"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.startswith("GPU check on cpu (not a GPU: the logic is checked, the figures mean nothing)")
    report = json.loads(output.read_text())
    assert report["device"] == "cpu (not a GPU: the logic is checked, the figures mean nothing)"
    rows = {row["check"]: row for row in report["rows"]}
    for row in report["rows"]:
        assert f"| {row['check']} | {row['reads']} | {row['goal']} | {row['mark']} |" in result.stdout
    # 1. The gpu tests were collected and skipped.
    tests = rows[TESTS_CHECK]
    assert tests["mark"] == "n/a" and tests["figures"]["skipped"] > 0 and tests["figures"]["passed"] == 0
    assert "needs a CUDA GPU" in tests["reads"]
    # 2. The main job's results.json, as the rows read it.
    results = json.loads((tmp_path / "check" / "main-job" / "results.json").read_text())
    plan = results["plan"]
    assert (plan["preset"], plan["precision"], plan["attn_implementation"]) == ("tiny", "fp32", "sdpa")
    assert rows["main job: size, precision, attention, batch"]["mark"] == "fail"  # fp32 and tiny: not the goal
    timing = rows["seconds per update: planned / measured"]["figures"]
    assert timing["planned"] == plan["predicted_seconds_per_update"]
    assert timing["measured"] == plan["measured_seconds_per_update"]
    assert timing["ratio"] == plan["predicted_seconds_per_update"] / plan["measured_seconds_per_update"]
    gain = rows["source gain (nats per token)"]["figures"]
    assert gain["last"] == results["source_check"]["history"][-1]["source_gain"]
    assert rows["test BLEU"]["figures"] == {"bleu": results["test"]["bleu"], "max_minutes": 3}
    # 3. The benchmark of the main job's size ("toy" is the tiny preset) at its batch, vocabulary and dtype.
    benchmark = json.loads((tmp_path / "check" / "benchmark_toy.json").read_text())
    assert benchmark["options"]["batch_tokens"] == plan["max_tokens"]
    assert benchmark["options"]["vocab_size"] == results["model"]["vocab_size"]
    speed = rows["training tokens/s: main job / benchmark"]["figures"]
    step = benchmark["sizes"]["toy"]["cases"]["train_labels"]["ours"]["tokens_per_second"]
    assert speed["main_job"] == results["training"]["target_tokens_per_second"] and speed["benchmark"] == step
    assert speed["ratio"] == speed["main_job"] / step
    for case, name in (("greedy", "greedy decoding"), ("beam4", "beam-4 decoding"), ("train_labels", "training")):
        row = rows[f"toy {name} / Marian eager"]
        assert row["figures"]["eager"] == benchmark["sizes"]["toy"]["ratios"][case]["ours"]
        assert row["mark"] == "n/a" and row["figures"]["compiled"] is None  # the CPU mode does not compile
