"""The run settled once: the recipe and the flags become one frozen `RunSettings` before any corpus or model work.

Everything a run decides from its arguments alone is decided here, once: the device and the processes, whether a
time budget sets the length, the precisions, attention implementations and compilations the calibration may choose
among (`update_choices`: the one rule of precision), the model sizes and batch sizes it may choose among, the
batches per update of each (`RunSettings.update_size`: the one rule of accumulation), the GNMT alphas, whether the
run validates, and how the §5.3 rate is named (`RateRule`). Nothing downstream derives them again, and nothing
changes the arguments: the user's `recipe` and `args` are kept as given (results.json records them), and a run that
starts again with another choice gets settings of its own (`switched_to`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..data.batching import accumulation_steps
from ..model.configuration_vanilla_transformer import PRESETS
from ..utils.device import attention_choices, check_precision, device_precisions, training_device
from .arguments import ModelDataArguments, TransformerTrainingArguments
from .budget import COMPILE_AFTER_MINUTES, COMPILE_AFTER_UPDATES, RateRule, UpdateChoices, trainer_optimizer
from .checks import check_run_arguments
from .choices import (
    average_last_by_epochs,
    budgeted,
    dropout_by_epochs,
    length_penalty_choices,
    peak_by_start_bleu,
    preset_choices,
    size_min_updates,
    start_step,
    token_choices,
    warmup_by_start_bleu,
)
from .models import parse_config_overrides


@dataclass(frozen=True)
class UpdateSize:
    """An update of `accumulation` batches of `max_tokens` padded source (and target) tokens in each of
    `world_size` processes."""

    max_tokens: int
    accumulation: int
    world_size: int = 1
    tokens: int = field(init=False)  # padded source tokens per update, over every process and accumulation step

    def __post_init__(self):
        object.__setattr__(self, "tokens", self.max_tokens * self.accumulation * self.world_size)


@dataclass(frozen=True)
class RunSettings:
    """A run's arguments, settled (see the module docstring). `recipe` and `args` are what the user gave."""

    recipe: ModelDataArguments
    args: TransformerTrainingArguments
    device: torch.device
    world_size: int
    budgeted: bool
    choices: UpdateChoices
    presets: tuple[str, ...]  # the model sizes to choose among, largest first (one: no choice)
    token_sizes: tuple[int, ...]  # the batch sizes (max_tokens) to choose among, largest first
    alphas: tuple[float, ...]  # the GNMT alphas chosen among on validation (none: the folder's own)
    validates: bool  # validation passes during training (eval_strategy steps)
    rate: RateRule
    asked_precision: str  # what the user asked for: "auto", or the precision fixed (fp16 included)
    output_dir: str
    max_minutes: float | None  # the budget (None: the length is given)
    updates: dict[int, UpdateSize]  # the update of each batch size of `token_sizes`
    optimizer: Callable = field(compare=False)  # parameters -> the optimizer the Trainer builds (calibration's too)
    # Whether the model folder shows test sentences (examples, attention maps): those of a public corpus, and of the
    # user's own files (`--data_files`) only with `--publish_examples`.
    publishes_examples: bool = True
    dropout_steps: tuple[tuple[float, float], ...] = ()  # the dropout by predicted epochs (`dropout_by_epochs`)
    averaging_steps: tuple[tuple[float, int], ...] = ()  # the checkpoints averaged by them (`average_last_by_epochs`)
    size_min_updates: tuple[tuple[str, int], ...] = ()  # the sizes that need more updates (`size_min_updates`)
    start_peaks: tuple[tuple[float, float], ...] = ()  # a fine-tuning run's peak by its start (`peak_by_start_bleu`)
    start_warmups: tuple[tuple[float, float], ...] = ()  # ... and its warmup (`warmup_by_start_bleu`)
    fired: tuple[dict, ...] = ()  # the recipe's rules applied before the plan (`for_start`), for its record

    def for_start(self, start: dict | None) -> RunSettings:
        """The settings of a fine-tuning run whose starting model scored `start` on validation (`training/start.py`;
        None: not measured): the peak of `peak_by_start_bleu` and the warmup of `warmup_by_start_bleu` for its BLEU,
        each where a step applies, recorded as a rule that fired."""
        if start is None:
            return self
        bleu, changes, fired = start["bleu"], {}, list(self.fired)
        for rule, name, steps, said in (
            ("peak_by_start_bleu", "peak", self.start_peaks, "peak {:.1e}"),
            ("warmup_by_start_bleu", "warmup", self.start_warmups, "warmup {:,.0f}"),
        ):
            value = start_step(steps, bleu)
            if value is not None:
                changes[name] = value
                fired.append({"rule": rule, "said": f"{said.format(value)} for a start of validation BLEU {bleu:.2f}"})
        if not changes:
            return self
        return dataclasses.replace(self, rate=dataclasses.replace(self.rate, **changes), fired=tuple(fired))

    def update_size(self, max_tokens: int) -> UpdateSize:
        """The update of batches of `max_tokens` (`update_size`)."""
        if max_tokens in self.updates:
            return self.updates[max_tokens]
        return update_size(
            self.recipe.tokens_per_update, self.args.gradient_accumulation_steps, self.world_size, max_tokens
        )

    @property
    def corpus_name(self) -> dict:
        """The corpus in results.json: the dataset (or "local files") and its languages."""
        recipe = self.recipe
        dataset = "local files" if recipe.data_files else recipe.dataset
        return {"dataset": dataset, "source_lang": recipe.source_lang, "target_lang": recipe.target_lang}

    def asked(self) -> dict:
        """What the user asked for (recipe file and flags), before any plan: the sizes, the batch and its choices,
        the schedule, the precision and attention (`auto` where the plan measures them), the length."""
        recipe, args = self.recipe, self.args
        return {
            "preset": recipe.preset,
            "preset_choices": recipe.preset_choices,
            "max_tokens": recipe.max_tokens,
            "max_tokens_choices": recipe.max_tokens_choices,
            "gradient_accumulation_steps": args.gradient_accumulation_steps,
            "tokens_per_update": recipe.tokens_per_update,
            "lr_scale": recipe.lr_scale,
            "peak_learning_rate": recipe.peak_learning_rate,
            "peak_learning_rate_preset": recipe.peak_learning_rate_preset,
            "lr_reference_tokens": recipe.lr_reference_tokens,
            "compile_training": recipe.compile_training,
            "warmup_steps": args.warmup_steps,
            "cooldown_fraction": args.cooldown_fraction,
            "max_length": recipe.max_length,
            "seed": args.seed,
            "precision": self.asked_precision,
            "attn_implementation": recipe.attn_implementation,
            "recipe_file": recipe.recipe,
            "publish_examples": recipe.publish_examples,
            "cut_warmup_keeps_peak": recipe.cut_warmup_keeps_peak,
            "size_min_updates": recipe.size_min_updates,
            "dropout": recipe.dropout,
            "dropout_by_epochs": recipe.dropout_by_epochs,
            "average_last": recipe.average_last,
            "average_window": recipe.average_window,
            "average_last_by_epochs": recipe.average_last_by_epochs,
            "peak_by_start_bleu": recipe.peak_by_start_bleu,
            "warmup_by_start_bleu": recipe.warmup_by_start_bleu,
            "max_epochs": recipe.max_epochs,
            "plateau_validations": recipe.plateau_validations,
            "max_minutes": recipe.max_minutes,
            "max_steps": args.max_steps,
        }

    def switched_to(self, preset: str | None, max_tokens: int, precision: str, attention: str | None, compiled: bool):
        """The settings of a run started again with another model size and batch size, keeping the first run's
        precision, attention and compilation: nothing left to choose. The rate keeps its owner (`rate`)."""
        choices = UpdateChoices((precision,), (attention,), (compiled,))
        presets = (preset,) if preset is not None else self.presets[:1]
        updates = {max_tokens: self.update_size(max_tokens)}
        return dataclasses.replace(self, choices=choices, presets=presets, token_sizes=(max_tokens,), updates=updates)


