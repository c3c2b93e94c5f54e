"""`vanilla-transformer finetune-benchmark` as a file in the repository (`python scripts/finetune_benchmark.py --help`):
the command is `hf_vanilla_transformer/commands/finetune_benchmark.py`, installed with the package."""

from hf_vanilla_transformer.commands.finetune_benchmark import main as main


if __name__ == "__main__":
    main()
