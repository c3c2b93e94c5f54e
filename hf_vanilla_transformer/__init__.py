"""hf_vanilla_transformer: the original Transformer (Vaswani et al. 2017) as a Hugging Face model.

Importing the package registers the model with the Auto classes (`AutoConfig`, `AutoModel`,
`AutoModelForSeq2SeqLM`, and `AutoTokenizer` for the tokenizer of converted fairseq models), and marks the classes
so that `save_pretrained` writes a folder that loads with `trust_remote_code=True` where this package is not
installed.
"""

from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM, AutoTokenizer

from .model.configuration_vanilla_transformer import PRESETS, VanillaTransformerConfig
from .model.decoding_vanilla_transformer import (
    RelativeMaxLengthCriteria,
    default_generation_config,
    gnmt_length_penalty,
)
from .model.inputs_vanilla_transformer import without_host_reads
from .model.loss_vanilla_transformer import label_smoothed_loss
from .model.modeling_vanilla_transformer import (
    VanillaTransformerForConditionalGeneration,
    VanillaTransformerModel,
    VanillaTransformerPreTrainedModel,
    shift_tokens_right,
    sinusoidal_positions,
)
from .model.tokenization_vanilla_transformer import VanillaTransformerFairseqTokenizer


__version__ = "0.1.0"

AutoConfig.register(VanillaTransformerConfig.model_type, VanillaTransformerConfig, exist_ok=True)
AutoModel.register(VanillaTransformerConfig, VanillaTransformerModel, exist_ok=True)
AutoModelForSeq2SeqLM.register(VanillaTransformerConfig, VanillaTransformerForConditionalGeneration, exist_ok=True)

VanillaTransformerConfig.register_for_auto_class()
VanillaTransformerModel.register_for_auto_class("AutoModel")
VanillaTransformerForConditionalGeneration.register_for_auto_class("AutoModelForSeq2SeqLM")
# The tokenizer of models converted from fairseq checkpoints (hf_vanilla_transformer.convert): found by its name in a
# folder's tokenizer_config.json where this package is imported, saved with its file for `trust_remote_code` elsewhere.
AutoTokenizer.register(VanillaTransformerConfig, slow_tokenizer_class=VanillaTransformerFairseqTokenizer, exist_ok=True)
VanillaTransformerFairseqTokenizer.register_for_auto_class("AutoTokenizer")


def _register_translation_pipeline() -> None:
    """`pipeline("translation", model=...)`: transformers 5 removed the task; this package brings it back."""
    from transformers.pipelines import PIPELINE_REGISTRY, REMOVED_TASKS

    from .model.pipeline_vanilla_transformer import VanillaTranslationPipeline

    REMOVED_TASKS.pop("translation", None)
    if PIPELINE_REGISTRY.supported_tasks.get("translation", {}).get("impl") is not VanillaTranslationPipeline:
        PIPELINE_REGISTRY.register_pipeline(
            "translation", pipeline_class=VanillaTranslationPipeline, pt_model=AutoModelForSeq2SeqLM, type="text"
        )


_register_translation_pipeline()

__all__ = [
    "PRESETS",
    "RelativeMaxLengthCriteria",
    "VanillaTransformerConfig",
    "VanillaTransformerFairseqTokenizer",
    "VanillaTransformerForConditionalGeneration",
    "VanillaTransformerModel",
    "VanillaTransformerPreTrainedModel",
    "default_generation_config",
    "gnmt_length_penalty",
    "label_smoothed_loss",
    "shift_tokens_right",
    "sinusoidal_positions",
    "without_host_reads",
]
