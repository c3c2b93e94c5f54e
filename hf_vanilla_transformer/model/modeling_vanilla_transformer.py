"""The original Transformer (Vaswani et al. 2017, "Attention Is All You Need") as a Hugging Face model.

Post-LN encoder-decoder (§3.1), multi-head attention (§3.2), position-wise FFN (§3.3), one embedding matrix shared
by encoder input, decoder input and output projection, scaled by sqrt(d_model) (§3.4), sinusoidal positions
computed for any length (§3.5), dropout as in §5.4 and label-smoothed loss (§5.4).

What the paper describes lives here; what it does not (the loss, the §6.1 decoding rules, input checks, the padding
skip, the pre-LN variant, the tied-weight bookkeeping, the decoding cache and masks, LayerNorm under CPU autocast,
the initialisation) lives in the sibling `*_vanilla_transformer.py` files (docs/layout.md), imported relatively, so
`save_pretrained` copies them and the folder loads with `trust_remote_code=True` without this package.

Shape legend: B batch, S source length, T target length (new tokens), P cached target length, H heads,
D d_model, Dk / Dv per-head query-key / value size, F FFN inner size, V vocabulary.
"""

import math
from collections.abc import Callable

import torch
from torch import nn
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache
from transformers.masking_utils import create_bidirectional_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithPastAndCrossAttentions,
    Seq2SeqLMOutput,
    Seq2SeqModelOutput,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, PreTrainedModel
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs, can_return_tuple
from transformers.utils.deprecation import deprecate_kwarg
from transformers.utils.generic import merge_with_config_defaults
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from .cache_vanilla_transformer import attention_keys_values, decoder_masks, is_first_pass, open_cache
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
from .loss_vanilla_transformer import loss_labels, project_and_score, shift_tokens_right
from .padding_vanilla_transformer import decoder_token_index, positionwise, real_token_index
from .precision_vanilla_transformer import VanillaTransformerLayerNorm
from .prenorm_vanilla_transformer import PreLNDecoderLayerForward, PreLNEncoderLayerForward
from .tying_vanilla_transformer import SharedEmbeddingTyingMixin, init_module_weights


# --- Positions (§3.5) ------------------------------------------------------------------------------------------------


