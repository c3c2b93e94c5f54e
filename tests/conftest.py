"""Shared fixtures: tiny configs and models, seeded, dropout off unless a test turns it on."""

from __future__ import annotations

import pytest
import torch

from hf_vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration


BOS, PAD, EOS = 0, 1, 2


def tiny_config(**overrides) -> VanillaTransformerConfig:
    """The `tiny` preset without dropout, so that every equivalence is exact."""
    return VanillaTransformerConfig.from_preset("tiny", **{"dropout": 0.0, **overrides})


def tiny_model(seed: int = 0, **overrides) -> VanillaTransformerForConditionalGeneration:
    torch.manual_seed(seed)
    return VanillaTransformerForConditionalGeneration(tiny_config(**overrides)).eval()


def random_ids(batch: int, length: int, vocab: int = 99, seed: int = 0) -> torch.Tensor:
    """Token ids drawn from the ordinary tokens (no pad, bos or eos)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (batch, length), generator=generator)


@pytest.fixture
def model() -> VanillaTransformerForConditionalGeneration:
    return tiny_model()
