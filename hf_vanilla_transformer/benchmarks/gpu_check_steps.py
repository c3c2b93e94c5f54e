"""The GPU check's steps as processes (`gpu_check.py` runs them): a step is a subprocess in a session of its own under a
time limit, its whole process group stopped past it (`run_step`); the gpu tests' step counts pytest's lines, in one
process or pytest-xdist's workers, and keeps each failure's traceback as it happened (`gpu_tests_step`)."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path


FAILURES_FILE = "HF_VANILLA_TRANSFORMER_TEST_FAILURES"  # tests/conftest.py adds each failure's traceback to it,
FAILURE_MARK = "=== failed test: "  # on a line of its own before each


# A step: a subprocess in a session of its own, under a time limit
# ---------------------------------------------------------------------------------------------------------------------


def run_step(
    command: list[str], log: Path, seconds: float, env: dict, cwd: Path | None = None, append: bool = False
) -> dict:
    """Run `command` with its output in `log` (after what it holds, with `append`); past `seconds` its whole process
    group is stopped. Returns its status ("ok", "failed (exit status N)", "timed out after N s"), exit status,
    seconds, limit and log."""
    started = time.monotonic()
    with log.open("a" if append else "w") as handle:
        process = subprocess.Popen(
            command, stdout=handle, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True
        )
        try:
            returncode, timed_out = process.wait(timeout=max(1.0, seconds)), False
        except subprocess.TimeoutExpired:
            stop_group(process)
            returncode, timed_out = None, True
        except BaseException:
            stop_group(process)
            raise
    status = f"timed out after {seconds:.0f} s" if timed_out else "ok"
    status = f"failed (exit status {returncode})" if returncode not in (0, None) else status
    return {
        "status": status,
        "returncode": returncode,
        "timed_out": timed_out,
        "seconds": time.monotonic() - started,
        "limit_seconds": seconds,
        "command": shlex.join(command),
        "log": str(log),
    }


def stop_group(process: subprocess.Popen) -> None:
    """SIGTERM to the step's process group, then SIGKILL to what is left of it (workers, compile processes)."""
    for sent, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 10)):
        try:
            os.killpg(process.pid, sent)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue


def log_tail(path: str, lines: int = 8) -> str:
    text = Path(path).read_text(errors="replace").splitlines() if Path(path).exists() else []
    return "\n".join(f"    {line[-200:]}" for line in text[-lines:])


# ---------------------------------------------------------------------------------------------------------------------
# The gpu tests
# ---------------------------------------------------------------------------------------------------------------------

OUTCOMES = "PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS"
TEST_LINE = re.compile(rf"^(?P<test>\S+::\S+) (?P<outcome>{OUTCOMES})\b")  # pytest -v in one process
WORKER_LINE = re.compile(rf"^\[gw\d+\] \[\s*\d+%\] (?P<outcome>{OUTCOMES}) (?P<test>\S+::\S+)")  # pytest-xdist's
SUMMARY_LINE = re.compile(r"^=+ .*\b(passed|failed|skipped|deselected|errors?)\b.* in [\d.]+s\b.*=+$")
SKIP_LINE = re.compile(r"^SKIPPED \[\d+\] [^:]+:\d+: (.*)$")


def count_tests(text: str) -> dict:
    """Passed, failed, errors and skipped of a `pytest -v -rs` output (as far as it got), the skips' reasons and
    the tests that failed."""
    outcomes: dict[str, str] = {}
    for line in text.splitlines():
        found = TEST_LINE.match(line) or WORKER_LINE.match(line)
        if found:  # a test's setup, call and teardown can each report: the worst one counts
            test, outcome = found["test"], found["outcome"]
            outcomes[test] = outcome if outcomes.get(test) not in ("FAILED", "ERROR") else outcomes[test]
    values = list(outcomes.values())
    reasons = sorted({found[1] for line in text.splitlines() if (found := SKIP_LINE.match(line))})
    return {
        "passed": values.count("PASSED") + values.count("XFAIL"),
        "failed": values.count("FAILED") + values.count("XPASS"),
        "errors": values.count("ERROR"),
        "skipped": values.count("SKIPPED"),
        "skip_reasons": reasons,
        "failed_tests": [name for name, outcome in outcomes.items() if outcome in ("FAILED", "ERROR", "XPASS")],
    }


def ran_every_test(text: str) -> bool:
    """Whether a pytest output ends its run with the summary line (not one printed for an interrupted run)."""
    interrupted = "KeyboardInterrupt" in text or "!!! Interrupted" in text
    return not interrupted and any(SUMMARY_LINE.match(line) for line in text.splitlines())


def gpu_tests_step(root: Path | None, folder: Path, env: dict, seconds: float, workers: int = 0) -> dict:
    """`pytest -m "gpu and not slow"` in the clone `root` (in `workers` processes where pytest-xdist is installed),
    stopped after `seconds`: its step, its counts and each failure's traceback."""
    if root is None:
        return {"status": "not run: no tests/ folder here (the gpu tests run from a clone)"}
    # no:logging: torch.compile's structured trace adds thousands of empty DEBUG records to each failure's report
    command = [sys.executable, "-m", "pytest", "-m", "gpu and not slow", "tests", "-v", "-rs", "-p", "no:cacheprovider"]
    command += ["-p", "no:logging", *parallel_flags(workers)]
    failures = folder / "gpu_tests_failures.log"  # each failure's traceback as it happens (tests/conftest.py)
    failures.unlink(missing_ok=True)
    step = run_step(command, folder / "gpu_tests.log", seconds, {**env, FAILURES_FILE: str(failures)}, root)
    if step["returncode"] == 5:  # pytest: nothing collected (no test is marked gpu)
        step["status"] = "ok"
    text = Path(step["log"]).read_text(errors="replace")
    if step["timed_out"] and ran_every_test(text):  # its exit (compile and data-loading workers) outlasted the limit
        step["status"] = "ok (pytest printed its summary, then was stopped at the limit while exiting)"
        step["timed_out"], step["stopped_exiting"] = False, True
    counted = count_tests(text)
    return {**step, **counted, "tracebacks": failure_tracebacks(failures)}


def parallel_flags(workers: int) -> list[str]:
    """pytest's flags for `workers` worker processes (pytest-xdist) where it is installed and more than one is asked
    for; else none (one process). The gpu tests spend most of their time compiling and starting processes, each on
    the CPU: in parallel they take about the time of the longest."""
    if workers <= 1 or importlib.util.find_spec("xdist") is None:
        return []
    return ["-n", str(workers)]


def failure_tracebacks(path: Path, lines: int = 12) -> dict[str, str]:
    """Each failed test's traceback, its last `lines` lines (the error), from the file tests/conftest.py writes."""
    found, name = {}, None
    for line in path.read_text(errors="replace").splitlines() if path.exists() else []:
        if line.startswith(FAILURE_MARK):  # a test's first line: the mark, its id and phase
            name = line[len(FAILURE_MARK) :]
            found[name] = []
        elif name is not None:
            found[name].append(line)
    return {test: "\n".join("\n".join(body).rstrip().splitlines()[-lines:]) for test, body in found.items()}