def sinusoidal_positions(positions: torch.Tensor, dim: int, layout: str = "interleaved") -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/dim)), PE(pos, 2i+1) = cos(pos / 10000^(2i/dim)), in float32 (§3.5).

    `positions` holds any integer positions, shape (...,); the result has shape (..., dim). `layout="interleaved"`
    puts sin and cos side by side as in the paper; `"concat"` puts all sines first, then all cosines (Marian's
    layout, with the paper's frequencies). Not the paper: `"fairseq"` is `"concat"` with the frequencies
    10000^(-i / (dim/2 - 1)) of fairseq and tensor2tensor (its positions start at padding id + 1:
    `token_positions`). Nothing is tabulated, so there is no length limit and nothing to store in a checkpoint.

    The paper's sinusoids are computed in float64, then rounded to float32, as Marian tabulates them
    (transformers' `MarianSinusoidalPositionalEmbedding`): in float32 the angle pos / 10000^(2i/dim) is off by up to
    pos * 6e-8, so position 500 would be 3e-5 from Marian's. fairseq computes its own in float32, and so do these.
    """
    half = (dim + 1) // 2
    if layout == "fairseq":  # fairseq's own expression of its frequencies, so that the two tables agree to the bit
        indices = torch.arange(half, device=positions.device, dtype=torch.float32)
        inv_freq = torch.exp(indices * -(math.log(10000.0) / (dim // 2 - 1)))  # (dim/2,)
        angles = positions.to(torch.float32)[..., None] * inv_freq  # (..., dim/2)
    else:
        exact = torch.float32 if positions.device.type == "mps" else torch.float64  # MPS has no float64
        indices = torch.arange(half, device=positions.device, dtype=exact)
        angles = positions.to(exact)[..., None] / torch.pow(10000.0, indices * (2.0 / dim))  # (..., dim/2)
    sines, cosines = angles.sin().float(), angles.cos().float()
    if layout == "interleaved":
        return torch.stack((sines, cosines), dim=-1).flatten(-2)[..., :dim]
    return torch.cat((sines, cosines[..., : dim // 2]), dim=-1)


def token_positions(config: VanillaTransformerConfig, length: int, start, device) -> torch.Tensor:
    """The positions of the tokens start .. start + length - 1 (L,): themselves (§3.5), or for fairseq's sinusoids
    shifted by pad_token_id + 1, where fairseq starts counting (real tokens; it gives padding a zero vector)."""
    fairseq = config.sinusoid_layout == "fairseq" and config.position_embedding_type == "sinusoidal"
    offset = config.pad_token_id + 1 if fairseq else 0
    return torch.arange(length, device=device) + start + offset


# --- Attention (§3.2) ------------------------------------------------------------------------------------------------


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(Q K^T / sqrt(d_k)) V written out (eq. 1), returning the attention weights too.

    Scores, mask and softmax are computed in float32 so that neither fp16 nor bf16 can overflow, and a query row
    with no key to attend to (a source made only of padding) gets zero weights, as SDPA gives it.
    """
    # query: (B, H, Tq, Dk), key: (B, H, Tk, Dk), value: (B, H, Tk, Dv)
    scores = torch.matmul(query, key.transpose(2, 3)).float() * scaling  # (B, H, Tq, Tk)
    keep = None
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            keep = attention_mask
            scores = scores.masked_fill(~keep, torch.finfo(torch.float32).min)
        else:
            mask = attention_mask[:, :, :, : key.shape[-2]].float()
            keep = mask > torch.finfo(attention_mask.dtype).min / 2
            scores = scores + mask
    weights = torch.softmax(scores, dim=-1)
    if keep is not None:
        weights = weights * keep.any(dim=-1, keepdim=True)
    weights = nn.functional.dropout(weights, p=dropout, training=module.training).to(value.dtype)
    attn_output = torch.matmul(weights, value).transpose(1, 2).contiguous()  # (B, Tq, H, Dv)
    return attn_output, weights


class VanillaTransformerAttention(nn.Module):
    """Multi-head attention, §3.2.2: Concat(head_1..head_h) W^O with head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V).

    Used three ways (§3.2.3): encoder self-attention, masked decoder self-attention (`is_causal=True`) and
    encoder-decoder attention (`is_cross_attention=True`, keys and values from the top encoder layer).
    """

    def __init__(
        self,
        config: VanillaTransformerConfig,
        num_heads: int,
        is_causal: bool = False,
        is_cross_attention: bool = False,
        layer_idx: int | None = None,
    ):
        super().__init__()
        self.config = config
        self.num_heads = num_heads
        self.head_dim, self.value_head_dim = config.head_dims(num_heads)
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        self.is_causal = is_causal
        self.is_cross_attention = is_cross_attention
        self.layer_idx = layer_idx

        self.q_proj = nn.Linear(config.d_model, num_heads * self.head_dim)
        self.k_proj = nn.Linear(config.d_model, num_heads * self.head_dim)
        self.v_proj = nn.Linear(config.d_model, num_heads * self.value_head_dim)
        self.out_proj = nn.Linear(num_heads * self.value_head_dim, config.d_model)
        for proj in (self.q_proj, self.k_proj, self.v_proj):
            proj.xavier_gain = 2**-0.5  # read by init_module_weights

    def _project_keys_values(self, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, L, D) -> keys (B, H, L, Dk) and values (B, H, L, Dv)."""
        batch, length = states.shape[:2]
        keys = self.k_proj(states).view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)
        values = self.v_proj(states).view(batch, length, self.num_heads, self.value_head_dim).transpose(1, 2)
        return keys, values

    def forward(
        self,
        hidden_states: torch.Tensor,
        key_value_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        batch, length = hidden_states.shape[:2]
        query = self.q_proj(hidden_states).view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)

        # 1. Keys and values, through the cache when decoding step by step (cache_vanilla_transformer.py).
        key, value = attention_keys_values(self, hidden_states, key_value_states, cache)  # (B, H, L, Dk), (B, H, L, Dv)

        # 2. Scaled dot-product attention through the configured backend (eager, sdpa, flash_attention_2).
        attention_interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        attn_output, attn_weights = attention_interface(
            self,
            query,
            key,
            value,
            attention_mask,
            dropout=self.attention_dropout if self.training else 0.0,
            scaling=self.scaling,
            **kwargs,
        )
        # 3. Concatenate the heads and apply W^O.
        attn_output = attn_output.reshape(batch, length, self.num_heads * self.value_head_dim)  # (B, T, H*Dv)
        return self.out_proj(attn_output), attn_weights


# --- Layers (§3.1, §3.3, §5.4) ---------------------------------------------------------------------------------------


class VanillaTransformerFeedForward(nn.Module):
    """Position-wise feed-forward network, §3.3: FFN(x) = max(0, x W1 + b1) W2 + b2."""

    def __init__(self, config: VanillaTransformerConfig, ffn_dim: int):
        super().__init__()
        self.fc1 = nn.Linear(config.d_model, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, config.d_model)
        self.activation_fn = ACT2FN[config.activation_function]
        self.activation_dropout = config.activation_dropout

    def forward(self, hidden_states: torch.Tensor, token_index: torch.Tensor | None = None) -> torch.Tensor:
        """FFN of every position of `hidden_states` (B, L, D), or only of those in `token_index` (the padding skip,
        padding_vanilla_transformer.py)."""
        return positionwise(self._ffn, hidden_states, token_index)

    def _ffn(self, hidden_states: torch.Tensor) -> torch.Tensor:
        hidden_states = self.activation_fn(self.fc1(hidden_states))  # (..., F)
        hidden_states = nn.functional.dropout(hidden_states, p=self.activation_dropout, training=self.training)
        return self.fc2(hidden_states)  # (..., D)


class VanillaTransformerEncoderLayer(GradientCheckpointingLayer):
    """Encoder layer, §3.1: self-attention, then FFN, each wrapped as LayerNorm(x + Dropout(Sublayer(x))) (§5.4)."""

    def __init__(self, config: VanillaTransformerConfig):
        super().__init__()
        self.dropout = config.dropout
        self.self_attn = VanillaTransformerAttention(config, config.encoder_attention_heads)
        self.self_attn_layer_norm = VanillaTransformerLayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.ffn = VanillaTransformerFeedForward(config, config.encoder_ffn_dim)
        self.final_layer_norm = VanillaTransformerLayerNorm(config.d_model, eps=config.layer_norm_eps)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_index: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> torch.Tensor:
        # 1. Self-attention sub-layer: LayerNorm(x + Dropout(SelfAttention(x))).
        residual = hidden_states
        hidden_states, _ = self.self_attn(hidden_states, attention_mask=attention_mask, **kwargs)
        hidden_states = nn.functional.dropout(hidden_states, p=self.dropout, training=self.training)
        hidden_states = self.self_attn_layer_norm(residual + hidden_states)

        # 2. Feed-forward sub-layer: LayerNorm(x + Dropout(FFN(x))).
        residual = hidden_states
        hidden_states = self.ffn(hidden_states, token_index)
        hidden_states = nn.functional.dropout(hidden_states, p=self.dropout, training=self.training)
        hidden_states = self.final_layer_norm(residual + hidden_states)
        return hidden_states  # (B, S, D)


class VanillaTransformerDecoderLayer(GradientCheckpointingLayer):
    """Decoder layer, §3.1: masked self-attention, encoder-decoder attention, FFN; each sub-layer post-LN (§5.4)."""

    def __init__(self, config: VanillaTransformerConfig, layer_idx: int):
        super().__init__()
        self.dropout = config.dropout
        heads = config.decoder_attention_heads
        self.self_attn = VanillaTransformerAttention(config, heads, is_causal=True, layer_idx=layer_idx)
        self.self_attn_layer_norm = VanillaTransformerLayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.encoder_attn = VanillaTransformerAttention(config, heads, is_cross_attention=True, layer_idx=layer_idx)
        self.encoder_attn_layer_norm = VanillaTransformerLayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.ffn = VanillaTransformerFeedForward(config, config.decoder_ffn_dim)
        self.final_layer_norm = VanillaTransformerLayerNorm(config.d_model, eps=config.layer_norm_eps)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        token_index: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> torch.Tensor:
        # 1. Masked self-attention sub-layer: position i sees positions <= i (§3.2.3).
        residual = hidden_states
        hidden_states, _ = self.self_attn(hidden_states, attention_mask=attention_mask, cache=cache, **kwargs)
        hidden_states = nn.functional.dropout(hidden_states, p=self.dropout, training=self.training)
        hidden_states = self.self_attn_layer_norm(residual + hidden_states)

        # 2. Encoder-decoder attention sub-layer: queries from the decoder, keys and values from the encoder.
        residual = hidden_states
        hidden_states, _ = self.encoder_attn(
            hidden_states, encoder_hidden_states, encoder_attention_mask, cache=cache, **kwargs
        )
        hidden_states = nn.functional.dropout(hidden_states, p=self.dropout, training=self.training)
        hidden_states = self.encoder_attn_layer_norm(residual + hidden_states)

        # 3. Feed-forward sub-layer.
        residual = hidden_states
        hidden_states = self.ffn(hidden_states, token_index)
        hidden_states = nn.functional.dropout(hidden_states, p=self.dropout, training=self.training)
        hidden_states = self.final_layer_norm(residual + hidden_states)
        return hidden_states  # (B, T, D)


class VanillaTransformerPreLNEncoderLayer(PreLNEncoderLayerForward, VanillaTransformerEncoderLayer):
    """Not the paper: `config.pre_layer_norm`, the same parameters wired pre-LN (prenorm_vanilla_transformer.py)."""


class VanillaTransformerPreLNDecoderLayer(PreLNDecoderLayerForward, VanillaTransformerDecoderLayer):
    """Not the paper: `config.pre_layer_norm`, the same parameters wired pre-LN (prenorm_vanilla_transformer.py)."""


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
    "VanillaTransformerForConditionalGeneration",
    "VanillaTransformerModel",
    "VanillaTransformerPreTrainedModel",
    "shift_tokens_right",
    "sinusoidal_positions",
]
