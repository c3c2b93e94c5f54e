"""The run settled once (training/settings.py) and each decision of a run in its one function, with fixed expected
values: the peak learning rate and the batch it was named for, the batch size and accumulation, the precision (and
what results.json records of it), the time left, the spacing of checkpoints and validations, and the length handed
to the Trainer. The arguments a run is given are never changed."""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch

from hf_vanilla_transformer.training.arguments import ModelDataArguments, TransformerTrainingArguments
from hf_vanilla_transformer.training.budget import BudgetError, BudgetPlan, apply_plan
from hf_vanilla_transformer.training.budget.clock import (
    FINISHING_SECONDS,
    FOLDER_SECONDS,
    RESTART_SECONDS,
    SAFETY,
    BudgetClock,
    finishing_seconds,
)
from hf_vanilla_transformer.training.budget.deadline import events_due
from hf_vanilla_transformer.training.budget.fitting import replan_bound
from hf_vanilla_transformer.training.budget.schedule import RateRule, learning_rate
from hf_vanilla_transformer.training.recipes import parse_run
from hf_vanilla_transformer.training.run import train_and_evaluate
from hf_vanilla_transformer.training.settings import settle, update_choices, update_size

from conftest import FIXTURES


def arguments(tmp_path, **fields) -> TransformerTrainingArguments:
    return TransformerTrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], **fields)


def test_the_settled_run_is_frozen_and_leaves_the_arguments_as_given(tmp_path):
    recipe = ModelDataArguments(preset="small", max_minutes=5, max_tokens_choices="2048,1024")
    args = arguments(tmp_path)
    before = (dataclasses.asdict(recipe), args.to_dict())
    settings = settle(recipe, args)
    assert (dataclasses.asdict(recipe), args.to_dict()) == before
    assert settings.recipe is recipe and settings.token_sizes == (2048, 1024) and settings.presets == ("small",)
    assert settings.budgeted and settings.max_minutes == 5 and settings.validates is False
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.budgeted = False
    with pytest.raises(dataclasses.FrozenInstanceError):
        recipe.preset = "big"  # the recipe is frozen too: a function that wants another makes one
    # A given length has no budget to fit: the run is not budgeted, whatever max_minutes says.
    assert not settle(ModelDataArguments(max_minutes=5), arguments(tmp_path, max_steps=10)).budgeted


def test_the_peak_learning_rate_is_named_with_the_width_and_the_batch_it_holds_at():
    # The CPU recipe's rule: 1.9764e-3 for d_model 256, warmup 1,000, at 2,048 tokens per update.
    rule = RateRule(peak=0.0019764, owner_d_model=256, reference_tokens=2048, warmup=1000, max_warmup_fraction=0.35)
    assert learning_rate(rule, 256, 1000, 2048).peak == pytest.approx(1.9764e-3)
    assert learning_rate(rule, 256, 1000, 1024).peak == pytest.approx(1.3975e-3, rel=1e-4)  # half the tokens
    assert learning_rate(rule, 512, 1000, 2048).peak == pytest.approx(1.3975e-3, rel=1e-4)  # twice the width
    assert learning_rate(rule, 256, 500, 2048).peak == pytest.approx(1.9764e-3 / 2, rel=1e-4)  # half the ramp
    assert learning_rate(rule, 256, 1000, 2048).lr_scale == pytest.approx(1.0, rel=1e-4)
    # The paper's rule: lr_scale 1, warmup 4,000: base peaks at 7.0e-4, whatever the batch.
    assert learning_rate(RateRule(warmup=4000), 512, 4000, 25000).peak == pytest.approx(6.988e-4, rel=1e-3)


def test_batch_size_and_accumulation_are_one_rule(tmp_path):
    # The paper's 25,000 tokens per update from 4,096-token batches in 2 processes: 4 batches per update each.
    assert update_size(25000, 1, 2, 4096) == dataclasses.replace(update_size(None, 4, 2, 4096), accumulation=4)
    assert update_size(25000, 1, 2, 4096).tokens == 4 * 4096 * 2
    assert update_size(None, 3, 1, 1024).accumulation == 3  # the given accumulation, where no total is asked
    assert update_size(2048, 3, 1, 1024).accumulation == 3  # never fewer than given
    settings = settle(
        ModelDataArguments(tokens_per_update=4096, max_tokens_choices="2048,1024", max_minutes=5), arguments(tmp_path)
    )
    assert {size: update.accumulation for size, update in settings.updates.items()} == {2048: 2, 1024: 4}


