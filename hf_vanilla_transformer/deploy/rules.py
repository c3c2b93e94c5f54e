"""What every export shares: the file that records an export's facts beside the engine's own files, and the model's
decoding rules as the exports record and apply them (the beams, the length penalty α and its form, early stopping,
the relative length limit of §6.1). The rules themselves live with the model (`model/decoding_vanilla_transformer.py`);
this file reads them."""

from __future__ import annotations

from ..model.decoding_vanilla_transformer import LENGTH_PENALTY_TYPES, RELATIVE_MAX_LENGTH


EXPORT_INFO = "hf_vanilla_transformer_export.json"  # what an export holds that the engine's files do not say
PENALTY_NAMES = dict(
    zip(LENGTH_PENALTY_TYPES, ("GNMT's ((5 + |Y|) / 6)^alpha", "transformers' |Y|^alpha"), strict=True)
)
EARLY_STOPPING = (True, False, "never")


def recorded_decoding(generation) -> dict:
    """The decoding rules of a `GenerationConfig` that the search follows, unset values as generate() reads them
    (alpha 1.0, transformers' |Y|^alpha penalty, no early stopping)."""
    return {
        "num_beams": generation.num_beams,
        "length_penalty": 1.0 if generation.length_penalty is None else generation.length_penalty,
        "length_penalty_type": getattr(generation, "length_penalty_type", None) or "hf",
        "early_stopping": False if generation.early_stopping is None else generation.early_stopping,
        "relative_max_length": getattr(generation, "relative_max_length", RELATIVE_MAX_LENGTH),
    }


def decoding_arguments(
    defaults: dict, num_beams: int | None, length_penalty: float | None, relative_max_length: int | None, batch: int
) -> tuple[int, float, int]:
    """An export translator's decoding for one call: each value given, else the export's default (the model's);
    a bad number of beams or batch size is named."""
    num_beams = defaults["num_beams"] if num_beams is None else num_beams
    length_penalty = defaults["length_penalty"] if length_penalty is None else length_penalty
    relative_max_length = defaults["relative_max_length"] if relative_max_length is None else relative_max_length
    for name, value in (("num_beams", num_beams), ("max_batch_size", batch)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} is invalid; expected an integer >= 1.")
    return num_beams, length_penalty, relative_max_length


def check_positions(lengths: list[int], texts: list[int], limit: int | None, what: str) -> None:
    """Refuse the first source longer than `limit` tokens (None: no limit), counted as the export counts them:
    `lengths` of the sentences `texts` (indices into the input, so that the ValueError names the line) and `what`
    the limit is ("this export's 1023 (max_positions 1024)...")."""
    for index, length in zip(texts, lengths, strict=True):
        if limit is not None and length > limit:
            raise ValueError(f"line {index + 1} is a source of {length:,} tokens, longer than {what}.")
