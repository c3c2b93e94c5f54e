"""Average the last N checkpoints of a training run into a model folder (§6.1: base models average the last 5).

Only checkpoints from the last third of the run are taken (--window), and none whose validation loss (from the
last checkpoint's trainer_state.json) is more than 8% above the last one's (a checkpoint between
validations is judged by the next one after it).

Usage:
    vanilla-transformer average RUN_DIR OUTPUT_DIR [--last 5] [--window 0.333]
    vanilla-transformer average --checkpoints RUN/checkpoint-1000 RUN/checkpoint-2000 OUTPUT_DIR
"""

import json
import sys
from pathlib import Path

from ..training.averaging import (
    AVERAGE_WINDOW,
    average_checkpoints,
    average_last_checkpoints,
    checkpoint_folders,
)
from ..utils.command_line import CommandParser


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    prog = prog or Path(sys.argv[0]).name
    parser = CommandParser(prog, __doc__)
    parser.add_argument("paths", nargs="+", help="RUN_DIR OUTPUT_DIR, or (with --checkpoints) folders then OUTPUT_DIR")
    parser.add_argument("--last", type=int, default=5, help="how many of the newest checkpoints to average")
    parser.add_argument(
        "--window", type=float, default=AVERAGE_WINDOW, help="take checkpoints from this last fraction of the run only"
    )
    parser.add_argument("--checkpoints", action="store_true", help="average exactly the folders given")
    args = parser.parse_args(argv)
    if args.checkpoints:
        if len(args.paths) < 2:
            parser.error("give at least one checkpoint folder and the output folder")
        *checkpoints, output = args.paths
        average_checkpoints(checkpoints, output)
    else:
        if len(args.paths) != 2:
            parser.error("give RUN_DIR and OUTPUT_DIR")
        folders = checkpoint_folders(args.paths[0])
        state = folders[-1] / "trainer_state.json" if folders else None
        history = json.loads(state.read_text()).get("log_history", []) if state and state.exists() else []
        _, checkpoints = average_last_checkpoints(
            args.paths[0], args.paths[1], last=args.last, window=args.window, log_history=history
        )
    print(f"averaged {', '.join(str(c) for c in checkpoints)} into {args.paths[-1]}")
