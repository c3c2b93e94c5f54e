"""The lists a run chooses from, read from the recipe: the model sizes (`preset_choices`) and batch sizes
(`max_tokens_choices`) the planner measures, settled against what the command line gave (`settle_choices`), and the
GNMT alphas the validation chooses among (`length_penalty_choices`, §6.1). A ValueError names a bad list."""

from __future__ import annotations

import dataclasses
import math

from ..model.configuration_vanilla_transformer import PRESETS


def token_choices(recipe) -> list[int]:
    """The batch sizes (max_tokens) the planner may choose from, largest first: `max_tokens_choices` where given
    (the command line's `max_tokens` is then their first: `settle_choices`), else `max_tokens`."""
    return _token_list(recipe.max_tokens_choices) if recipe.max_tokens_choices else [recipe.max_tokens]


def _token_list(text: str) -> list[int]:
    try:
        choices = sorted({int(value) for value in text.split(",")}, reverse=True)
    except ValueError:
        choices = []
    if not choices or min(choices) < 1:
        raise ValueError(f"max_tokens_choices={text!r} is invalid; expected positive token counts such as '2048,1024'.")
    return choices


def preset_choices(recipe) -> list[str]:
    """The model sizes the planner may choose from, largest first: `preset_choices` where given (the command line's
    `preset` is then their first: `settle_choices`), else `preset`."""
    return _preset_list(recipe.preset_choices) if recipe.preset_choices else [recipe.preset]


def _preset_list(text: str) -> list[str]:
    choices = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in choices if name not in PRESETS]
    if not choices or unknown:
        raise ValueError(
            f"preset_choices={text!r} is invalid; expected presets from {sorted(PRESETS)} separated by commas, "
            "largest first, such as 'small,compact'."
        )
    return choices


def size_min_updates(recipe) -> dict[str, int]:
    """The updates each size of `size_min_updates` needs before the plan takes it (`size:updates` pairs); {} when not
    given. A ValueError names a bad pair or a size that is no preset."""
    text, found = recipe.size_min_updates, {}
    for pair in (text or "").split(","):
        if not pair.strip():
            continue
        name, _, count = pair.partition(":")
        try:
            updates = int(count)
        except ValueError:
            updates = 0
        if name.strip() not in PRESETS or updates < 1:
            raise ValueError(
                f"size_min_updates={text!r} holds {pair.strip()!r}; expected size:updates pairs of presets from "
                f"{sorted(PRESETS)} and positive counts, such as 'base:12000,medium:6000'."
            )
        found[name.strip()] = updates
    return found


def dropout_by_epochs(recipe) -> list[tuple[float, float]]:
    """The (epochs, dropout) steps of `dropout_by_epochs`, fewest epochs first; [] when not given. A ValueError names
    a bad pair."""
    expected = "epochs:dropout pairs of epochs >= 0 and dropouts in [0, 1), such as '10:0.1'"
    return _number_pairs(
        recipe, "dropout_by_epochs", lambda epochs, dropout: epochs >= 0 and 0 <= dropout < 1, expected
    )


def average_last_by_epochs(recipe) -> list[tuple[float, int]]:
    """The (epochs, checkpoints) steps of `average_last_by_epochs`, fewest epochs first; [] when not given. A
    ValueError names a bad pair."""
    expected = "epochs:checkpoints pairs of epochs >= 0 and a whole number of checkpoints >= 1, such as '20:8'"
    pairs = _number_pairs(
        recipe, "average_last_by_epochs", lambda epochs, last: epochs >= 0 and last >= 1 and last % 1 == 0, expected
    )
    return [(epochs, int(last)) for epochs, last in pairs]


def peak_by_start_bleu(recipe) -> list[tuple[float, float]]:
    """The (validation BLEU, peak learning rate) steps of `peak_by_start_bleu`, lowest BLEU first; [] when not
    given. A ValueError names a bad pair."""
    expected = "bleu:peak pairs of a BLEU in (0, 100] and a positive learning rate, such as '20:8e-4'"
    return _number_pairs(recipe, "peak_by_start_bleu", lambda bleu, peak: 0 < bleu <= 100 and peak > 0, expected)


