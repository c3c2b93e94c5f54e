"""The GPU check: the `gpu` tests (but the slow ones), a `--max_minutes 3` main job on the help corpus and the speed
benchmark of base and big (bf16, SDPA, eager and compiled) against MarianMTModel, in under ten minutes, as one table
with each row's goal and mark, also written as JSON. On a machine without a CUDA device the same steps run scaled
down, in a few minutes, and say that the figures mean nothing.

Usage:
    vanilla-transformer gpu-check                                  # or: make gpu-check
    vanilla-transformer gpu-check --output gpu_check.json --output_dir runs/gpu-check
    vanilla-transformer gpu-check --mode cpu --corpus fixtures     # the CPU mode on a GPU machine too

What each step runs and each row's goal: `hf_vanilla_transformer/benchmarks/gpu_check.py`, `gpu_check_table.py` and
docs/gpu.md. The exit status is 1 where a step failed or timed out, or where a row fails its goal on a GPU.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..benchmarks.gpu_check import CheckOptions, exit_status, run_gpu_check
from ..utils.command_line import CommandParser


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    prog = prog or Path(sys.argv[0]).name
    parser = CommandParser(prog, __doc__)
    parser.add_argument("--output", default="gpu_check.json", help="the JSON file to write (default: %(default)s)")
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
    parser.add_argument("--max_minutes", type=float, help="the main job's budget (default: 3, on a GPU and on a CPU)")
    args = parser.parse_args(argv)
    try:
        report = run_gpu_check(CheckOptions(args.mode, args.corpus, args.output, args.output_dir, args.max_minutes))
    except ValueError as error:
        raise SystemExit(f"{prog}: {error}") from None
    return exit_status(report)
