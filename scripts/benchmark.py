"""`vanilla-transformer benchmark` as a file in the repository (`python scripts/benchmark.py --help`): the command is
`hf_vanilla_transformer/commands/benchmark.py`, installed with the package."""

from hf_vanilla_transformer.commands.benchmark import main as main


if __name__ == "__main__":
    main()