def settle(recipe: ModelDataArguments, args: TransformerTrainingArguments, device=None) -> RunSettings:
    """The run's settings from its two argument dataclasses, every check of them first: a ValueError names a bad
    value before any corpus or model work. `device` (default: the one `args` trains on) is where the precisions are
    checked."""
    check_run_arguments(recipe, args)
    device = training_device(args) if device is None else torch.device(device)
    is_budgeted = budgeted(recipe, args)
    asked = recipe.precision or ("bf16" if args.bf16 else "fp16" if args.fp16 else "fp32")
    world_size = max(1, args.world_size)
    sizes = token_choices(recipe)
    updates = {
        size: update_size(recipe.tokens_per_update, args.gradient_accumulation_steps, world_size, size)
        for size in sizes
    }
    return RunSettings(
        recipe=recipe,
        args=args,
        device=device,
        world_size=world_size,
        budgeted=is_budgeted,
        choices=update_choices(recipe, args, device),
        presets=tuple(preset_choices(recipe)),
        token_sizes=tuple(sizes),
        alphas=tuple(length_penalty_choices(recipe)),
        validates=args.eval_strategy == "steps",
        rate=rate_rule(recipe, args),
        asked_precision=asked,
        output_dir=args.output_dir,
        max_minutes=recipe.max_minutes if is_budgeted else None,
        updates=updates,
        optimizer=trainer_optimizer(args),
        publishes_examples=recipe.publish_examples or not recipe.data_files,
        dropout_steps=tuple(dropout_by_epochs(recipe)),
        averaging_steps=tuple(average_last_by_epochs(recipe)),
        size_min_updates=tuple(size_min_updates(recipe).items()),
        start_peaks=tuple(peak_by_start_bleu(recipe)) if recipe.model_name_or_path else (),
        start_warmups=tuple(warmup_by_start_bleu(recipe)) if recipe.model_name_or_path else (),
    )


