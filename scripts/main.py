"""`vanilla-transformer main` as a file in the repository (`python scripts/main.py --help`): the command is
`hf_vanilla_transformer/commands/train.py`, installed with the package."""

from hf_vanilla_transformer.utils.allocator import use_fast_allocator


use_fast_allocator()  # re-runs this script once with mimalloc preloaded (utils/allocator.py)

from hf_vanilla_transformer.commands.train import main_job as main  # noqa: E402


if __name__ == "__main__":
    main()
