"""The GPU check: the `gpu` tests (but the slow ones), the main job on the help corpus with the time left and the speed
benchmark of base (eager and compiled) and big against MarianMTModel, in at most nine and a half minutes set-up
included, as one table with each row's goal and mark, also written as Markdown and JSON. On a machine without a CUDA
device the same steps run scaled down, in a few minutes, and say that the figures mean nothing.

Usage:
    vanilla-transformer gpu-check                                  # or: make gpu-check
    vanilla-transformer gpu-check --output_dir runs/gpu-check      # the table, JSON and logs there
    vanilla-transformer gpu-check --mode cpu --corpus fixtures     # the CPU mode on a GPU machine too
    scripts/gpu_check_offline.sh run OUT                           # on an offline GPU machine (docs/gpu.md)

What each step runs and each row's goal: `hf_vanilla_transformer/benchmarks/gpu_check.py`, `gpu_check_table.py` and
docs/gpu.md. The exit status is 1 where a step failed or timed out, or where a row fails its goal on a GPU.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from ..benchmarks.gpu_check import CheckOptions, exit_status, run_gpu_check
from ..utils.command_line import CommandParser


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    prog = prog or Path(sys.argv[0]).name
    parser = CommandParser(prog, __doc__)
    parser.add_argument("--output", help="a copy of the JSON written here too (it is always in the check's folder)")
    parser.add_argument(
        "--output_dir",
        help="the folder of the steps' logs, JSON and the main job's model (default: a new temporary one)",
    )
    parser.add_argument(
        "--mode", choices=["auto", "gpu", "cpu"], default="auto", help="gpu where PyTorch sees a CUDA device (auto)"
    )
    parser.add_argument(
        "--corpus",
        choices=["auto", "help", "fixtures"],
        default="auto",
        help="the main job's data: auto is the help corpus on a GPU, the clone's fixture pairs on a CPU",
    )
    parser.add_argument(
        "--max_minutes",
        type=float,
        help="the main job's budget (default: on a GPU the time the check's 9.5 minutes leave it, on a CPU 3)",
    )
    parser.add_argument(
        "--started_at",
        type=float,
        help="when the check's set-up began (seconds since the epoch, `date +%%s`): its 9.5 minutes count from there",
    )
    args = parser.parse_args(argv)
    if args.started_at is not None and not 0 < time.time() - args.started_at < 3600:
        raise SystemExit(f"{prog}: --started_at {args.started_at} is not within the last hour; expected `date +%s`.")
    options = CheckOptions(args.mode, args.corpus, args.output, args.output_dir, args.max_minutes, args.started_at)
    try:
        report = run_gpu_check(options)
    except ValueError as error:
        raise SystemExit(f"{prog}: {error}") from None
    return exit_status(report)
