"""`vanilla-transformer translate` as a file in the repository (`python scripts/translate.py --help`): the command is
`hf_vanilla_transformer/commands/translate.py`, installed with the package."""

from hf_vanilla_transformer.commands.translate import main as main


if __name__ == "__main__":
    main()