def test_the_precision_is_chosen_in_one_rule_and_recorded_as_asked(tmp_path):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    choices = update_choices(ModelDataArguments(precision="fp32"), arguments(tmp_path), cpu)
    assert choices.precisions == ("fp32",) and not choices.precision_open
    fp16 = arguments(tmp_path, fp16=False)
    fp16.fp16 = True  # (TrainingArguments refuses fp16 on a CPU; the settings are those of a CUDA run)
    assert update_choices(ModelDataArguments(), fp16, cuda).precisions == ("fp16",)
    settings = settle(ModelDataArguments(), fp16, device=cuda)
    assert settings.asked_precision == "fp16" and settings.asked()["precision"] == "fp16"  # not "fp32"
    with pytest.raises(ValueError, match="precision='fp16' is invalid on cpu"):
        settle(ModelDataArguments(), fp16, device=cpu)
    # What trains: the plan's precision in the Trainer's arguments.
    planned = apply_plan(a_plan(10, precision="fp16", gradient_accumulation_steps=2), fp16)
    assert (planned.fp16, planned.bf16, planned.tf32) == (True, False, False)
    assert (planned.max_steps, planned.warmup_steps, planned.save_steps, planned.gradient_accumulation_steps) == (
        10, 100, 500, 2,
    )  # fmt: skip
    assert planned.learning_rate == 1e-3  # the Trainer's rate is the plan's peak (the schedule's shape peaks at 1)
    assert fp16.max_steps == -1 and fp16.fp16  # the given arguments are left as they were


def test_the_time_left_is_one_formula_with_named_margins():
    now = [100.0]
    clock = BudgetClock(origin=40.0, seconds=1000.0, now=lambda: now[0])  # 60 s spent
    assert clock.spent() == 60.0
    assert clock.seconds_left() == 1000.0 - 60.0 - FINISHING_SECONDS
    assert clock.seconds_left(200.0) == 1000.0 - 60.0 - 200.0 - FINISHING_SECONDS
    assert clock.seconds_left(200.0, restart=True) == 1000.0 - 60.0 - 200.0 - FINISHING_SECONDS - RESTART_SECONDS
    assert clock.seconds_left(200.0, planned=True) == pytest.approx(
        (1000.0 - 60.0 - 200.0 - FINISHING_SECONDS) * SAFETY
    )
    now[0] = 2000.0
    assert clock.seconds_left(planned=True) == 0.0 and clock.seconds_left() < 0  # the deadline has passed
    assert BudgetClock(0.0, None).seconds_left() == float("inf")  # no budget
    with pytest.raises(ValueError, match="max_minutes=16.6667 leaves no time to train"):
        clock.check_setup({"corpus": {"seconds": 30.0}})
    # Once the plan has measured its model's checkpoint, the finishing kept is that model's; a fine-tuning run's final
    # check stays kept beside it, in either order.
    now[0] = 100.0
    finishing = finishing_seconds(0.5, 5)
    assert finishing == FOLDER_SECONDS + 6 * 0.5 and finishing_seconds(0.5, 20) == FOLDER_SECONDS + 21 * 0.5
    assert finishing_seconds(None, 5) == finishing_seconds(0.0, 5) == FINISHING_SECONDS  # none measured
    # The attention maps grow with layers times heads: base's 6 x 8 panels keep four times the folder's seconds.
    assert finishing_seconds(0.5, 5, map_panels=48) == 4 * FOLDER_SECONDS + 6 * 0.5
    assert finishing_seconds(0.5, 5, map_panels=4) == finishing  # fewer panels than measured keep as many seconds
    measured = clock.with_finishing(finishing)
    assert measured.seconds_left() == 1000.0 - 60.0 - finishing
    assert clock.seconds_left() == 1000.0 - 60.0 - FINISHING_SECONDS  # the clock it came from is left as it was
    # A run that starts again with another model keeps the plan's margin until that model's is measured.
    assert measured.seconds_left(restart=True) == 1000.0 - 60.0 - FINISHING_SECONDS - RESTART_SECONDS
    larger = clock.with_finishing(45.0)
    assert larger.seconds_left(restart=True) == 1000.0 - 60.0 - 45.0 - RESTART_SECONDS
    checked = clock.with_final_check(40.0).with_finishing(finishing)
    assert checked.seconds_left() == clock.with_finishing(finishing).with_final_check(40.0).seconds_left()
    assert checked.seconds_left() == 1000.0 - 60.0 - finishing - 40.0


