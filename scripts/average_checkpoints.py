"""`vanilla-transformer average` as a file in the repository (`python scripts/average_checkpoints.py --help`): the command is
`hf_vanilla_transformer/commands/average.py`, installed with the package."""

from hf_vanilla_transformer.commands.average import main as main


if __name__ == "__main__":
    main()
