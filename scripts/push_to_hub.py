"""`vanilla-transformer push` as a file in the repository (`python scripts/push_to_hub.py --help`): the command is
`hf_vanilla_transformer/commands/push.py`, installed with the package."""

import sys

from hf_vanilla_transformer.commands.push import main as main


if __name__ == "__main__":
    sys.exit(main())