def test_a_budget_spent_before_the_set_up_stops_the_run_before_the_corpus_is_read(tmp_path):
    """The budget is checked at the run's start too: a process that began an hour before its one-minute budget's run
    stops there, in one line, before any corpus is read or cached (the set-up's own checks come after each stage)."""
    cache = tmp_path / "cache"
    settings = parse_run(
        [
            *("--recipe", "cpu", "--preset", "tiny", "--max_minutes", "1", "--output_dir", str(tmp_path / "run")),
            *("--data_files", str(FIXTURES / "libreoffice_help_en_de_200.tsv"), "--data_cache_dir", str(cache)),
        ]
    )
    said = r"max_minutes=1 leaves no time to train: 60\.\d min went before the set-up began; give more minutes\.$"
    with pytest.raises(BudgetError, match=said):
        train_and_evaluate(settings, started=time.time() - 3600)
    assert not cache.exists() or not any(cache.iterdir())


def test_checkpoints_and_validations_come_a_spacing_after_the_last_one_and_never_just_before_the_end():
    # Checkpoints every 100 updates, validations every 200 (at checkpoints): from the last of each.
    assert events_due(100, 1000, 100, 100, 100, 200, validates=True) == (True, False)
    assert events_due(200, 1000, 100, 200, 100, 200, validates=True) == (True, True)
    assert events_due(250, 1000, 50, 150, 100, 200, validates=True) == (False, False)
    assert events_due(200, 1000, 100, 200, 100, 200, validates=False) == (True, False)
    # Within half a spacing of the last update (which saves and validates by the Trainer's rule): nothing.
    assert events_due(960, 1000, 100, 200, 100, 200, validates=True) == (False, False)
    assert events_due(1000, 1000, 100, 200, 100, 200, validates=True) == (False, False)
    # Validations more often than checkpoints come on their own.
    assert events_due(50, 1000, 50, 50, 100, 50, validates=True) == (False, True)


def a_plan(max_steps: int = 3000, **fields) -> BudgetPlan:
    fields = {"precision": "fp32", "attn_implementation": None, "peak_learning_rate": 1e-3, **fields}
    return BudgetPlan.of(max_steps=max_steps, warmup_steps=100, save_steps=500, eval_steps=None, **fields)


def test_the_trainer_runs_to_the_room_a_budget_may_replan_into(tmp_path):
    args = arguments(tmp_path)
    assert apply_plan(a_plan(), args).max_steps == 3000  # a given length, or a resumed run: the plan's
    bound = replan_bound(3000, 782, 20)  # the epoch cap: 20 epochs of 782 updates
    assert apply_plan(a_plan(), args, runs_to=bound).max_steps == 15640
    assert apply_plan(a_plan(), args, runs_to=replan_bound(3000, 782, None)).max_steps == 30000  # else ten times
    assert replan_bound(3000, 100, 20) == 3000  # never below the plan


def test_the_command_line_settles_every_choice_before_any_work(tmp_path):
    settings = parse_run(["--output_dir", str(tmp_path)], default_recipe="cpu")
    assert settings.presets == ("medium", "small", "compact") and settings.token_sizes == (1024,)
    assert settings.size_min_updates == (("medium", 20000),) and settings.dropout_steps == ((8, 0.1),)
    assert settings.alphas == (0.6, 1.0, 1.5) and settings.validates and settings.budgeted
    assert settings.choices.attentions == ("eager", "sdpa") and settings.choices.compiles == (False,)
    assert settings.rate == RateRule(1.0, 0.0019764, 256, 2048, 1000, 0.35)
    assert settings.asked()["precision"] == "auto" and settings.updates[1024].accumulation == 1


def test_the_first_line_names_the_size_only_where_the_run_fixes_it(tmp_path):
    """The first real GPU run said "Training the 'big' Transformer" and trained small, the plan's choice."""
    from hf_vanilla_transformer.commands.train import headline

    output = str(tmp_path / "run")
    chosen = headline(parse_run(["--output_dir", output], default_recipe="gpu"))
    assert chosen.startswith("Training a Transformer of the size the plan chooses (big, base, small) on ")
    fixed = headline(parse_run(["--output_dir", output, "--preset", "base"], default_recipe="gpu"))
    assert fixed.startswith("Training the 'base' Transformer on libreoffice-help en-de for 26 minutes (recipe gpu)")
