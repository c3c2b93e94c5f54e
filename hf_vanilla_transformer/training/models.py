"""The model a run trains: a new one of a preset's size with the run's vocabulary, or a saved one to fine-tune."""

from __future__ import annotations

from transformers import set_seed

from ..data.tokenizer import check_special_tokens
from ..model.configuration_vanilla_transformer import VanillaTransformerConfig
from ..model.modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from .arguments import parse_config_overrides


def build_model(recipe, tokenizer, preset: str | None = None, seed: int | None = None):
    """A new model of `preset` (default: the recipe's) with the tokenizer's vocabulary, its initial weights those
    `seed` gives it (the Trainer seeds only after the model exists); or the saved model to fine-tune."""
    overrides = parse_config_overrides(recipe.config_overrides)
    if recipe.dropout is not None:
        overrides["dropout"] = recipe.dropout
    if recipe.label_smoothing is not None:
        overrides["label_smoothing"] = recipe.label_smoothing
    if seed is not None:
        set_seed(seed)
    if recipe.model_name_or_path:
        model = VanillaTransformerForConditionalGeneration.from_pretrained(recipe.model_name_or_path, **overrides)
        drop_foreign_code(model.config)
    else:
        config = VanillaTransformerConfig.from_preset(
            preset or recipe.preset,
            vocab_size=len(tokenizer),
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            decoder_start_token_id=tokenizer.bos_token_id,
            **overrides,
        )
        model = VanillaTransformerForConditionalGeneration(config)
    if recipe.attn_implementation and recipe.attn_implementation != "auto":  # auto: measured by the planner
        model.set_attn_implementation(recipe.attn_implementation)
    check_special_tokens(tokenizer, model.config)
    return model


# What a saved configuration may hold that names code to run where a folder is loaded with `trust_remote_code=True`.
CODE_KEYS = ("auto_map", "custom_pipelines")


def drop_foreign_code(config) -> None:
    """Forget what of a saved model's configuration names code (`CODE_KEYS`): a folder this package did not write may
    name modules of its own repository there, which the folder a fine-tuning run writes would hand on. Saving writes
    this package's own classes into `auto_map` again."""
    for key in CODE_KEYS:
        vars(config).pop(key, None)
