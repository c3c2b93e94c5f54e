"""The README's main job.

Usage: python scripts/main.py

Until the training recipe lands this is a short demo: it builds the paper's base model, checks that the three
embeddings are one matrix, and decodes a few token ids with the default beam search.
"""

import torch

from hf_vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration


def main() -> None:
    torch.manual_seed(0)
    model = VanillaTransformerForConditionalGeneration(VanillaTransformerConfig()).eval()
    params = sum(p.numel() for p in model.parameters())
    print(
        f"paper base model: {params / 1e6:.1f}M parameters, shared embedding {tuple(model.model.shared.weight.shape)}"
    )
    source = torch.randint(3, model.config.vocab_size, (2, 12))
    print("beam search (untrained weights):", model.generate(source, max_new_tokens=8).tolist())


if __name__ == "__main__":
    main()
