"""The recipe at a list of budgets, one run each, as one table and one plot of test BLEU against minutes.

Usage:
    vanilla-transformer curve --output_dir runs/curve                          # the main job at 6, 13, 26, 52, 104 min
    vanilla-transformer curve --output_dir runs/curve --minutes 26,104 --seeds 1           # a second seed, same folder
    vanilla-transformer curve --output_dir runs/curve-avx2 --kernels avx2 --minutes 13,26,52  # an AVX2 laptop's kernels
    vanilla-transformer curve --output_dir runs/mine --command train --recipe cpu --data_files mine.tsv
    vanilla-transformer curve --output_dir runs/curve --render --also runs/curve-avx2      # the plot of both, no run

Each point is `vanilla-transformer main` (or `train`) with `--max_minutes M --seed S --output_dir OUT/<M>min-seed<S>`
and every other flag given here; a point whose folder holds results.json is done, so a killed curve started again
goes on where it stopped. OUT gets curve.md (the table), curve.json (every figure) and curve.png (the plot). Time
nothing else on the machine meanwhile. What each point runs: `hf_vanilla_transformer/benchmarks/curve.py`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..benchmarks.curve import KERNEL_ENVIRONMENT, CurveOptions, render, run_curve
from ..utils.command_line import CommandParser
from .finetune_benchmark import number_list


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    prog = prog or Path(sys.argv[0]).name
    parser = CommandParser(prog, __doc__)
    parser.add_argument("--output_dir", required=True, help="the points' folders and logs, curve.md/json/png")
    parser.add_argument("--minutes", default="6,13,26,52,104", help="the budgets (default: %(default)s)")
    parser.add_argument("--seeds", default="42", help="the seeds of every budget (default: %(default)s, the recipe's)")
    parser.add_argument("--kernels", choices=sorted(KERNEL_ENVIRONMENT), default="native",
                        help="avx2: cap PyTorch's, oneDNN's and MKL's kernels at AVX2 (default: %(default)s)")  # fmt: skip
    parser.add_argument("--command", choices=["main", "train"], default="main", help="what each point runs")
    parser.add_argument("--label", help="the curve's name in the plot (default: its kernels)")
    parser.add_argument("--render", action="store_true", help="write the table and plot again, run nothing")
    parser.add_argument("--also", nargs="*", default=[], help="other curves' folders drawn in the same plot")
    parser.add_argument("--no_progress", action="store_true", help="no progress bar")
    args, extra = parser.parse_known_args(argv)
    try:
        if args.render:
            render(args.output_dir, tuple(args.also), args.label)
            print(Path(args.output_dir, "curve.md").read_text(encoding="utf-8"), end="")
            return
        options = CurveOptions(
            args.output_dir,
            number_list(args.minutes, float, "minutes"),
            number_list(args.seeds, int, "seeds"),
            args.kernels,
            args.command,
            tuple(extra),
            args.label,
        )
        run_curve(options, progress=not args.no_progress)
        if args.also:
            render(args.output_dir, tuple(args.also), args.label)
    except (ValueError, FileNotFoundError, RuntimeError) as error:
        raise SystemExit(f"{prog}: {error}") from None
    print("\n" + Path(args.output_dir, "curve.md").read_text(encoding="utf-8"), end="")
