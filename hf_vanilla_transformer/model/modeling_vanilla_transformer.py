"""The original Transformer (Vaswani et al. 2017, "Attention Is All You Need") as a Hugging Face model.

Post-LN encoder-decoder (§3.1), multi-head attention (§3.2), position-wise FFN (§3.3), one embedding matrix shared
by encoder input, decoder input and output projection, scaled by sqrt(d_model) (§3.4), sinusoidal positions
computed for any length (§3.5), dropout as in §5.4 and label-smoothed loss (§5.4).

What the paper describes lives here and in its layers (`layers_vanilla_transformer.py`: positions, attention, FFN,
the encoder and decoder layers); what it does not (the loss, the §6.1 decoding rules, input checks, the padding
skip, the pre-LN variant, the tied-weight bookkeeping, the decoding cache and masks, LayerNorm under CPU autocast,
the initialisation) lives in the sibling `*_vanilla_transformer.py` files (docs/layout.md), imported relatively, so
`save_pretrained` copies them and the folder loads with `trust_remote_code=True` without this package.

Shape legend: B batch, S source length, T target length (new tokens), P cached target length, H heads,
D d_model, Dk / Dv per-head query-key / value size, F FFN inner size, V vocabulary.
"""

import math

import torch
from torch import nn
from transformers.cache_utils import Cache
from transformers.masking_utils import create_bidirectional_mask
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithPastAndCrossAttentions,
    Seq2SeqLMOutput,
    Seq2SeqModelOutput,
)
from transformers.modeling_utils import PreTrainedModel
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs, can_return_tuple
from transformers.utils.deprecation import deprecate_kwarg
from transformers.utils.generic import merge_with_config_defaults
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from .cache_vanilla_transformer import decoder_masks, is_first_pass, open_cache
from .configuration_vanilla_transformer import VanillaTransformerConfig
from .decoding_vanilla_transformer import VanillaTransformerGenerationMixin, default_generation_config
from .inputs_vanilla_transformer import (
    _check_ids,
    _check_mask,
    _eager,
    as_encoder_output,
    check_decoder_inputs,
    check_positions,
)
from .layers_vanilla_transformer import (
    VanillaTransformerAttention,
    VanillaTransformerDecoderLayer,
    VanillaTransformerEncoderLayer,
    VanillaTransformerFeedForward,
    VanillaTransformerPreLNDecoderLayer,
    VanillaTransformerPreLNEncoderLayer,
    eager_attention_forward,
    sinusoidal_positions,
    token_positions,
)
from .loss_vanilla_transformer import loss_labels, project_and_score, shift_tokens_right
from .padding_vanilla_transformer import decoder_token_index, real_token_index
from .precision_vanilla_transformer import VanillaTransformerLayerNorm
from .tying_vanilla_transformer import SharedEmbeddingTyingMixin, init_module_weights


# --- Pre-trained model base: initialisation, tied embeddings ---------------------------------------------------------


class VanillaTransformerPreTrainedModel(SharedEmbeddingTyingMixin, PreTrainedModel):
    """The base of the stacks and models: the initialisation (`config.initialization`, which the paper leaves open) and
    the one shared matrix's bookkeeping on save and load (`SharedEmbeddingTyingMixin`), in tying_vanilla_transformer.py."""

    config: VanillaTransformerConfig
    config_class = VanillaTransformerConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _supports_flash_attn = True
    _supports_sdpa = True
    _supports_flex_attn = True
    # No host syncs in a forward under torch.compile (see `_eager`), and every cache update is in place with a static
    # cache: the decoding step and the training forward compile as one graph each.
    _can_compile_fullgraph = True
    _no_split_modules = ["VanillaTransformerEncoderLayer", "VanillaTransformerDecoderLayer"]

    def _init_weights(self, module: nn.Module) -> None:  # once per leaf module with parameters of its own
        init_module_weights(self.config, module, getattr(self, "lm_head", None))