def _number_pairs(recipe, name: str, valid, expected: str) -> list[tuple[float, float]]:
    """The pairs of numbers "a:b,a:b" of the recipe's field `name`, sorted; [] when not given. A pair that is not
    two numbers or that `valid(a, b)` refuses is a ValueError naming it and saying what was `expected`."""
    text, pairs = getattr(recipe, name), []
    for pair in (str(text) if text is not None else "").split(","):
        if not pair.strip():
            continue
        first, _, second = pair.partition(":")
        try:
            numbers = (float(first), float(second))
        except ValueError:
            numbers = None
        if numbers is None or not all(map(math.isfinite, numbers)) or not valid(*numbers):
            raise ValueError(f"{name}={text!r} holds {pair.strip()!r}; expected {expected}.")
        pairs.append(numbers)
    return sorted(pairs)


def warmup_by_start_bleu(recipe) -> list[tuple[float, float]]:
    """The (validation BLEU, warmup updates) steps of `warmup_by_start_bleu`, lowest BLEU first; [] when not given. A
    ValueError names a bad pair."""
    expected = "bleu:updates pairs of a BLEU in (0, 100] and a whole number of warmup updates >= 1, such as '20:1000'"
    return _number_pairs(
        recipe,
        "warmup_by_start_bleu",
        lambda bleu, updates: 0 < bleu <= 100 and updates >= 1 and updates % 1 == 0,
        expected,
    )


def start_step(steps, bleu: float) -> float | None:
    """The value of the first of `steps` (`peak_by_start_bleu`, `warmup_by_start_bleu`: lowest BLEU first) whose BLEU
    the start's validation `bleu` is below; None at or above them all (the recipe's own)."""
    return next((value for bound, value in steps if bleu < bound), None)


def budgeted(recipe, args) -> bool:
    """Whether the run's length is measured to fit a time budget (max_minutes without max_steps)."""
    return recipe.max_minutes is not None and args.max_steps <= 0


CHOICE_LISTS = {"preset_choices": "preset", "max_tokens_choices": "max_tokens"}


def settle_choices(recipe, args, given: set[str]):
    """The recipe with its lists of choices as the run can honour them (a new recipe: the one given is left as it
    is), `given` naming the flags of the command line.

    A list given on the command line sets the value it starts from (`--preset_choices base,small` trains base or
    small, whatever the recipe's preset); a recipe file's list gives way to a value given instead (`--preset tiny`
    over the CPU recipe trains tiny, and so does `--preset small`: a size given is the size trained) and to a run
    with nothing to choose by (a given length; a saved model). A list given that the run cannot honour is an error
    naming it, never dropped."""
    settled = {}
    for name, value_name in CHOICE_LISTS.items():
        choices = getattr(recipe, name)
        if not choices:
            continue
        first = _preset_list(choices)[0] if name == "preset_choices" else _token_list(choices)[0]
        if name in given:
            if value_name in given and getattr(recipe, value_name) != first:
                raise ValueError(
                    f"--{value_name} {getattr(recipe, value_name)} and --{name} {choices} disagree: the planner starts "
                    "from the first choice; give one or the other."
                )
            settled[value_name] = first  # the checks of check_run_arguments name what cannot be honoured
        elif (
            value_name in given
            or not budgeted(recipe, args)
            or (name == "preset_choices" and recipe.model_name_or_path)
        ):
            settled[name] = None
    return dataclasses.replace(recipe, **settled)


def length_penalty_choices(recipe) -> list[float]:
    """The GNMT alphas of `--length_penalty_choices` as numbers ([] when not given); a ValueError names a bad one."""
    if not recipe.length_penalty_choices:
        return []
    alphas = []
    for text in str(recipe.length_penalty_choices).split(","):
        try:
            alpha = float(text)
        except ValueError:
            alpha = -1.0
        if not 0 <= alpha < float("inf"):
            raise ValueError(
                f"length_penalty_choices={recipe.length_penalty_choices!r} holds {text.strip()!r}; expected "
                "comma-separated GNMT alphas of 0 or more (e.g. 0.6,1.0,1.4)."
            )
        alphas.append(alpha)
    if recipe.test_beams <= 1 and len(alphas) > 1:
        raise ValueError(
            f"length_penalty_choices={recipe.length_penalty_choices!r} needs beam search: test_beams={recipe.test_beams} "
            "decodes greedily, where alpha changes nothing."
        )
    return alphas
