"""The padding skip: not in the paper, and changing no output that is used.

A batch of sentences of different lengths is padded to its longest one. Attention never looks at padding (the masks
see to that), but the position-wise sub-layer (the FFN, §3.3) would still compute every padded position. Here it
computes only the positions that some needed output can depend on, and gives the others zeros:

* in the encoder, the real source tokens (the 2-D `attention_mask`);
* in the decoder's first pass, the positions up to each sentence's last labelled one (under the causal mask no
  labelled position sees a later one), or the real target tokens of a 2-D `decoder_attention_mask`.

Under `torch.compile` the index of real positions has a data-dependent size, so the skip steps aside there and the
dense path computes the same outputs. Imported relatively by the modeling file, and copied beside it by
`save_pretrained`.
"""

from collections.abc import Callable

import torch

from .inputs_vanilla_transformer import _check_mask, _eager


def real_token_index(keep) -> torch.Tensor | None:
    """Flat indices into B * L of the positions to compute, from a (B, L) mask of them (nonzero: compute); None when
    there is nothing to skip (no 2-D mask: none, a 4-D one, or flex attention's BlockMask; no padding) and under
    `torch.compile`, which keeps the dense path."""
    if not isinstance(keep, torch.Tensor) or keep.dim() != 2 or not _eager():
        return None
    keep = keep.bool()
    if bool(keep.all()):
        return None
    return keep.reshape(-1).nonzero().squeeze(1)


def decoder_token_index(
    token_mask: torch.Tensor | None, attention_mask: torch.Tensor | None, shape: tuple[int, int]
) -> torch.Tensor | None:
    """The decoder's real positions in a first pass over `shape` = (B, T): those up to each sentence's last needed
    position of `token_mask` (the labelled ones), else those a 2-D `attention_mask` keeps."""
    if token_mask is not None:
        _check_mask("token_mask", token_mask, shape)
        return real_token_index(token_mask.bool().flip(1).cummax(1).values.flip(1))
    return real_token_index(attention_mask)


def positionwise(
    sublayer: Callable[[torch.Tensor], torch.Tensor], hidden_states: torch.Tensor, token_index: torch.Tensor | None
) -> torch.Tensor:
    """`sublayer` of every position of `hidden_states` (B, L, D), or with `token_index` of those positions only: the
    others get zeros and cost nothing. A position-wise sub-layer gives the positions it computes exactly what the
    full computation gives them."""
    if token_index is None:
        return sublayer(hidden_states)
    batch, length, _ = hidden_states.shape
    tokens = sublayer(hidden_states.reshape(batch * length, -1).index_select(0, token_index))  # (N, D)
    output = tokens.new_zeros(batch * length, tokens.shape[-1]).index_copy(0, token_index, tokens)
    return output.view(batch, length, -1)
