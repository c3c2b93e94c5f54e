"""A model that exists adapted to another domain in a fixed budget, side by side: the starting model, the same model
fine-tuned with the `finetune` recipe, and a model trained from scratch for the same minutes, on the adaptation
corpus's test split (default the LibreOffice UI strings), as one table.

Usage:
    vanilla-transformer finetune-benchmark --model_name_or_path outputs/vanilla-transformer-en-de \\
        --output_dir runs/finetune-benchmark                             # 12 minutes a run (docs/finetuning.md)
    vanilla-transformer finetune-benchmark --model_name_or_path M --output_dir D --peaks 1e-4,2e-4,4e-4,8e-4 \\
        --seeds 0 --scratch false                                        # the sweep of the recipe's peak

What each row runs: `hf_vanilla_transformer/benchmarks/finetune.py`. Time nothing else on the machine meanwhile.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..benchmarks.finetune import FinetuneBenchmark, run_finetune_benchmark
from ..utils.command_line import CommandParser


def number_list(text: str, kind, name: str) -> tuple:
    try:
        return tuple(kind(item) for item in text.split(",") if item.strip())
    except ValueError:
        raise ValueError(f"--{name} {text!r} is invalid; expected numbers separated by commas.") from None


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    prog = prog or Path(sys.argv[0]).name
    parser = CommandParser(prog, __doc__)
    parser.add_argument("--model_name_or_path", required=True, help="the model folder to start from")
    parser.add_argument("--output_dir", required=True, help="the runs, their logs, table.md and figures.json")
    parser.add_argument("--minutes", type=float, default=12.0, help="each training run's budget (default: 12)")
    parser.add_argument("--dataset", default="libreoffice-ui", help="the adaptation corpus (default: %(default)s)")
    parser.add_argument("--data_files", help="your own training pairs instead (with --validation_files, --test_files)")
    parser.add_argument("--validation_files")
    parser.add_argument("--test_files")
    parser.add_argument("--peaks", help="peak learning rates to sweep, e.g. 1e-4,2e-4 (default: the recipe's)")
    parser.add_argument("--seeds", default="0", help="seeds of each fine-tuning run (default: 0)")
    parser.add_argument("--scratch", choices=["true", "false"], default="true", help="the from-scratch row")
    args, extra = parser.parse_known_args(argv)
    data, test = ("--dataset", args.dataset), ("--dataset", args.dataset, "--split", "test")
    if args.data_files:
        if not (args.validation_files and args.test_files):
            raise SystemExit(f"{prog}: --data_files needs --validation_files and --test_files (the test split scored).")
        data = ("--data_files", args.data_files, "--validation_files", args.validation_files)
        data += ("--test_files", args.test_files)
        test = ("--data_files", args.test_files)
    try:
        peaks = number_list(args.peaks, float, "peaks") if args.peaks else (None,)
        options = FinetuneBenchmark(
            args.model_name_or_path,
            args.output_dir,
            args.minutes,
            data,
            test,
            peaks,
            number_list(args.seeds, int, "seeds"),
            args.scratch == "true",
            tuple(extra),
        )
    except ValueError as error:
        raise SystemExit(f"{prog}: {error}") from None
    run_finetune_benchmark(options)
