"""`vanilla-transformer score` as a file in the repository (`python scripts/score.py --help`): the command is
`hf_vanilla_transformer/commands/score.py`, installed with the package."""

from hf_vanilla_transformer.commands.score import main as main


if __name__ == "__main__":
    main()