def update_size(tokens_per_update: int | None, accumulation: int, world_size: int, max_tokens: int) -> UpdateSize:
    """The update of batches of `max_tokens`: the given gradient `accumulation`, or more where `tokens_per_update`
    asks for it over `world_size` processes (the one rule of batches per update)."""
    needed = accumulation_steps(tokens_per_update, max_tokens, world_size)
    return UpdateSize(max_tokens, max(accumulation, needed), world_size)


def update_choices(recipe: ModelDataArguments, args: TransformerTrainingArguments, device) -> UpdateChoices:
    """The precisions, attention implementations and compilations to measure on `device`, one each where the recipe
    fixed them: the precision `auto` measures the device's (`device.device_precisions`), else the one given (the
    recipe's, or `--bf16` / `--fp16`), checked to exist there; the attention `auto` measures the device's
    (`device.attention_choices`; flex attention, a kernel compiled at its first batch, only in runs that measure a
    compiled step: on an H200 it compiled for 23 s and ran 2.4 times slower than SDPA); the compilation as
    `compile_choices` says."""
    if recipe.precision == "auto":
        precisions = device_precisions(device)
    else:
        precisions = [recipe.precision or ("bf16" if args.bf16 else "fp16" if args.fp16 else "fp32")]
        check_precision(precisions[0], device)
    compiles = compile_choices(recipe, args, device)
    if recipe.attn_implementation == "auto":
        attentions = attention_choices(device, flex=True in compiles)
    else:
        attentions = [recipe.attn_implementation]
    return UpdateChoices(
        tuple(precisions),
        tuple(attentions),
        tuple(compiles),
        precision_open=recipe.precision == "auto",
        compile_open=recipe.compile_training == "auto" and not args.torch_compile,
    )


def compile_choices(recipe: ModelDataArguments, args: TransformerTrainingArguments, device) -> list[bool]:
    """Whether the training step is compiled (`compile_training`; `--torch_compile true` is "always"): "auto"
    measures both on a CUDA device where the run trains for at least `COMPILE_AFTER_MINUTES` (a run of a given
    length: `COMPILE_AFTER_UPDATES`), else stays eager."""
    choice = "always" if args.torch_compile else recipe.compile_training
    if choice != "auto":
        return [choice == "always"]
    if args.max_steps > 0:
        long_enough = args.max_steps >= COMPILE_AFTER_UPDATES
    else:
        long_enough = recipe.max_minutes is None or recipe.max_minutes >= COMPILE_AFTER_MINUTES
    return [False, True] if torch.device(device).type == "cuda" and long_enough else [False]


def rate_rule(recipe: ModelDataArguments, args: TransformerTrainingArguments) -> RateRule:
    """How the recipe names its §5.3 rate: `lr_scale`, or a `peak_learning_rate` of the model it names it for
    (`peak_learning_rate_preset`, else `preset` with its config overrides; a saved model: its own width), at
    `lr_reference_tokens` per update, with the warmup given."""
    owner = None
    if recipe.peak_learning_rate_preset:
        owner = PRESETS[recipe.peak_learning_rate_preset]["d_model"]
    elif not recipe.model_name_or_path:
        owner = parse_config_overrides(recipe.config_overrides).get("d_model", PRESETS[recipe.preset]["d_model"])
    return RateRule(
        lr_scale=recipe.lr_scale,
        peak=recipe.peak_learning_rate,
        owner_d_model=owner,
        reference_tokens=recipe.lr_reference_tokens,
        warmup=args.warmup_steps,
        max_warmup_fraction=recipe.max_warmup_fraction,
        cut_keeps_peak=recipe.cut_warmup_keeps_peak,
    )
