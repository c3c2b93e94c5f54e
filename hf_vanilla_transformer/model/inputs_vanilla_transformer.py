"""Input checks of the Vanilla Transformer, and where they step aside.

Every check names the received value and what was expected. The checks read tensor values on the host, so under
`torch.compile` and inside `without_host_reads()` (`_eager()` is False) they step aside: `generate()` checks its
inputs once per call, outside the compiled decoding step. Imported relatively by the modeling file, and copied beside
it by `save_pretrained`.
"""

from contextlib import contextmanager
from contextvars import ContextVar

import torch
from transformers.modeling_outputs import BaseModelOutput
from transformers.utils import ModelOutput

from .cache_vanilla_transformer import is_first_pass


_HOST_READS = ContextVar("host_reads", default=True)


@contextmanager
def without_host_reads():
    """Within the block the model reads no tensor value on the host, as under `torch.compile`: the input checks and
    the padding skip step aside and the dense computation gives the same outputs. On a GPU each such read waits for
    every queued kernel (a synchronisation), and the queue then runs dry while the host catches up: training on CUDA
    runs inside this block (data from the package's own tokenizer needs no check)."""
    token = _HOST_READS.set(False)
    try:
        yield
    finally:
        _HOST_READS.reset(token)


def _eager() -> bool:
    """False while `torch.compile` traces the model, and inside `without_host_reads()`. The input checks and the
    padding skip read tensor values on the host, which a compiled graph cannot do without breaking; there they step
    aside: the dense computation gives the same outputs, and `generate()` checks its inputs once per call, outside the
    compiled decoding step."""
    return not torch.compiler.is_compiling() and _HOST_READS.get()


def _check_ids(name: str, ids: torch.Tensor, vocab_size: int, allow: tuple[int, ...] = ()) -> None:
    """Raise a ValueError naming `name` when `ids` is empty, not 2-D, or holds an id outside [0, vocab_size)."""
    if ids.dim() != 2:
        raise ValueError(f"{name} must have shape (batch, length); got shape {tuple(ids.shape)}.")
    if ids.numel() == 0:
        raise ValueError(
            f"{name} is empty (shape {tuple(ids.shape)}); expected at least one sequence of at least one token."
        )
    if ids.is_floating_point():
        raise ValueError(f"{name} must hold integer token ids; got dtype {ids.dtype}.")
    bad = (ids < 0) | (ids >= vocab_size)
    for value in allow:
        bad &= ids != value
    if bad.any():
        value = ids[bad][0].item()
        raise ValueError(f"{name} holds token id {value}, outside the vocabulary [0, {vocab_size}).")


def _check_mask(name: str, mask: torch.Tensor | None, expected: tuple[int, ...]) -> None:
    """Raise a ValueError naming `name` when a 2-D padding mask does not have the `expected` shape (4-D masks and
    flex attention's BlockMask, which generate() builds for a static cache, pass as they are)."""
    if isinstance(mask, torch.Tensor) and mask.dim() == 2 and tuple(mask.shape) != expected:
        raise ValueError(f"{name} has shape {tuple(mask.shape)}; expected {expected} to match the token ids.")


def check_decoder_inputs(
    config, input_ids, inputs_embeds, attention_mask, encoder_hidden_states, encoder_attention_mask, past_length
):
    """The decoder's checks, outside `torch.compile`: its ids (a user's prompt or a training batch; not the single
    token `generate()` feeds back at each later step), and its masks against the target and the encoder output."""
    if not _eager():
        return
    if input_ids is not None and (is_first_pass(past_length) or input_ids.shape[-1] > 1):
        _check_ids("decoder_input_ids", input_ids, config.vocab_size)
    target = input_ids if input_ids is not None else inputs_embeds
    if target is not None:
        expected = (target.shape[0], int(past_length) + target.shape[1])
        _check_mask("decoder_attention_mask", attention_mask, expected)
    _check_mask("attention_mask", encoder_attention_mask, tuple(encoder_hidden_states.shape[:2]))


def check_positions(config, start: int | torch.Tensor, length: int) -> None:
    """Learned positions (not the paper's sinusoids) have a table of `max_position_embeddings`: name a longer input."""
    if _eager() and int(start) + length > config.max_position_embeddings:
        raise ValueError(
            f"Sequence of {int(start) + length} positions is longer than max_position_embeddings="
            f"{config.max_position_embeddings} of the learned positions; use sinusoidal positions (no limit) or a "
            "larger max_position_embeddings."
        )


def as_encoder_output(encoder_outputs) -> BaseModelOutput:
    """`encoder_outputs` as given to the model's forward: a `BaseModelOutput`, another `ModelOutput` with a
    `last_hidden_state`, or the tuple of `return_dict=False`: (last_hidden_state, [hidden_states, [attentions]])."""
    if isinstance(encoder_outputs, BaseModelOutput):
        return encoder_outputs
    if isinstance(encoder_outputs, ModelOutput) and encoder_outputs.get("last_hidden_state") is not None:
        return BaseModelOutput(
            last_hidden_state=encoder_outputs["last_hidden_state"],
            hidden_states=encoder_outputs.get("hidden_states"),
            attentions=encoder_outputs.get("attentions"),
        )
    if not isinstance(encoder_outputs, (tuple, list)) or not encoder_outputs:
        raise ValueError(
            "encoder_outputs must be a BaseModelOutput or a tuple (last_hidden_state, [hidden_states, [attentions]]); "
            f"got {type(encoder_outputs).__name__}."
        )
    return BaseModelOutput(*encoder_outputs[:3])
