"""`vanilla-transformer curve` as a file in the repository (`python scripts/curve.py --help`): the command is
`hf_vanilla_transformer/commands/curve.py`, installed with the package."""

from hf_vanilla_transformer.commands.curve import main as main


if __name__ == "__main__":
    main()
