"""The model a run trains: a new one of a preset's size with the run's vocabulary (and the config overrides of its
recipe, `parse_config_overrides`), or a saved one to fine-tune."""

from __future__ import annotations

from transformers import set_seed

from ..data.tokenizer import check_special_tokens
from ..model.configuration_vanilla_transformer import VanillaTransformerConfig
from ..model.modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration


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


def parse_config_overrides(text: str | None) -> dict:
    """`'d_model=192,encoder_layers=2'` as `{"d_model": 192, "encoder_layers": 2}`, each value of its field's type in
    the config; a ValueError names a pair that is not `name=value`, an unknown field or a value of the wrong kind."""
    if not text:
        return {}
    defaults = VanillaTransformerConfig().to_dict()
    overrides = {}
    for pair in text.split(","):
        name, equals, value = (part.strip() for part in pair.partition("="))
        if not equals or not name or not value:
            raise ValueError(f"config_overrides: {pair.strip()!r} is invalid; expected name=value.")
        if name not in defaults:
            raise ValueError(f"config_overrides: {name!r} is not a field of VanillaTransformerConfig.")
        default = defaults[name]
        try:
            if isinstance(default, bool):
                if value.lower() not in ("true", "false"):
                    raise ValueError
                overrides[name] = value.lower() == "true"
            elif isinstance(default, (int, float)) and not isinstance(default, bool):
                overrides[name] = float(value) if "." in value or "e" in value.lower() else int(value)
            elif default is None:
                overrides[name] = int(value) if value.lstrip("-").isdigit() else value
            else:
                overrides[name] = type(default)(value)
        except ValueError:
            raise ValueError(
                f"config_overrides: {name}={value!r} is invalid; expected a {type(default).__name__}."
            ) from None
    return overrides


# What a saved configuration may hold that names code to run where a folder is loaded with `trust_remote_code=True`.
CODE_KEYS = ("auto_map", "custom_pipelines")


def drop_foreign_code(config) -> None:
    """Forget what of a saved model's configuration names code (`CODE_KEYS`): a folder this package did not write may
    name modules of its own repository there, which the folder a fine-tuning run writes would hand on. Saving writes
    this package's own classes into `auto_map` again."""
    for key in CODE_KEYS:
        vars(config).pop(key, None)
