"""List the configuration files shipped with the package: the training recipes (for `--recipe NAME`) and the
`accelerate launch` files, with where they are installed.

Usage:
    vanilla-transformer configs
    accelerate launch --config_file "$(vanilla-transformer configs --path accelerate/fsdp)" -m hf_vanilla_transformer train ...
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..configs import KINDS, config_files
from ..utils.command_line import CommandParser


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    prog = prog or Path(sys.argv[0]).name
    parser = CommandParser(prog, __doc__)
    parser.add_argument("--path", metavar="KIND/NAME", help="print only the path of one file, e.g. recipes/cpu")
    args = parser.parse_args(argv)
    if args.path:
        kind, _, name = args.path.partition("/")
        files = config_files(kind) if kind in KINDS else {}
        if name not in files:
            raise SystemExit(f"{prog}: {args.path!r} is not a shipped file; expected one of {_names()}.")
        print(files[name])
        return
    for kind in KINDS:
        print(f"{kind}:")
        for name, path in config_files(kind).items():
            print(f"  {name:<24} {path}")


def _names() -> str:
    return ", ".join(f"{kind}/{name}" for kind in KINDS for name in config_files(kind))
