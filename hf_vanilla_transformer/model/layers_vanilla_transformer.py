"""The layers of the original Transformer (Vaswani et al. 2017): sinusoidal positions (§3.5), multi-head attention
(§3.2), the position-wise FFN (§3.3), and the post-LN encoder and decoder layers (§3.1) with their pre-LN variants;
`modeling_vanilla_transformer.py` stacks them into the model. A remote-code file: relative imports only.

Shape legend: B batch, S source length, T target length (new tokens), P cached target length, H heads,
D d_model, Dk / Dv per-head query-key / value size, F FFN inner size, V vocabulary.
"""

import math
from collections.abc import Callable

import torch
from torch import nn
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs

from .cache_vanilla_transformer import attention_keys_values
from .configuration_vanilla_transformer import VanillaTransformerConfig
from .padding_vanilla_transformer import positionwise
from .precision_vanilla_transformer import VanillaTransformerLayerNorm
from .prenorm_vanilla_transformer import PreLNDecoderLayerForward, PreLNEncoderLayerForward


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
