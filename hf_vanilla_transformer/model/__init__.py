"""The model: the files `save_pretrained` copies into a model folder, so that it loads with `trust_remote_code=True`
where this package is not installed. They sit flat in this folder and import nothing but torch, transformers and
each other (relatively); this `__init__` is not copied.

`modeling_vanilla_transformer.py` is §3 of the paper; its siblings hold what the paper does not describe (the loss,
the decoding rules, input checks, the padding skip, the pre-LN option, the tied-weight bookkeeping, the cache and
masks, LayerNorm under autocast, the initialisation). `pipeline_vanilla_transformer.py` is `pipeline("translation")`,
published beside the model by `sharing/hub.py`; `tokenization_vanilla_transformer.py` is the tokenizer of models
converted from fairseq (`hf_vanilla_transformer.convert`), which the tokenizer's own `save_pretrained` copies beside
them.
"""

from .configuration_vanilla_transformer import PRESETS, VanillaTransformerConfig
from .modeling_vanilla_transformer import (
    VanillaTransformerForConditionalGeneration,
    VanillaTransformerModel,
    VanillaTransformerPreTrainedModel,
)


# What `save_pretrained` writes for `trust_remote_code=True`: the configuration, the modeling file and the siblings it
# imports relatively (tests/test_remote_code.py proves the list against a saved folder).
REMOTE_CODE_FILES = (
    "configuration_vanilla_transformer.py",
    "modeling_vanilla_transformer.py",
    "layers_vanilla_transformer.py",
    "decoding_vanilla_transformer.py",
    "inputs_vanilla_transformer.py",
    "loss_vanilla_transformer.py",
    "padding_vanilla_transformer.py",
    "prenorm_vanilla_transformer.py",
    "tying_vanilla_transformer.py",
    "cache_vanilla_transformer.py",
    "precision_vanilla_transformer.py",
)

__all__ = [
    "PRESETS",
    "REMOTE_CODE_FILES",
    "VanillaTransformerConfig",
    "VanillaTransformerForConditionalGeneration",
    "VanillaTransformerModel",
    "VanillaTransformerPreTrainedModel",
]
