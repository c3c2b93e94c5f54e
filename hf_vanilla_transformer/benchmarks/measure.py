"""What the benchmarks share: timing functions in turns, a function run in a fresh process (so that one engine's or
model's allocations cannot hide another's), and the versions of what was measured."""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable

import torch


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_in_turns(functions: dict[str, Callable], repeats: int, warmup: int, device: str) -> dict[str, list[float]]:
    """Seconds per call of each function, in turns (a, b, c, a, b, c, ...) after `warmup` calls each. The first
    call of each is timed too, as `first` (what a compiled function's warm-up costs)."""
    times: dict[str, list[float]] = {name: [] for name in functions}
    first: dict[str, float] = {}
    for index in range(warmup + repeats):
        for name, function in functions.items():
            synchronize(device)
            start = time.perf_counter()
            function()
            synchronize(device)
            elapsed = time.perf_counter() - start
            if index == 0:
                first[name] = elapsed
            if index >= warmup:
                times[name].append(elapsed)
    return {"first": first, **times}


def in_fresh_process(function: Callable, *args):
    """`function(*args)` in a new Python process (spawned, not forked), and its result."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(function, args)


def versions(packages: tuple[str, ...] = ("torch", "transformers", "ctranslate2", "onnxruntime")) -> dict[str, str]:
    """The installed version of each of `packages` ("not installed" where missing)."""
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in packages:
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "not installed"
    return found
