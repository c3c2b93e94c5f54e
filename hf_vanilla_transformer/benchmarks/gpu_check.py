"""The GPU check (`vanilla-transformer gpu-check`, `make gpu-check`): whether the package works on this GPU, in one
run of at most nine and a half minutes on a fresh clone, set-up included, before a day of training is committed to
it. Each step is a subprocess under its own time limit, its output in a log file of the check's folder:

1. the `gpu` tests but the slow ones (`pytest -m "gpu and not slow"` in the clone's tests/, in parallel worker
   processes where pytest-xdist is installed), passed, failed and skipped counted from pytest's lines;
2. the main job (`vanilla-transformer main`) on the LibreOffice help corpus, into the check's folder, with the time
   left once the tests ran and the benchmark's share is set aside (`main_job_minutes`);
3. the speed benchmark (`vanilla-transformer benchmark`) of base (eager and compiled) in bf16 with SDPA, only the
   cases the table reads, and of the main job's size where it is another, at the main job's batch, vocabulary and
   dropout (so that its training step is the main job's: the main job runs before it for that reason).

Then one table (`gpu_check_table.py`: each row, its goal and its mark) printed, written as Markdown and as JSON in
the check's folder with a copy of the main job's results.json (`scripts/gpu_check_offline.sh` runs all of it on an
offline GPU machine and collects the folder).

On a machine without a CUDA device (or `--mode cpu`) the same steps run scaled down to a few minutes on two cores,
and the first line and the JSON say that the figures mean nothing: the gpu tests are collected and skipped, the main
job is the cpu recipe's tiny model in fp32 with SDPA for 3 minutes (on the 240 fixture pairs of tests/fixtures,
where the clone has them: the help corpus's test split takes minutes to decode on two cores), and the benchmark is
its size ("toy") in fp32, eager only (compiling its six variants takes minutes there).
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..utils.machine import describe_machine
from .gpu_check_steps import gpu_tests_step, log_tail, run_step
from .gpu_check_table import CheckOutputs, benchmark_size, check_rows, render_table


CPU_DEVICE = "cpu (not a GPU: the logic is checked, the figures mean nothing)"
FIXTURES = ("libreoffice_help_en_de_200.tsv", "libreoffice_help_en_de_test_40.tsv")  # train; validation and test


@dataclass(frozen=True)
class CheckMode:
    """What each step runs on this kind of machine, and its time limits in seconds (the main job's beyond its
    budget)."""

    name: str  # "gpu" or "cpu"
    device: str  # what the first line and the JSON say
    max_minutes: float | None  # the main job's budget; None: the time the whole check's limit leaves it
    main_flags: tuple[str, ...]
    sizes: tuple[str, ...]  # the benchmark's; the main job's size is added where it is another
    compiled_sizes: tuple[str, ...]  # the sizes whose compiled variants are timed too
    dtype: str
    benchmark_flags: tuple[str, ...]
    default_batch: int  # the benchmark's batch where the main job left no plan
    tests_seconds: int
    test_workers: int  # pytest-xdist's worker processes where it is installed (0: one process)
    main_extra_seconds: int
    benchmark_seconds: int  # all sizes together
    total_seconds: int | None = None  # the whole check, set-up included (None: each step its own limit)

    @property
    def torch_device(self) -> str:
        return "cuda" if self.name == "gpu" else "cpu"


# On a GPU the whole check, set-up included, has 9.5 minutes (a device lends at most ten a call): the tests at most
# 120 s (on the H100 in 8 processes 87 s and 17 s of pytest's exit), the benchmark 120 s set aside (base alone, eager
# and compiled against Marian eager: 126 s on the H100; big's eager rows have no goal and are no longer timed, 48 s
# there), the main job what is left (about 5.5 minutes).
GPU_MODE = CheckMode(
    name="gpu",
    device="cuda",
    max_minutes=None,
    main_flags=(),
    sizes=("base",),
    compiled_sizes=("base",),
    dtype="bf16",
    benchmark_flags=(
        *("--generation_batch", "64", "--repeats", "3", "--warmup", "1", "--memory", "false"),
        *("--compile_peers", "false", "--matrix_products", "false", "--cases", "train_labels", "greedy", "beam4"),
    ),
    default_batch=4096,
    tests_seconds=120,
    test_workers=12,
    main_extra_seconds=30,
    benchmark_seconds=120,
    total_seconds=570,
)
CPU_MODE = CheckMode(
    name="cpu",
    device=CPU_DEVICE,
    max_minutes=3,  # 2 left no time to train on a busy 2-core machine (set-up 1 minute)
    main_flags=(
        *("--recipe", "cpu", "--preset", "tiny", "--precision", "fp32", "--attn_implementation", "sdpa"),
        *("--source_check", "warn", "--max_eval_samples", "10"),  # a tiny model in minutes does not read its source
    ),
    sizes=("toy",),
    compiled_sizes=(),
    dtype="fp32",
    benchmark_flags=(
        *("--generation_batch", "4", "--new_tokens", "8", "--repeats", "3", "--warmup", "1", "--memory", "false"),
    ),
    default_batch=1024,
    tests_seconds=120,
    test_workers=0,
    main_extra_seconds=60,
    benchmark_seconds=180,
)
# The main job's precisions whose training step the benchmark times alike (its fp16 is fp16 weights, not autocast).
BENCHMARKED_PRECISIONS = {"gpu": ("bf16", "tf32", "fp32"), "cpu": ("bf16", "fp32")}
MIN_MAIN_MINUTES = 2.0  # a main job given less is not started: its plan would leave no time to train
SLACK_SECONDS = 10  # kept at the end of a check with a limit: the table, the JSON, the files collected


def check_mode(mode: str = "auto") -> CheckMode:
    """The mode asked ("gpu", "cpu") or, with "auto", the one of this machine."""
    if mode not in ("auto", "gpu", "cpu"):
        raise ValueError(f"mode={mode!r} is invalid; expected one of auto, gpu, cpu.")
    if mode == "gpu" and not torch.cuda.is_available():
        raise ValueError("mode='gpu' but PyTorch sees no CUDA device here; run with --mode cpu (or auto).")
    gpu = mode == "gpu" or (mode == "auto" and torch.cuda.is_available())
    return GPU_MODE if gpu else CPU_MODE


def repository_root() -> Path | None:
    """The clone this package runs from (its tests/ and fixtures), else the current folder if it is one, else None
    (an installed wheel)."""
    for root in (Path(__file__).resolve().parents[2], Path.cwd()):
        if (root / "tests" / "conftest.py").is_file():
            return root
    return None


def corpus_flags(mode: CheckMode, corpus: str, root: Path | None) -> tuple[list[str], str]:
    """The main job's data flags and what they are in words: the help corpus (the gpu recipe's default) on a GPU,
    the fixture pairs of the clone on a CPU ("auto"), or as asked."""
    if corpus not in ("auto", "help", "fixtures"):
        raise ValueError(f"corpus={corpus!r} is invalid; expected one of auto, help, fixtures.")
    folder = root / "tests" / "fixtures" if root else None
    present = folder is not None and all((folder / name).is_file() for name in FIXTURES)
    if corpus == "fixtures" and not present:
        raise ValueError(f"corpus='fixtures' but {folder or 'no clone'} holds no {FIXTURES[0]}; run from a clone.")
    if corpus == "help" or (corpus == "auto" and (mode.name == "gpu" or not present)):
        # The help alone on both: the cpu recipe's UI strings are a package the offline GPU image does not carry.
        return ["--dataset", "libreoffice-help"], "the LibreOffice help EN-DE (the gpu recipe's corpus)"
    train, held_out = (str(folder / name) for name in FIXTURES)
    flags = ["--data_files", train, "--validation_files", held_out, "--test_files", held_out]
    return flags, f"the fixture pairs of tests/fixtures ({FIXTURES[0]}; {FIXTURES[1]} for validation and test)"


# ---------------------------------------------------------------------------------------------------------------------
# ---------------------------------------------------------------------------------------------------------------------
# The three steps
# ---------------------------------------------------------------------------------------------------------------------


def main_job_step(
    mode: CheckMode, data: list[str], max_minutes: float, folder: Path, env: dict
) -> tuple[dict, dict | None]:
    """The main job into `folder`/main-job; returns the step and its results.json (None where it wrote none)."""
    output = folder / "main-job"
    if output.exists() and any(output.iterdir()):
        raise ValueError(f"{output} is not empty: the main job would resume it; give another --output_dir.")
    command = [
        *(sys.executable, "-m", "hf_vanilla_transformer", "main", "--max_minutes", f"{max_minutes:g}"),
        *("--output_dir", str(output), "--disable_tqdm", "true", *data, *mode.main_flags),
    ]
    step = run_step(command, folder / "main_job.log", max_minutes * 60 + mode.main_extra_seconds, env)
    path = output / "results.json"
    results = json.loads(path.read_text()) if path.exists() else None
    return {**step, "output_dir": str(output), "results_json": str(path) if results else None}, results


def main_job_minutes(mode: CheckMode, asked: float | None, seconds_left: float | None) -> float:
    """The main job's budget: the minutes asked, else the mode's, else (a check with a limit on the whole) the time
    left once the benchmark's share, the main job's own margin and the check's end are set aside, in tenths of a
    minute. A ValueError where less than `MIN_MAIN_MINUTES` is left."""
    if asked is not None or mode.max_minutes is not None or seconds_left is None:
        return asked or mode.max_minutes or 3.0
    spare = seconds_left - mode.benchmark_seconds - SLACK_SECONDS
    minutes = math.floor(spare / 6) / 10
    if minutes < MIN_MAIN_MINUTES:
        raise ValueError(
            f"{seconds_left:.0f} s are left of the check's {mode.total_seconds} s, {minutes:g} minutes for the main "
            f"job after the benchmark's {mode.benchmark_seconds} s: less than {MIN_MAIN_MINUTES:g}."
        )
    return minutes


def benchmark_step(
    mode: CheckMode, results: dict | None, folder: Path, env: dict, seconds: float | None = None
) -> tuple[dict, dict, dict]:
    """The benchmark, one process per size, at the main job's batch, vocabulary and dropout (else the mode's
    defaults), compiled where the mode compiles that size; the sizes share the mode's time limit (or `seconds`) in
    turn. Returns the step, each measured size's JSON and why each other size has none."""
    plan, model = (results["plan"], results["model"]) if results else ({}, {})
    sizes = list(mode.sizes)
    trained = benchmark_size(plan.get("preset"))
    sizes += [trained] if trained and trained not in sizes else []
    precision = plan.get("precision")  # the benchmark's step is the main job's in the precisions it has alike
    settings = {
        "device": mode.torch_device,
        "dtype": precision if precision in BENCHMARKED_PRECISIONS[mode.name] else mode.dtype,
        "attn": "sdpa",
        "batch_tokens": plan.get("max_tokens") or mode.default_batch,
        "vocab_size": model.get("vocab_size") or 8000,
        "dropout": model.get("dropout", 0.1),
    }
    flags = [f"--{name}={value}" for name, value in settings.items()]
    limit = mode.benchmark_seconds if seconds is None else seconds
    deadline = time.monotonic() + limit
    steps, measured, missing = {}, {}, {}
    for size in sizes:
        left = deadline - time.monotonic()
        if left < 5:
            missing[size] = f"not run: the benchmark's {limit:.0f} s were spent"
            continue
        json_path = folder / f"benchmark_{size}.json"
        command = [sys.executable, "-m", "hf_vanilla_transformer", "benchmark", "--sizes", size, *flags]
        command += [f"--compile={str(size in mode.compiled_sizes).lower()}", *mode.benchmark_flags]
        command += ["--json", str(json_path)]
        steps[size] = run_step(command, folder / f"benchmark_{size}.log", left, env)
        if steps[size]["status"] != "ok":
            missing[size] = f"the benchmark {steps[size]['status']}"
        elif not json_path.exists():
            missing[size] = f"the benchmark wrote no {json_path.name}"
        else:
            measured[size] = json.loads(json_path.read_text())
    failed = [size for size in steps if steps[size]["status"] != "ok"]
    status = f"failed for {', '.join(failed)}" if failed else "ok"
    settings["compiled_sizes"] = [size for size in sizes if size in mode.compiled_sizes]
    return {"status": status, "settings": settings, "sizes": steps, "not_run": missing}, measured, missing


