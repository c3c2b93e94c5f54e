"""`vanilla-transformer plot-attention` as a file in the repository (`python scripts/plot_attention.py --help`): the command is
`hf_vanilla_transformer/commands/plot_attention.py`, installed with the package."""

from hf_vanilla_transformer.commands.plot_attention import main as main


if __name__ == "__main__":
    main()
