"""`vanilla-transformer gpu-check` as a file in the repository (`python scripts/gpu_check.py --help`): the command is
`hf_vanilla_transformer/commands/gpu_check.py`, installed with the package."""

import sys

from hf_vanilla_transformer.commands.gpu_check import main


if __name__ == "__main__":
    sys.exit(main())