# ---------------------------------------------------------------------------------------------------------------------
# The check
# ---------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckOptions:
    mode: str = "auto"
    corpus: str = "auto"
    output: str | None = None  # the JSON (default: gpu_check.json in the check's folder)
    output_dir: str | None = None  # default: a new folder in the system's temporary folder
    max_minutes: float | None = None  # the main job's budget (default: the mode's, or the time left)
    started_at: float | None = None  # when the check began, set-up included (time.time(); default: now)


def step_environment(mode: CheckMode) -> dict:
    """The steps' environment: unbuffered output, nothing from the Hub; in the CPU mode no CUDA device either."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("MPLBACKEND", "Agg")
    if mode.name == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def say_step(number: int, what: str, step: dict, summary: str = "") -> None:
    took = f" in {step['seconds']:.0f} s" if "seconds" in step else ""
    print(f"[{number}/3] {what}: {step['status']}{took}{'; ' + summary if summary else ''}", flush=True)
    if step["status"] != "ok" and "log" in step:
        print(f"  the end of {step['log']}:\n{log_tail(step['log'])}", flush=True)
    for test, traceback in step.get("tracebacks", {}).items():
        print(f"  {test}:\n" + "\n".join(f"    {line[-200:]}" for line in traceback.splitlines()), flush=True)


def run_gpu_check(options: CheckOptions) -> dict:
    """Run the three steps, print the table, write the table and the JSON into the check's folder (and the JSON to
    `options.output`); returns what the JSON holds."""
    started = time.monotonic() - (time.time() - options.started_at if options.started_at else 0.0)
    mode = check_mode(options.mode)
    if options.max_minutes is not None and options.max_minutes <= 0:
        raise ValueError(f"max_minutes={options.max_minutes} is invalid; expected a number of minutes above 0.")
    deadline = started + mode.total_seconds if mode.total_seconds and options.max_minutes is None else None
    root = repository_root()
    data, corpus = corpus_flags(mode, options.corpus, root)
    folder = Path(options.output_dir or tempfile.mkdtemp(prefix="gpu-check-"))
    folder.mkdir(parents=True, exist_ok=True)
    env = step_environment(mode)
    # The GPU is named at the end: naming it here would hold a CUDA context in this process while the steps run.
    where = f"{torch.cuda.device_count()} CUDA device(s)" if mode.name == "gpu" else describe_machine("cpu")
    print(f"GPU check on {mode.device}; {where}", flush=True)
    limit = f"{mode.total_seconds / 60:g} minutes in all, set-up included" if deadline else "each step its own limit"
    print(f"  {limit}; on {corpus}; logs and the model folder in {folder}", flush=True)
    tests = gpu_tests_step(root, folder, env, mode.tests_seconds, mode.test_workers)
    say_step(1, "gpu tests", tests, ", ".join(f"{tests.get(k, 0)} {k}" for k in ("passed", "failed", "skipped")))
    left = deadline - time.monotonic() if deadline else None
    try:
        minutes = main_job_minutes(mode, options.max_minutes, left)
    except ValueError as error:
        main, results, minutes = {"status": f"failed (not started: {error})"}, None, None
    else:
        print(f"  the main job: {minutes:g} minutes" + (f" (of {left:.0f} s left)" if left else ""), flush=True)
        main, results = main_job_step(mode, data, minutes, folder, env)
    say_step(2, "main job", main, f"results in {main['results_json']}" if results else "no results.json")
    seconds = max(0.0, deadline - time.monotonic() - SLACK_SECONDS) if deadline else None
    benchmark, measured, missing = benchmark_step(mode, results, folder, env, seconds)
    say_step(3, "benchmark", benchmark, f"sizes {', '.join(measured) or 'none'} measured")
    why = f"the main job {main['status']} and left no results.json"
    rows = check_rows(CheckOutputs(tests, results, why, measured, missing))
    report = {
        "device": mode.device,
        "mode": mode.name,
        "machine": describe_machine(mode.torch_device),
        "corpus": corpus,
        "folder": str(folder),
        "main_job_minutes": minutes,
        "steps": {"gpu_tests": tests, "main_job": main, "benchmark": benchmark},
        "rows": [asdict(row) for row in rows],
        "seconds": time.monotonic() - started,
    }
    heading = f"GPU check on {mode.device}, {report['machine']}, {report['seconds'] / 60:.1f} minutes"
    table = f"{heading}:\n\n{render_table(rows)}"
    print(f"\n{table}", flush=True)
    write_outputs(folder, report, table, results, options.output)
    return report


def write_outputs(folder: Path, report: dict, table: str, results: dict | None, output: str | None) -> None:
    """The check's folder holds what a reader needs without the model: the table (gpu_check.md), the JSON
    (gpu_check.json, also written to `output` where given), the failures' tracebacks (gpu_tests_failures.log, where a
    test failed) and the main job's results.json (main_job_results.json)."""
    text = json.dumps(report, indent=2) + "\n"
    (folder / "gpu_check.md").write_text(table + "\n")
    (folder / "gpu_check.json").write_text(text)
    if results is not None:
        (folder / "main_job_results.json").write_text(json.dumps(results, indent=2) + "\n")
    if output:
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        Path(output).write_text(text)
    print(f"\nwritten to {folder / 'gpu_check.json'}" + (f" and {output}" if output else ""), flush=True)


def exit_status(report: dict) -> int:
    """1 where a step failed or timed out, or (on a GPU) a row fails its goal; else 0. The CPU mode's rows are not
    goals: its figures mean nothing."""
    steps = report["steps"]
    failed = [name for name, step in steps.items() if step["status"].startswith(("failed", "timed out"))]
    failing_rows = report["mode"] == "gpu" and any(row["mark"] == "fail" for row in report["rows"])
    return 1 if failed or failing_rows else 0
