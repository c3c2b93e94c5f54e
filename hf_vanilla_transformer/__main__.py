"""`python -m hf_vanilla_transformer <command> [flags]`: the installed `vanilla-transformer` command, for
`accelerate launch -m hf_vanilla_transformer train ...` and for environments without the console script."""

import sys

from .commands.cli import main


sys.exit(main())