class _VanillaTransformerStack(VanillaTransformerPreTrainedModel):
    """What both stacks share: token embedding times sqrt(d_model) plus positions, then dropout (§3.4, §3.5, §5.4)."""

    def __init__(self, config: VanillaTransformerConfig, embed_tokens: nn.Embedding | None):
        super().__init__(config)
        self.dropout = config.dropout
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.embed_tokens = (
            embed_tokens if embed_tokens is not None else nn.Embedding(config.vocab_size, config.d_model)
        )
        self.embed_positions = (
            nn.Embedding(config.max_position_embeddings, config.d_model)
            if config.position_embedding_type == "learned"
            else None
        )
        # Pre-LN needs a LayerNorm on the output of the stack; the paper's post-LN has none.
        self.layer_norm = (
            VanillaTransformerLayerNorm(config.d_model, eps=config.layer_norm_eps) if config.pre_layer_norm else None
        )

    def embed(
        self, input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor | None, start: int | torch.Tensor = 0
    ) -> torch.Tensor:
        """Dropout(E[ids] * sqrt(d_model) + PE[start : start + L]); `inputs_embeds` replaces E[ids] if given.

        `start` is the cached target length: an int, or a 0-d tensor for a static cache (so that a compiled decoding
        step does not recompile at every position)."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of input_ids and inputs_embeds.")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        inputs_embeds = inputs_embeds * self.embed_scale  # (B, L, D)
        length = inputs_embeds.shape[1]
        positions = token_positions(self.config, length, start, inputs_embeds.device)  # (L,)
        if self.embed_positions is None:
            position_embeds = sinusoidal_positions(positions, self.config.d_model, self.config.sinusoid_layout)
        else:
            check_positions(self.config, start, length)
            position_embeds = self.embed_positions(positions)
        hidden_states = inputs_embeds + position_embeds.to(inputs_embeds.dtype)
        return nn.functional.dropout(hidden_states, p=self.dropout, training=self.training)


class VanillaTransformerEncoder(_VanillaTransformerStack):
    """Encoder stack, §3.1: N identical layers over the embedded source."""

    _can_record_outputs = {
        "hidden_states": VanillaTransformerEncoderLayer,
        "attentions": VanillaTransformerAttention,
    }

    def __init__(self, config: VanillaTransformerConfig, embed_tokens: nn.Embedding | None = None):
        super().__init__(config, embed_tokens)
        layer = VanillaTransformerPreLNEncoderLayer if config.pre_layer_norm else VanillaTransformerEncoderLayer
        self.layers = nn.ModuleList([layer(config) for _ in range(config.encoder_layers)])
        self.gradient_checkpointing = False
        self.post_init()

    @merge_with_config_defaults
    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutput:
        if input_ids is not None and _eager():
            _check_ids("input_ids", input_ids, self.config.encoder_vocab_size())
        hidden_states = self.embed(input_ids, inputs_embeds)  # (B, S, D)
        _check_mask("attention_mask", attention_mask, tuple(hidden_states.shape[:2]))

        # The padding skip: padding is never attended to, so its FFN is skipped.
        token_index = real_token_index(attention_mask)
        attention_mask = create_bidirectional_mask(  # (no "all real tokens?" shortcut where it would read the host)
            config=self.config,
            inputs_embeds=hidden_states,
            attention_mask=attention_mask,
            allow_is_bidirectional_skip=_eager(),
        )
        for layer in self.layers:
            hidden_states = layer(hidden_states, attention_mask, token_index=token_index, **kwargs)
        if self.layer_norm is not None:
            hidden_states = self.layer_norm(hidden_states)
        return BaseModelOutput(last_hidden_state=hidden_states)


class VanillaTransformerDecoder(_VanillaTransformerStack):
    """Decoder stack, §3.1: N identical layers over the embedded, right-shifted target and the encoder output."""

    _can_record_outputs = {
        "hidden_states": VanillaTransformerDecoderLayer,
        "attentions": OutputRecorder(VanillaTransformerAttention, index=1, layer_name="self_attn"),
        "cross_attentions": OutputRecorder(VanillaTransformerAttention, index=1, layer_name="encoder_attn"),
    }

    def __init__(self, config: VanillaTransformerConfig, embed_tokens: nn.Embedding | None = None):
        super().__init__(config, embed_tokens)
        layer = VanillaTransformerPreLNDecoderLayer if config.pre_layer_norm else VanillaTransformerDecoderLayer
        self.layers = nn.ModuleList([layer(config, layer_idx=i) for i in range(config.decoder_layers)])
        self.gradient_checkpointing = False
        self.post_init()

    @merge_with_config_defaults
    @capture_outputs
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        token_mask: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutputWithPastAndCrossAttentions:
        r"""
        token_mask (`torch.BoolTensor` of shape `(batch_size, target_length)`, *optional*):
            The positions whose outputs are needed (set from the labels): the FFN skips the positions after a
            sentence's last needed one, whose outputs are then not the dense ones (padding_vanilla_transformer.py).
        """
        if encoder_hidden_states is None:
            raise ValueError("The decoder needs encoder_hidden_states: the output of the encoder.")
        cache, past_length = open_cache(cache, use_cache)  # past_length: the cached target length
        check_decoder_inputs(
            self.config,
            input_ids,
            inputs_embeds,
            attention_mask,
            encoder_hidden_states,
            encoder_attention_mask,
            past_length,
        )

        # 1. Target embeddings at positions past_length .. past_length + T - 1: a step at position t uses PE(t).
        hidden_states = self.embed(input_ids, inputs_embeds, start=past_length)  # (B, T, D)

        # 2. Masks: causal (+ target padding) for self-attention, source padding for cross-attention.
        causal_mask, encoder_attention_mask = decoder_masks(
            self.config, hidden_states, attention_mask, cache, encoder_hidden_states, encoder_attention_mask, _eager()
        )

        # 3. The layers. The padding skip: the FFN skips positions no needed position can see.
        token_index = None
        if is_first_pass(past_length) and hidden_states.shape[1] > 1:
            token_index = decoder_token_index(token_mask, attention_mask, tuple(hidden_states.shape[:2]))
        for layer in self.layers:
            hidden_states = layer(
                hidden_states,
                causal_mask,
                encoder_hidden_states,  # positional, for gradient checkpointing
                encoder_attention_mask=encoder_attention_mask,
                cache=cache,
                token_index=token_index,
                **kwargs,
            )
        if self.layer_norm is not None:
            hidden_states = self.layer_norm(hidden_states)
        return BaseModelOutputWithPastAndCrossAttentions(
            last_hidden_state=hidden_states, cache=cache if use_cache else None
        )


# --- Encoder-decoder -------------------------------------------------------------------------------------------------


class VanillaTransformerModel(VanillaTransformerPreTrainedModel):
    """The encoder-decoder of §3 without the output projection; `shared` is the one embedding matrix (§3.4)."""

    _tied_weights_keys = {
        "encoder.embed_tokens.weight": "shared.weight",
        "decoder.embed_tokens.weight": "shared.weight",
    }
    _input_embed_layer = "shared"  # get_input_embeddings; transformers finds encoder, decoder, lm_head by name

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config)
        self.shared = nn.Embedding(config.vocab_size, config.d_model)
        # Not the paper: with `source_vocab_size` the source has a vocabulary and embedding of its own (fairseq).
        source = (
            nn.Embedding(config.source_vocab_size, config.d_model)
            if config.source_vocab_size is not None
            else self.shared
        )
        self.encoder = VanillaTransformerEncoder(config, source)
        self.decoder = VanillaTransformerDecoder(config, self.shared)
        self.post_init()

    @can_return_tuple
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        decoder_token_mask: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> Seq2SeqModelOutput:
        r"""
        decoder_token_mask (`torch.BoolTensor` of shape `(batch_size, target_length)`, *optional*):
            The target positions whose outputs are needed (see `VanillaTransformerDecoder.forward`'s `token_mask`).

        Returns a `Seq2SeqModelOutput`, or its `to_tuple()` with `return_dict=False` (per call or in the config).
        """
        # The stacks return ModelOutputs here whatever `config.return_dict` says; `can_return_tuple` makes the tuple.
        # 1. Encode, unless generate() already did.
        if encoder_outputs is None:
            encoder_outputs = self.encoder(
                input_ids=input_ids,
                attention_mask=attention_mask,
                inputs_embeds=inputs_embeds,
                return_dict=True,
                **kwargs,
            )
        else:
            encoder_outputs = as_encoder_output(encoder_outputs)  # a tuple from return_dict=False
        # 2. Decode with cross-attention over the top encoder layer.
        decoder_outputs = self.decoder(
            input_ids=decoder_input_ids,
            attention_mask=decoder_attention_mask,
            encoder_hidden_states=encoder_outputs.last_hidden_state,
            encoder_attention_mask=attention_mask,
            cache=cache,
            inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            token_mask=decoder_token_mask,
            return_dict=True,
            **kwargs,
        )
        return Seq2SeqModelOutput(
            last_hidden_state=decoder_outputs.last_hidden_state,
            cache=decoder_outputs.cache,
            decoder_hidden_states=decoder_outputs.hidden_states,
            decoder_attentions=decoder_outputs.attentions,
            cross_attentions=decoder_outputs.cross_attentions,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions,
        )


class VanillaTransformerForConditionalGeneration(VanillaTransformerPreTrainedModel, VanillaTransformerGenerationMixin):
    """The Transformer for translation: encoder-decoder, output projection tied to the embeddings, softmax (§3.4).

    `generate()` decodes as §6.1 by default (`VanillaTransformerGenerationMixin`, in decoding_vanilla_transformer.py).
    """

    _tied_weights_keys = {
        "lm_head.weight": "model.shared.weight",
        "model.encoder.embed_tokens.weight": "model.shared.weight",
        "model.decoder.embed_tokens.weight": "model.shared.weight",
    }
    _input_embed_layer = "shared"  # found in self.model

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__(config)
        self.model = VanillaTransformerModel(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=config.output_bias)  # bias: not the paper
        self.post_init()
        self.generation_config = default_generation_config(config)

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)

    @can_return_tuple
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> Seq2SeqLMOutput:
        r"""
        labels (`torch.LongTensor` of shape `(batch_size, target_length)`, *optional*):
            Target token ids ending with `</s>`; -100 (and `pad_token_id`, unless it is also `eos_token_id`) marks
            positions left out of the loss. Without `decoder_input_ids` the decoder reads the labels shifted right.
            In training mode the output projection runs only on the labelled positions and `logits` is `None`;
            in eval mode (or without labels) the full `(batch, target_length, vocab)` logits are returned.

        Returns a `Seq2SeqLMOutput`, or its `to_tuple()` with `return_dict=False` (per call or in the config).
        """
        num_items_in_batch = kwargs.pop("num_items_in_batch", None)
        if labels is not None:
            config = self.config
            labels = loss_labels(labels, config.vocab_size, config.pad_token_id, config.eos_token_id)  # padding: -100
            use_cache = False
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)

        outputs = self.model(
            input_ids,
            attention_mask=attention_mask,
            decoder_token_mask=labels != -100 if labels is not None else None,  # the positions that count
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            encoder_outputs=encoder_outputs,
            cache=cache,
            inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            return_dict=True,
            **kwargs,
        )
        # The output projection and softmax (§3.4) with the label-smoothed loss (§5.4): training projects only the
        # labelled positions and returns no logits (loss_vanilla_transformer.py).
        loss, logits = project_and_score(
            outputs.last_hidden_state,
            self.lm_head,
            labels,
            self.config.label_smoothing,
            num_items_in_batch,
            self.training,
        )

        # Every field of the model's output but the top decoder states, which the logits replace.
        fields = {name: value for name, value in outputs.items() if name != "last_hidden_state"}
        return Seq2SeqLMOutput(loss=loss, logits=logits, **fields)


__all__ = [
    "VanillaTransformerAttention",
    "VanillaTransformerDecoderLayer",
    "VanillaTransformerEncoderLayer",
    "VanillaTransformerFeedForward",
    "VanillaTransformerForConditionalGeneration",
    "VanillaTransformerModel",
    "VanillaTransformerPreTrainedModel",
    "eager_attention_forward",
    "shift_tokens_right",
    "sinusoidal_positions",
    "token_positions",
]
