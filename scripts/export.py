"""`vanilla-transformer export` as a file in the repository (`python scripts/export.py --help`): the command is
`hf_vanilla_transformer/commands/export.py`, installed with the package."""

from hf_vanilla_transformer.commands.export import main as main


if __name__ == "__main__":
    main()
