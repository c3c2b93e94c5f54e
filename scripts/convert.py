"""`vanilla-transformer convert` as a file in the repository (`python scripts/convert.py --help`): the command is
`hf_vanilla_transformer/commands/convert.py`, installed with the package."""

from hf_vanilla_transformer.commands.convert import main as main


if __name__ == "__main__":
    main()
