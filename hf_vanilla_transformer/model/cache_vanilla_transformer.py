"""The decoder's state between decoding steps and its attention masks, through transformers' machinery.

Not in the paper, which describes the computation of one forward pass: `generate()` runs the decoder one token at a
time and keeps what earlier steps computed in an `EncoderDecoderCache` (a dynamic one, or a static one that
`torch.compile` can trace), and the masks of §3.2.3 are built by `transformers.masking_utils` so that every attention
backend (eager, SDPA, flash, flex) gets the form it reads. Imported relatively by the modeling file, and copied beside
it by `save_pretrained`.
"""

import torch
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask


def open_cache(cache: Cache | None, use_cache: bool | None) -> tuple[Cache | None, int | torch.Tensor]:
    """The decoder call's cache (a new dynamic one when `use_cache` asks for one and none is given) and the target
    length it already holds: an int, or a 0-d tensor once a static cache holds something (so that a compiled decoding
    step does not recompile at every position)."""
    if use_cache and cache is None:
        cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
    return cache, cache.get_seq_length() if cache is not None else 0


def is_first_pass(past_length: int | torch.Tensor) -> bool:
    """True when nothing is cached yet: training, scoring, or the first step of `generate()`."""
    return not torch.is_tensor(past_length) and past_length == 0


def attention_keys_values(
    attention, hidden_states: torch.Tensor, key_value_states: torch.Tensor | None, cache: Cache | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys (B, H, L, Dk) and values (B, H, L, Dv) of one attention module (`_project_keys_values`) with the cache.

    Self-attention appends this step's keys and values to the cache and attends over all of them (L = P + T).
    Cross-attention projects the encoder output once per `generate()` call and reads it back at every later step.
    """
    layer_idx = attention.layer_idx
    if not attention.is_cross_attention:
        key, value = attention._project_keys_values(hidden_states)
        if cache is None:
            return key, value
        stored = cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache
        return stored.update(key, value, layer_idx)
    stored = cache.cross_attention_cache if cache is not None else None
    if stored is not None and cache.is_updated.get(layer_idx):
        return stored.layers[layer_idx].keys, stored.layers[layer_idx].values
    key, value = attention._project_keys_values(key_value_states)
    if stored is not None:
        key, value = stored.update(key, value, layer_idx)
        cache.is_updated[layer_idx] = True
    return key, value


def decoder_masks(
    config,
    hidden_states: torch.Tensor,
    attention_mask: torch.Tensor | None,
    cache: Cache | None,
    encoder_hidden_states: torch.Tensor,
    encoder_attention_mask: torch.Tensor | None,
    shortcut: bool = True,
) -> tuple:
    """The decoder's two masks in the configured backend's form: causal (position i sees the cached positions and
    positions <= i, §3.2.3) plus target padding for self-attention; source padding for cross-attention. Without the
    `shortcut` (host reads off: a CUDA update), the masks are built even where every token is real: transformers'
    shortcut asks the host whether they are (`padding_mask.all()`), which waits for the GPU."""
    self_attention_cache = cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache
    causal_mask = create_causal_mask(
        config=config,
        inputs_embeds=hidden_states,
        attention_mask=attention_mask,
        cache=self_attention_cache,
        allow_is_causal_skip=shortcut,
    )
    cross_mask = create_bidirectional_mask(
        config=config,
        inputs_embeds=hidden_states,
        attention_mask=encoder_attention_mask,
        encoder_hidden_states=encoder_hidden_states,
        allow_is_bidirectional_skip=shortcut,
    )
    return causal_mask, cross_mask
