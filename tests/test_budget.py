"""The time budget (`--max_minutes`) and the recipe files: the planner's arithmetic with fixed expected values, the
choice of checkpoints to average, the measurement that leaves the model alone, the recipes read as flags, and
budgeted runs of the real train script (one that stops on its own, one killed and resumed with its plan kept)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
from transformers import TrainerControl, TrainerState

from hf_vanilla_transformer import VanillaTransformerForConditionalGeneration
from hf_vanilla_transformer.sharing.plots import attention_map_panels
from hf_vanilla_transformer.training.arguments import ModelDataArguments, TransformerTrainingArguments
from hf_vanilla_transformer.training.averaging import choose_checkpoints, validation_losses
from hf_vanilla_transformer.training.budget.calibration import measure_updates
from hf_vanilla_transformer.training.budget.clock import FINISHING_SECONDS, BudgetClock, finishing_seconds
from hf_vanilla_transformer.training.budget.costs import (
    BudgetRules,
    HeldOut,
    ReplanRoom,
    decode_seconds,
    decoding_steps_ratio,
    updates_that_fit,
)
from hf_vanilla_transformer.training.budget.deadline import WARM_UPDATES, Replan, TimeBudgetCallback, UpdateMeter
from hf_vanilla_transformer.training.budget.plan import BudgetPlan
from hf_vanilla_transformer.training.budget.record import recorded_plan
from hf_vanilla_transformer.training.budget.replanning import Switch, better_candidate, refit
from hf_vanilla_transformer.training.budget.schedule import EventRule, event_spacing, spacing_for, warmup_for
from hf_vanilla_transformer.training.checkpoints import latest_checkpoint
from hf_vanilla_transformer.training.checks import check_schedule_arguments
from hf_vanilla_transformer.training.choices import preset_choices
from hf_vanilla_transformer.training.models import build_model
from hf_vanilla_transformer.training.recipes import parse_arguments, read_recipe
from hf_vanilla_transformer.training.run import prepare_run
from hf_vanilla_transformer.training.settings import settle
from hf_vanilla_transformer.training.trainer import decoding_steps

from conftest import FIXTURES, ROOT, plan_of, random_ids, tiny_model


TRAIN_200 = str(FIXTURES / "libreoffice_help_en_de_200.tsv")
TEST_40 = str(FIXTURES / "libreoffice_help_en_de_test_40.tsv")


# ---------------------------------------------------------------------------------------------------------------------
# Arithmetic
# ---------------------------------------------------------------------------------------------------------------------


def test_updates_that_fit_pay_for_checkpoints_and_validations_first():
    # (1000 s - 12 checkpoints x 1 s - 6 validations x 10 s) / 0.5 s per update
    assert updates_that_fit(1000, 0.5, 12, 1.0, 6, 10.0) == 1856
    assert updates_that_fit(1000, 0.5) == 2000
    assert updates_that_fit(50, 0.5, 6, 10.0) == 0  # nothing left after the validations
    assert updates_that_fit(1560, 0.77) == 2025
    with pytest.raises(ValueError, match="seconds_per_update=0"):
        updates_that_fit(1000, 0)


def schedule_for(max_steps, warmup, checkpoints, evaluations, save_steps, eval_steps, max_warmup_fraction=None):
    """(warmup, checkpoint spacing, validation spacing) of a run: the two rules side by side."""
    spacing = event_spacing(max_steps, EventRule(checkpoints, evaluations, save_steps, eval_steps))
    return (warmup_for(max_steps, warmup, max_warmup_fraction), *spacing)


def test_the_schedule_follows_from_the_number_of_updates():
    # The AMX run: 5,400 updates, warmup 18.5%, 12 checkpoints, 6 validations at every other checkpoint.
    assert schedule_for(5400, 0.185, 12, 6, save_steps=1000, eval_steps=None) == (999, 450, 900)
    # A 1,700-update run of the same recipe: the same fractions.
    assert schedule_for(1700, 0.185, 12, 6, save_steps=1000, eval_steps=None) == (314, 142, 284)
    # Fixed values where the recipe gives no fractions.
    assert schedule_for(1700, 4000, None, None, save_steps=450, eval_steps=900) == (4000, 450, 900)
    # Warmup in updates (post-LN needs its ~1,000 updates of ramp), never more than a third of a short run.
    assert schedule_for(3146, 1000, 12, 6, 1000, None, max_warmup_fraction=0.35) == (1000, 263, 526)
    assert schedule_for(1664, 1000, 12, 6, 1000, None, max_warmup_fraction=0.35) == (582, 139, 278)
    assert warmup_for(10, 0.01) == 1 and spacing_for(5, 12) == 1 and spacing_for(100, 3) == 34
    with pytest.raises(ValueError, match="max_warmup_fraction=0"):
        warmup_for(100, 10, max_fraction=0)
    with pytest.raises(ValueError, match="warmup_steps=0"):
        warmup_for(100, 0)
    with pytest.raises(ValueError, match="0 events per run"):
        spacing_for(100, 0)


def test_batch_size_choices_are_read_largest_first():
    from hf_vanilla_transformer.training.choices import token_choices

    assert token_choices(ModelDataArguments(max_tokens=4096)) == [4096]
    assert token_choices(ModelDataArguments(max_tokens_choices="1024, 2048,1024")) == [2048, 1024]
    for bad in ("2048,x", "0,1024", ""):
        with pytest.raises(ValueError, match="max_tokens_choices="):
            token_choices(ModelDataArguments(max_tokens_choices=bad or ","))


def test_test_decoding_is_predicted_from_the_training_speed():
    # 1,152 sentences, beam 4, 0.86 s per 2,048-token update: 68 s (64 s measured on an AVX2 EPYC in fp32).
    assert decode_seconds(1152, 4, 0.86, 2048) == pytest.approx(68.2, abs=0.1)
    assert decode_seconds(200, 1, 1.0, 1000) == pytest.approx(9.4)
    assert decode_seconds(100, 8, 1.0, 1000) == pytest.approx(28.2)


# ---------------------------------------------------------------------------------------------------------------------
# Which checkpoints to average
# ---------------------------------------------------------------------------------------------------------------------


def folders(*steps: int) -> list[Path]:
    return [Path(f"run/checkpoint-{step}") for step in steps]


def test_averaging_takes_only_the_end_of_the_run():
    # The short run: saved every 450 updates, stopped at 1,700; 450 and 900 are far from trained.
    assert [f.name for f in choose_checkpoints(folders(450, 900, 1350, 1700), last=5)] == [
        "checkpoint-1350",
        "checkpoint-1700",
    ]
    # The full AMX run: the last five, 3,600 to 5,400, as before.
    every = folders(*range(450, 5401, 450))
    assert [f.name for f in choose_checkpoints(every, last=5)] == [f"checkpoint-{s}" for s in range(3600, 5401, 450)]
    assert choose_checkpoints(every, last=1) == every[-1:]
    assert len(choose_checkpoints(every, last=5, window=None)) == 5
    assert len(choose_checkpoints(every, last=20, window=1.0)) == 12
    with pytest.raises(ValueError, match="average_window=1.5"):
        choose_checkpoints(every, window=1.5)
    with pytest.raises(ValueError, match="last=0"):
        choose_checkpoints(every, last=0)


def test_averaging_leaves_out_a_checkpoint_clearly_worse_on_validation():
    history = [
        {"step": 1432, "eval_loss": 4.546},  # run C's validations: 15.6% above the last, left out
        {"step": 1790, "eval_loss": 4.196},  # 6.7% above: kept
        {"step": 2138, "eval_loss": 3.933},
        {"step": 2138, "loss": 3.5},
    ]
    losses = validation_losses(history)
    assert losses == {1432: 4.546, 1790: 4.196, 2138: 3.933}
    every = folders(*range(179, 2138, 179), 2138)
    names = lambda chosen: [f.name.removeprefix("checkpoint-") for f in chosen]  # noqa: E731
    # 1,611 has no validation of its own; its loss is at least 1,790's, within 8%: kept.
    assert names(choose_checkpoints(every, last=5, eval_losses=losses)) == ["1611", "1790", "1969", "2138"]
    # A later validation clearly worse judges the unmeasured checkpoint before it too: 1,611 goes with 1,790.
    worse = losses | {1790: 4.5}
    assert names(choose_checkpoints(every, last=5, eval_losses=worse)) == ["1969", "2138"]
    assert names(choose_checkpoints(every, last=5, eval_losses=worse, tolerance=0.15)) == [
        "1611",
        "1790",
        "1969",
        "2138",
    ]
    # Stopped at its deadline at 2,050, saved between validations: 1,790's loss stands in for the last one's (an
    # upper bound while the loss falls); 1,432 (8.3% above it) is kept at 10%, left out at 8% (the rule's), and 1,969
    # (no validation at or after it) is judged by nothing.
    stopped = folders(*range(179, 2050, 179), 2050)
    assert names(choose_checkpoints(stopped, last=5, eval_losses=losses, tolerance=0.10)) == [
        "1432",
        "1611",
        "1790",
        "1969",
        "2050",
    ]
    assert names(choose_checkpoints(stopped, last=5, eval_losses=losses)) == [
        "1611",
        "1790",
        "1969",
        "2050",
    ]


# ---------------------------------------------------------------------------------------------------------------------
# Measuring and keeping the plan
# ---------------------------------------------------------------------------------------------------------------------


def test_measuring_updates_leaves_the_model_and_the_random_state_alone():
    model = tiny_model(seed=0).train()
    model.set_attn_implementation("eager")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    batch = {"input_ids": random_ids(4, 7), "labels": random_ids(4, 5, seed=1)}
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    parameters = [p.data_ptr() for p in model.parameters()]
    measured = measure_updates(model, [batch] * 4, [("fp32", "eager", False), ("fp32", "sdpa", False)])
    assert torch.equal(torch.rand(3), expected)
    assert set(measured) == {"fp32/eager", "fp32/sdpa"} and all(t.steady > 0 for t in measured.values())
    assert [p.data_ptr() for p in model.parameters()] == parameters  # the model itself stays where it was
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key
    assert model.config._attn_implementation == "eager"  # the copies were switched to sdpa, not the model
    assert all(p.grad is None for p in model.parameters())


def clock_of(training_seconds: float, now=time.monotonic, decode: float = 0.0) -> BudgetClock:
    """A budget clock started now (on `now`) with `training_seconds` left to train once `decode` seconds of test
    decoding and the finishing margin are paid."""
    return BudgetClock(now(), training_seconds + decode + FINISHING_SECONDS, now=now)


def usable(seconds_left: float) -> float:
    """What a plan fills of `seconds_left` training seconds (the budget clock's margins)."""
    return clock_of(seconds_left, now=lambda: 0.0).seconds_left(planned=True)


def test_the_deadline_stops_training_and_saves():
    callback = TimeBudgetCallback(plan_of(max_steps=100), clock_of(1e-9))
    state, control = TrainerState(max_steps=100, global_step=40), TrainerControl()
    time.sleep(0.01)
    callback.on_step_end(None, state, control)
    assert control.should_training_stop and control.should_save and callback.stopped_early_at == 40
    patient = TimeBudgetCallback(plan_of(max_steps=100), clock_of(3600))
    control = TrainerControl()
    patient.on_step_end(None, state, control)
    assert not control.should_training_stop and patient.stopped_early_at is None
    assert patient.state() == {"args": {"plan": plan_of(max_steps=100).to_dict()}, "attributes": {}}
    assert TimeBudgetCallback(**patient.state()["args"]).plan == patient.plan  # rebuilt from a checkpoint


def test_a_recorded_plan_comes_back_from_a_checkpoint_first(tmp_path):
    plan = BudgetPlan.of(
        max_steps=77,
        warmup_steps=14,
        save_steps=7,
        eval_steps=14,
        precision="fp32",
        attn_implementation="sdpa",
        max_minutes=1.0,
        reasons=["a"],
    )
    checkpoint = tmp_path / "checkpoint-7"
    checkpoint.mkdir()
    state = {"stateful_callbacks": {"TimeBudgetCallback": {"args": {"plan": plan.to_dict()}, "attributes": {}}}}
    (checkpoint / "trainer_state.json").write_text(json.dumps(state))
    (tmp_path / "budget.json").write_text(json.dumps({**plan.to_dict(), "max_steps": 99}))
    assert recorded_plan(tmp_path, checkpoint) == plan
    assert recorded_plan(tmp_path, None).schedule.max_steps == 99
    assert recorded_plan(tmp_path / "elsewhere", None) is None


def _small_or_tiny(**overrides) -> ModelDataArguments:
    """A budgeted recipe that may train `small` or `tiny` with 1,024- or 512-token batches on the 200-pair fixture."""
    values = dict(
        preset="small",
        preset_choices="small,tiny",
        max_tokens_choices="1024,512",
        vocab_size=500,
        data_files=TRAIN_200,
        validation_files=TEST_40,
        test_files=TEST_40,
        max_eval_samples=10,
        precision="fp32",
        attn_implementation="sdpa",
    )
    return ModelDataArguments(**{**values, **overrides})


@pytest.mark.parametrize(("min_updates", "chosen"), [pytest.param(1, "small", marks=pytest.mark.slow), (10**9, "tiny")])
def test_a_smaller_preset_is_trained_where_the_recipes_does_not_reach_its_updates(tmp_path, min_updates, chosen):
    recipe = _small_or_tiny(min_updates=min_updates, max_minutes=30, checkpoints_per_run=4)
    args = TransformerTrainingArguments(
        output_dir=str(tmp_path / "run"), warmup_steps=10, seed=3, use_cpu=True, disable_tqdm=True
    )
    run = prepare_run(settle(recipe, args))
    trainer, tokenizer, plan = run.trainer, run.tokenizer, run.plan
    assert (
        plan.choice.preset == chosen and recipe.preset == "small"
    )  # the plan chose; the user's arguments stay as given
    # Each size is measured first at its smallest batch: one that reaches no min_updates there goes no further.
    assert set(plan.record.measured) == {"small/fp32/sdpa@512"} | (
        {"tiny/fp32/sdpa@1024", "tiny/fp32/sdpa@512"} if chosen == "tiny" else {"small/fp32/sdpa@1024"}
    )
    assert f"the {chosen} model (small, tiny: " in plan.summary() and "the Trainer's own update" in plan.summary()
    # The plan's update: the calibration's times what the real Trainer took over it on the run's batches.
    assert plan.update.seconds_per_update == pytest.approx(
        plan.update.calibrated_seconds_per_update * plan.update.trainer_ratio
    )
    assert plan.record.trial["trainer_seconds"] > 0 and plan.update.trainer_ratio != 1.0
    assert plan.choice.max_tokens == (1024 if chosen == "small" else 512)  # none reaches: the smallest of each choice
    # The deadline keeps the chosen model's own finishing (its measured checkpoint, the recipe's averaging), not
    # the margin kept before the plan had a model: the first re-plan gives the rest to training.
    clock, panels = run.training.budget.clock, attention_map_panels(trainer.model.config)
    assert plan.costs.checkpoint_seconds > 0 and panels == (3 * 4 if chosen == "small" else 2 * 4)
    assert clock.finishing == finishing_seconds(plan.costs.checkpoint_seconds, recipe.average_last, panels)
    assert clock.finishing < FINISHING_SECONDS
    # The model trained is the chosen preset's, with the initial weights the seed gives it when asked for directly.
    direct = build_model(dataclasses.replace(recipe, preset=chosen, preset_choices=None), tokenizer, seed=3)
    assert trainer.model.config.d_model == direct.config.d_model
    for (name, value), expected in zip(trainer.model.state_dict().items(), direct.state_dict().values(), strict=True):
        assert torch.equal(value, expected), name
    with pytest.raises(ValueError, match=r"preset_choices='small,huge' is invalid"):
        preset_choices(dataclasses.replace(recipe, preset_choices="small,huge"))


def _staged_plan(tmp_path, monkeypatch, recipe: ModelDataArguments):
    """The plan of `recipe` (bf16 and tf32, eager and sdpa open) on the 200-pair fixture, its updates timed by a
    stand-in (an update's time grows with the batch and the width; bf16 pays a fixed extra, tf32 a share of the
    batch; eager a fifth more): (the plan, (width, batch, candidate) in the order timed, the checkpoints timed)."""
    from hf_vanilla_transformer.training.budget import calibration as calibration_module
    from hf_vanilla_transformer.training.budget import measuring as measuring_module
    from hf_vanilla_transformer.training.budget import planner as planner_module
    from hf_vanilla_transformer.training.budget.calibration import Timing, UpdateChoices, candidate_key
    from hf_vanilla_transformer.training.budget.clock import BudgetClock
    from hf_vanilla_transformer.training.run_data import prepare_data
    from hf_vanilla_transformer.utils.stages import SetupClock

    args = TransformerTrainingArguments(output_dir=str(tmp_path / "run"), use_cpu=True, disable_tqdm=True)
    settings = dataclasses.replace(
        settle(recipe, args), choices=UpdateChoices(("bf16", "tf32"), ("eager", "sdpa"), (False,), True)
    )
    started = time.time()
    clock = BudgetClock.starting(started, recipe.max_minutes)
    data = prepare_data(settings, clock, SetupClock(started))
    widths = {}
    measured = []  # (width, size, candidate key) in the order measured

    def stand_in(model, batches, candidates, *args, **kwargs):
        width, size = model.config.d_model, batches[0]["size"]
        timings = {}
        for candidate in candidates:
            measured.append((width, size, candidate_key(*candidate)))
            timings[candidate_key(*candidate)] = Timing(update_seconds(width, size, candidate[0], candidate[1]) / 50)
        return timings

    checkpoints = []
    monkeypatch.setattr(calibration_module, "measure_updates", stand_in)
    monkeypatch.setattr(calibration_module.Calibration, "batches", lambda self, size, count, taken: [{"size": size}])
    monkeypatch.setattr(
        measuring_module, "measure_checkpoint_seconds", lambda model, near=None: checkpoints.append(near) or 0.01
    )
    monkeypatch.setattr(planner_module, "trainer_ratio", lambda inputs, *chosen: (1.0, [], None))
    model = build_model(recipe, data.tokenizer, recipe.preset)
    build = lambda preset: widths.setdefault(preset, build_model(recipe, data.tokenizer, preset))  # noqa: E731
    return (
        planner_module.plan_run(planner_module.plan_inputs(settings, data, clock, build), model),
        measured,
        checkpoints,
    )


def test_a_cut_warmup_is_said_in_the_plan_line_after_the_rule_that_set_it(tmp_path):
    """A fine-tuning start's warmup (1,000 by `warmup_by_start_bleu`) cut to 35% of a 20-update run: the plan line
    names the rule's warmup, then the cut, and the plan's record holds both; an uncut warmup says no cut."""
    from hf_vanilla_transformer.training.budget import planner as planner_module
    from hf_vanilla_transformer.training.budget.clock import BudgetClock
    from hf_vanilla_transformer.training.run_data import prepare_data
    from hf_vanilla_transformer.utils.stages import SetupClock

    recipe = _small_or_tiny(preset="tiny", preset_choices=None, max_tokens_choices=None, max_warmup_fraction=0.35)
    args = TransformerTrainingArguments(
        output_dir=str(tmp_path / "run"), use_cpu=True, disable_tqdm=True, max_steps=20, warmup_steps=4
    )
    settings = dataclasses.replace(settle(recipe, args), start_warmups=((20.0, 1000.0),))
    started = time.time()
    clock = BudgetClock.starting(started, None)
    data = prepare_data(settings, clock, SetupClock(started))
    model = build_model(recipe, data.tokenizer, "tiny")
    far = settings.for_start({"bleu": 5.0})
    plan = planner_module.plan_run(planner_module.plan_inputs(far, data, clock), model)
    assert plan.schedule.warmup_steps == 7  # 35% of 20
    line = plan.record.reasons[-1]
    rule = "(warmup 1,000 for a start of validation BLEU 5.00: warmup_by_start_bleu)"
    assert line.startswith("warmup 7 updates") and f"{rule} (warmup cut from 1,000 to 7: max_warmup_fraction)" in line
    assert {"rule": "max_warmup_fraction", "said": "warmup cut to 7"} in plan.record.rules
    near = planner_module.plan_run(planner_module.plan_inputs(settings, data, clock), model)  # the recipe's 4: uncut
    assert near.schedule.warmup_steps == 4 and "cut" not in near.record.reasons[-1]
    assert not [rule for rule in near.record.rules if rule["rule"] == "max_warmup_fraction"]
    # A warmup given as a fraction of the run (half: 10 updates) is cut as well, and said so.
    half = dataclasses.replace(settings, rate=dataclasses.replace(settings.rate, warmup=0.5))
    plan = planner_module.plan_run(planner_module.plan_inputs(half, data, clock), model)
    assert (
        plan.schedule.warmup_steps == 7 and "(warmup cut from 10 to 7: max_warmup_fraction)" in plan.record.reasons[-1]
    )
    assert {"rule": "max_warmup_fraction", "said": "warmup cut to 7"} in plan.record.rules


def test_the_plans_checkpoint_is_timed_in_the_output_folder_and_leaves_nothing_there(tmp_path):
    """The plan times a checkpoint where the run's checkpoints go (the same disk, not a memory-backed /tmp), in a
    temporary folder it removes; where the output folder is not there, in the system's temporary folder."""
    from hf_vanilla_transformer.training.budget.measuring import measure_checkpoint_seconds

    written = []

    class Written(VanillaTransformerForConditionalGeneration):  # the model itself, saying where it was written
        def save_pretrained(self, folder, *args, **kwargs):
            written.append((Path(folder), sorted(os.listdir(folder))))
            return super().save_pretrained(folder, *args, **kwargs)

    model = Written(tiny_model().config)
    (tmp_path / ".timed-checkpoint-killed").mkdir()  # a killed run's: removed; a link to a folder: left as it is
    (tmp_path / ".timed-checkpoint-killed" / "optimizer.pt").write_bytes(b"0")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / ".timed-checkpoint-link").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    assert measure_checkpoint_seconds(model, tmp_path) > 0
    assert sorted(path.name for path in tmp_path.iterdir()) == [".timed-checkpoint-link", "elsewhere"]
    (tmp_path / ".timed-checkpoint-link").unlink()
    (tmp_path / "elsewhere").rmdir()
    ((folder, before),) = written
    assert folder.parent == tmp_path and folder.name.startswith(".timed-checkpoint-") and before == []
    measure_checkpoint_seconds(model, tmp_path / "not-made")
    assert written[1][0].parent == Path(tempfile.gettempdir()) and not (tmp_path / "not-made").exists()


def update_seconds(width: int, size: int, precision: str, attention: str) -> float:
    """The stand-in's seconds of an update of a model `width` wide on batches of `size` tokens (`_staged_plan`)."""
    share = {"bf16": 0.5, "tf32": 1.0}[precision] * size / 512 + {"bf16": 0.9, "tf32": 0.0}[precision]
    return share * width / 128 * (1.2 if attention == "eager" else 1.0)


def test_the_precision_is_chosen_at_the_largest_batch_and_a_size_too_slow_at_its_smallest_is_measured_no_further(
    tmp_path, monkeypatch
):
    """The H100's check measured the precisions of big at 4,096 tokens (the smallest batch) and chose tf32, a
    launch-bound update's fastest, for a run that then trained at 25,000. With stand-in timings: the precisions and
    attentions are measured on the first size at the largest batch, each size first at its smallest batch, and one
    too slow there (base) has no other batch size, checkpoint or decoding step measured."""
    recipe = _small_or_tiny(
        preset="base", preset_choices="base,small,tiny", min_updates=20_000, max_minutes=30, checkpoints_per_run=4
    )
    plan, measured, checkpoints = _staged_plan(tmp_path, monkeypatch, recipe)
    base, small = 512, 256
    stages = [(width, size) for width, size, _ in measured]
    # 1. base's precisions and attentions at the largest batch (1,024); bf16 wins there, tf32 at 512 would have.
    keys = {f"{p}/{a}" for p in ("bf16", "tf32") for a in ("eager", "sdpa")}
    assert stages[:4] == [(base, 1024)] * 4 and {key for _, _, key in measured[:4]} == keys
    assert update_seconds(base, 1024, "bf16", "sdpa") < update_seconds(base, 1024, "tf32", "sdpa")
    assert update_seconds(base, 512, "tf32", "sdpa") < update_seconds(base, 512, "bf16", "sdpa")
    # 2. base at its smallest batch only: too slow for 20,000 updates there; small at 512, then at 1,024.
    assert stages[4:] == [(base, 512), (small, 512), (small, 1024)] and plan.choice.preset == "small"
    assert (plan.choice.precision, plan.choice.attn_implementation) == ("bf16", "sdpa")
    assert len(checkpoints) == 1  # small's: base was not measured that far
    assert "base/bf16/sdpa@512" in plan.record.measured and "base/bf16/sdpa@1024" in plan.record.measured


def test_one_size_is_chosen_at_its_largest_batch_then_timed_at_its_smallest_then_at_the_rest(tmp_path, monkeypatch):
    """One model size: the measuring step stages the choice at the largest batch, then times the chosen update alone
    (a stage of one) at the smallest and then at the batches between, each once; the choice said in words."""
    recipe = _small_or_tiny(
        preset="tiny", preset_choices=None, max_tokens_choices="1024,768,512", max_minutes=30, checkpoints_per_run=4
    )
    plan, measured, checkpoints = _staged_plan(tmp_path, monkeypatch, recipe)
    tiny = 32
    keys = {f"{p}/{a}" for p in ("bf16", "tf32") for a in ("eager", "sdpa")}
    assert [(width, size) for width, size, _ in measured[:4]] == [(tiny, 1024)] * 4
    assert {key for _, _, key in measured[:4]} == keys
    assert update_seconds(tiny, 1024, "bf16", "sdpa") < update_seconds(tiny, 1024, "tf32", "sdpa")  # no tie
    assert measured[4:] == [(tiny, 512, "bf16/sdpa"), (tiny, 768, "bf16/sdpa")]
    assert set(plan.record.measured) == {*(f"{key}@1024" for key in keys), "bf16/sdpa@512", "bf16/sdpa@768"}
    assert checkpoints == [str(tmp_path / "run")]  # one timed, on the disk of the run's own checkpoints
    assert plan.record.reasons[1].startswith("bf16: ")
    assert "per update against" in plan.record.reasons[1] and "in tf32" in plan.record.reasons[1]


# ---------------------------------------------------------------------------------------------------------------------
# Recipes as files
# ---------------------------------------------------------------------------------------------------------------------


def test_the_cpu_recipe_file_reads_as_flags_that_the_command_line_overrides(tmp_path):
    recipe, args = parse_arguments(["--output_dir", str(tmp_path)], default_recipe="cpu")
    check_schedule_arguments(args)
    assert (recipe.preset, recipe.vocab_size, recipe.max_tokens, recipe.dropout) == ("small", 8000, 1024, 0.0)
    assert (recipe.max_minutes, recipe.precision, recipe.attn_implementation) == (26, "auto", "auto")
    assert (recipe.checkpoints_per_run, recipe.evaluations_per_run, recipe.average_last) == (12, 6, 5)
    assert (args.warmup_steps, recipe.max_warmup_fraction, recipe.peak_learning_rate) == (1000, 0.35, 0.0019764)
    assert recipe.lr_reference_tokens == 2048  # the peak's update size: 1,024-token updates peak at 1.40e-3
    assert (recipe.max_tokens_choices, recipe.min_updates) == (None, 4000)
    assert (recipe.preset_choices, recipe.length_penalty_choices) == ("medium,small,compact", "0.6,1.0,1.5")
    assert (recipe.size_min_updates, recipe.dropout_by_epochs) == ("medium:20000", "8:0.1")
    assert (recipe.max_epochs, recipe.plateau_validations) == (None, 3)
    assert args.max_steps == -1 and args.use_cpu and recipe.recipe == "cpu"
    recipe, args = parse_arguments(
        ["--recipe", "cpu", "--output_dir", str(tmp_path), "--max_minutes", "5", "--bf16", "false", "--seed", "2"]
    )
    assert recipe.max_minutes == 5 and recipe.precision == "fp32" and args.seed == 2 and not args.bf16
    _, args = parse_arguments(["--recipe", "cpu", "--output_dir", str(tmp_path), "--bf16", "true"])
    assert args.bf16


def test_the_papers_recipes_are_files_too(tmp_path):
    base, base_args = parse_arguments(["--recipe", "base", "--output_dir", str(tmp_path)])
    assert (base.preset, base.vocab_size, base.tokens_per_update, base.average_last) == ("base", 37000, 25000, 5)
    assert (base_args.warmup_steps, base_args.max_steps, base.save_minutes) == (4000, 100000, 10)
    big, big_args = parse_arguments(["--recipe", "big", "--output_dir", str(tmp_path)])
    assert (big.preset, big.average_last, big_args.max_steps) == ("big", 20, 300000)


def test_a_bad_recipe_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"recipe 'fast' not found.*\['base', 'big', 'cpu', 'finetune', 'gpu'\]"):
        read_recipe("fast")
    mine = tmp_path / "mine.yaml"
    mine.write_text("preset: small\nlerning_rate: 3\n")
    with pytest.raises(ValueError, match=r"mine.yaml: \['lerning_rate'\] are not flags"):
        read_recipe(mine)
    mine.write_text("- preset\n")
    with pytest.raises(ValueError, match="holds a list; expected a mapping"):
        read_recipe(mine)


# ---------------------------------------------------------------------------------------------------------------------
# Budgeted runs of the train script
# ---------------------------------------------------------------------------------------------------------------------


def budgeted_command(output: Path, minutes: float, *extra: str) -> list[str]:
    return [
        sys.executable,
        str(ROOT / "scripts" / "train.py"),
        *("--recipe", "cpu", "--preset", "tiny", "--max_minutes", str(minutes), "--output_dir", str(output)),
        *("--data_files", TRAIN_200, "--validation_files", TEST_40, "--test_files", TEST_40),
        *("--max_eval_samples", "10", "--disable_tqdm", "true"),
        *("--source_check", "warn"),  # a tiny model does not learn to read its source in a minute
        *extra,
    ]


def plateau_stop(results: dict) -> int | None:
    """The update at which validation BLEU's plateau stopped a run (`results.json`), or None."""
    return (results.get("plateau") or {}).get("stopped_at")


def environment() -> dict:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_VANILLA_TRANSFORMER_ALLOCATOR": "system"}


@pytest.mark.slow
def test_a_one_minute_budget_stops_on_its_own_and_leaves_a_complete_folder(tmp_path):
    output = tmp_path / "run"
    result = subprocess.run(budgeted_command(output, 1), capture_output=True, text=True, timeout=300, env=environment())
    assert result.returncode == 0, result.stderr[-3000:]
    for name in ("model.safetensors", "tokenizer.json", "results.json", "budget.json", "README.md"):
        assert (output / name).exists(), name
    results = json.loads((output / "results.json").read_text())
    plan = results["plan"]
    assert plan["max_minutes"] == 1 and plan["precision"] in ("fp32", "bf16") and plan["seconds_per_update"] > 0
    # It trains its planned length, or stops at the deadline, or where validation BLEU stopped rising (a plateau:
    # on the 2-core Zen 3 the tiny model's best came at update 50 and the run stopped at 146 of 187).
    steps, plateau = results["training"]["steps"], plateau_stop(results)
    assert steps == plan["max_steps"] or plan["stopped_early_at"] is not None or plateau == steps, (steps, plan)
    # The warmup of the first plan's length, kept by every re-plan (the first check always re-fits the length).
    first = plan["replans"][0]["was"] if plan["replans"] else plan["max_steps"]
    assert plan["warmup_steps"] == max(1, min(1000, round(0.35 * first)))
    assert plan["measured_seconds_per_update"] > 0 and plan["replans"][0]["after"] == "its first updates"
    # What the user asked for beside what the plan chose: the recipe's 1,024 tokens, the plan's pick.
    assert plan["max_tokens"] == results["recipe"]["max_tokens"] == 1024 and results["recipe"]["precision"] == "auto"
    assert "Plan: " in result.stdout and "updates fit" in result.stdout
    # Averaged: only checkpoints from the last third of the run, at any number of epochs (the 200 pairs make 20 or
    # more in a minute on a fast CPU; the recipe leaves `average_last_by_epochs` off).
    steps = [int(name.split("-")[1]) for name in results["averaged_checkpoints"]]
    assert steps[-1] == results["training"]["steps"]
    assert len(steps) <= 5 and min(steps) >= 2 * steps[-1] // 3
    assert "average_last_by_epochs" not in {rule["rule"] for rule in results["rules"]}
    # Where the minute went: the budget less the whole run is what was left unspent (or how far past it), said.
    spent = results["time"]
    assert spent["budget_seconds"] == 60 and spent["unspent_seconds"] == pytest.approx(60 - results["wall_seconds"])
    left = spent["unspent_seconds"] / 60
    said = f"unspent {left:.1f}" if left >= 0 else f"over it by {-left:.1f}"
    assert "of the 1-minute budget: set-up" in result.stdout and said in result.stdout


@pytest.mark.slow
def test_a_killed_budgeted_run_resumes_with_the_number_of_updates_it_fixed(tmp_path):
    """Killed after its first checkpoint, restarted with another budget: the plan of the first start stands."""
    output = tmp_path / "run"
    uncapped = ("--max_epochs", "1000")  # the planned length comes from the measured update time, not the epochs
    process = subprocess.Popen(
        budgeted_command(output, 1, *uncapped),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=environment(),
    )
    try:
        deadline = time.monotonic() + 240
        while not list(output.glob("checkpoint-*/.complete")) and process.poll() is None:
            assert time.monotonic() < deadline, "no checkpoint within 240 s"
            time.sleep(0.02)
        process.send_signal(signal.SIGKILL)
    finally:
        process.wait(timeout=60)
    # The plan of the checkpoint the restart resumes from (budget.json may hold a later re-plan).
    planned = recorded_plan(output, latest_checkpoint(output)).to_dict()
    if (output / "results.json").exists():
        pytest.skip("the run finished before it could be killed (a very fast machine)")
    resumed = subprocess.run(
        budgeted_command(output, 3, *uncapped), capture_output=True, text=True, timeout=300, env=environment()
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "keeping the plan of the run being resumed" in resumed.stderr
    results = json.loads((output / "results.json").read_text())
    assert planned["max_steps"] == results["plan"]["max_steps"]
    # It trains that length, or stops where validation BLEU stopped rising (a plateau: the tiny model on a Zen 3).
    steps, plateau = results["training"]["steps"], plateau_stop(results)
    assert steps == planned["max_steps"] or plateau == steps, (steps, planned["max_steps"], results.get("plateau"))
    assert results["plan"]["max_minutes"] == 1  # the budget of the run that fixed it


@pytest.mark.slow
def test_the_train_script_ends_a_bad_recipe_or_data_file_with_one_line(tmp_path):
    bad = tmp_path / "bad.tsv"
    bad.write_text("only one column\n", encoding="utf-8")
    for args, expected in (
        (["--recipe", "fast"], "train.py: recipe 'fast' not found"),
        (["--recipe", "cpu", "--max_minutes", "0"], "train.py: max_minutes=0 is invalid"),
        (["--recipe", "cpu", "--data_files", str(bad)], f"train.py: {bad}"),
    ):
        result = subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "train.py"), *args, "--output_dir", str(tmp_path / "run")],
            capture_output=True,
            text=True,
            timeout=300,
            env=environment(),
        )
        assert result.returncode == 1, result.stderr[-2000:]
        last = result.stderr.strip().splitlines()[-1]
        assert last.startswith(expected) and "Traceback" not in result.stderr, result.stderr[-2000:]


# ---------------------------------------------------------------------------------------------------------------------
# Re-planning from the run's own updates
# ---------------------------------------------------------------------------------------------------------------------

REFIT_RULES = BudgetRules(
    events=EventRule(checkpoints_per_run=12, evaluations_per_run=6, save_steps=1000, eval_steps=None),
    validates=True,
    # the test pairs and 600 more (three alphas decoded one by one, as before `planner.alpha_searches`)
    held_out=HeldOut(validation_pairs=200, test_sentences=1152 + 3 * 200, test_beams=4),
    room=ReplanRoom(max_updates=None, first_check=125),
)


def with_room(rules: BudgetRules, **room) -> BudgetRules:
    return dataclasses.replace(rules, room=dataclasses.replace(rules.room, **room))


PLANNED = plan_of(max_steps=3101, warmup_steps=1000, save_steps=259, eval_steps=518)


def spacing(plan: BudgetPlan) -> tuple:
    return (plan.schedule.max_steps, plan.schedule.warmup_steps, plan.schedule.save_steps, plan.schedule.eval_steps)


def test_the_refit_length_pays_for_the_checkpoints_and_validations_still_to_come():
    # 1,200 s left after update 125 at 0.27 s per update, 97% of it usable; 12 checkpoints of 1 s and 6 validations
    # of 20 s per run, 96.8% of them still to come: 125 + (1164 - 127.8) / 0.27 = 3,962 updates.
    refit_plan = refit(PLANNED, REFIT_RULES, 125, 0.27, usable(1200.0), 1.0, 20.0)
    assert spacing(refit_plan) == (3962, 1000, 331, 662) and spacing(PLANNED) == (3101, 1000, 259, 518)
    # Slower than planned: shorter, the same number of checkpoints and validations per run, the warmup kept.
    assert spacing(refit(PLANNED, REFIT_RULES, 125, 0.5, usable(1200.0), 1.0, 20.0)) == (2203, 1000, 184, 368)
    # The epoch cap holds; a run out of time ends at the next update (the deadline stops it there).
    capped = with_room(REFIT_RULES, max_updates=3500)
    assert refit(PLANNED, capped, 125, 0.27, usable(1200.0), 1.0, 20.0).schedule.max_steps == 3500
    assert refit(PLANNED, REFIT_RULES, 2000, 0.27, usable(-5.0), 1.0, 20.0).schedule.max_steps == 2001
    with pytest.raises(ValueError, match="seconds_per_update=0"):
        refit(PLANNED, REFIT_RULES, 125, 0.0, usable(1200.0), 1.0, 20.0)


def test_the_averaging_window_follows_a_refit_length(tmp_path):
    # Checkpoints at the refit spacing (331) over 3,962 updates: the last third of the run is averaged.
    steps = [*range(331, 3962, 331), 3962]
    folders = [tmp_path / f"checkpoint-{step}" for step in steps]
    assert [f.name for f in choose_checkpoints(folders, last=5, window=1 / 3)] == [
        "checkpoint-2648",
        "checkpoint-2979",
        "checkpoint-3310",
        "checkpoint-3641",
        "checkpoint-3962",
    ]


def test_the_test_decoding_is_predicted_from_a_validations_decoding_speed():
    # A 12 s validation of 200 pairs at 0.3 s per update: 0.094 s of loss batches, 0.0595 s per greedy sentence;
    # 1,752 sentences with 4 beams at 3 times the cost of a greedy one: 313 s.
    assert REFIT_RULES.predicted_decode_seconds(12.0, 0.3) == pytest.approx(312.90, abs=0.01)
    greedy = dataclasses.replace(REFIT_RULES, held_out=dataclasses.replace(REFIT_RULES.held_out, test_beams=1))
    assert greedy.predicted_decode_seconds(12.0, 0.3) == pytest.approx(104.30, abs=0.01)
    # Where the source check took 2 s of the validation, its two loss passes and the Trainer's took 3 s.
    assert REFIT_RULES.predicted_decode_seconds(12.0, 0.3, 2.0) == pytest.approx(236.52, abs=0.01)
    # Where the prediction steps took 7 s (their decoding, and a loss pass of about half the check's 2 s): 6 s.
    assert REFIT_RULES.predicted_decode_seconds(12.0, 0.3, 2.0, 7.0) == pytest.approx(157.68, abs=0.01)
    # A model that decoded 300 steps where translations as long as the references take 100 (an early validation's,
    # to its length limit): the test decoding of the trained model a third of that, with a tenth's margin.
    ratio = decoding_steps_ratio({"eval_decoding_steps": 300, "eval_reference_steps": 100})
    assert ratio == pytest.approx(1.1 / 3)
    assert REFIT_RULES.predicted_decode_seconds(12.0, 0.3, 2.0, 7.0, ratio) == pytest.approx(157.68 * 1.1 / 3)
    assert decoding_steps_ratio({"eval_prediction_seconds": 7.0}) is None  # not counted: not scaled
    # Translations that stop before half their references' steps: nothing to predict from (0), at half and above
    # the ratio.
    assert decoding_steps_ratio({"eval_decoding_steps": 10, "eval_reference_steps": 293}) == 0.0
    assert decoding_steps_ratio({"eval_decoding_steps": 150, "eval_reference_steps": 300}) == pytest.approx(2.2)


def test_a_batchs_decoding_steps_are_its_longest_rows_padding_left_out():
    pad = 1
    generated = torch.tensor([[0, 5, 6, 2, 1, 1], [0, 7, 8, 9, 9, 2]])  # generate() pads the row that ended
    labels = torch.tensor([[5, 6, 2, -100], [7, 8, 2, -100]])  # the Trainer pads labels with -100 (or pad)
    assert decoding_steps(generated, labels, pad) == (6, 3)
    assert decoding_steps(generated[:1], torch.tensor([[5, 2, 1, 1]]), pad) == (4, 2)


def test_the_meter_counts_training_time_apart_from_warm_updates_validations_and_checkpoints():
    clock = [0.0]
    meter = UpdateMeter(clock=lambda: clock[0])
    meter.start(100)  # a resumed run: its first updates warm up
    for step in range(101, 121):
        clock[0] += 2.0 if step <= 100 + WARM_UPDATES else 0.5
        meter.step(step)
        if step == 110:
            clock[0] += 30.0
            assert meter.pause("validation") == 30.0
            clock[0] += 4.0
            assert meter.pause("checkpoint") == 4.0
    assert meter.updates == 15 and meter.seconds_per_update == pytest.approx(0.5)
    assert meter.typical_pause("validation", 99.0) == 30.0 and meter.typical_pause("checkpoint", 99.0) == 4.0
    assert UpdateMeter().typical_pause("checkpoint", 7.5) == 7.5
    # The re-plans count the validations still to come at the last one's seconds: a model that learned to end its
    # sentences decodes faster than the first validation's did.
    clock[0] += 12.0
    assert meter.pause("validation") == 12.0
    assert meter.latest_pause("validation", 99.0) == 12.0 and meter.typical_pause("validation", 99.0) == 21.0
    assert UpdateMeter().latest_pause("validation", 7.5) == 7.5


def test_the_budget_callback_replans_after_its_first_updates_and_after_each_validation(monkeypatch, tmp_path):
    from transformers import TrainingArguments

    clock = [1000.0]
    plan = PLANNED.but(
        seconds_per_update=0.41,
        predicted_decode_seconds=80.0,
        validation_seconds=20.0,
        checkpoint_seconds=1.0,
    )
    callback = TimeBudgetCallback(plan, clock_of(1400.0, lambda: clock[0], decode=80.0), REFIT_RULES)
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[])
    state, control = TrainerState(max_steps=12404, global_step=0), TrainerControl()
    callback.on_train_begin(args, state, control)
    assert state.max_steps == 3101  # the plan's, not the bound
    assert (callback.plan.schedule.save_steps, callback.plan.schedule.eval_steps) == (259, 518)
    assert state.save_steps == 0  # spaced by the callback from the last event, not by the Trainer's multiples
    for step in range(1, 126):  # 0.27 s per update where 0.41 was planned
        clock[0] += 0.27
        state.global_step = step
        callback.on_step_end(args, state, control)
    first = callback.plan.history.replans[0]
    assert first["at"] == 125 and first["was"] == 3101 and first["seconds_per_update"] == pytest.approx(0.27)
    assert state.max_steps == callback.plan.schedule.max_steps == first["max_steps"] > 4000
    assert callback.plan.schedule.save_steps > 259 and callback.plan.schedule.warmup_steps == 1000
    assert json.loads((tmp_path / "budget.json").read_text())["max_steps"] == state.max_steps  # recorded
    # A validation that decodes slower than planned: the test decoding is predicted longer, the run shorter.
    clock[0] += 60.0
    callback.on_evaluate(args, state, control)
    assert callback.plan.costs.predicted_decode_seconds > 80.0
    assert callback.plan.history.replans[-1]["after"] == "the validation at update 125"
    assert state.max_steps < first["max_steps"]
    # The same validation of a model that decoded three times the references' steps: a third of that, and a margin.
    slow = callback.after_validation(state, 60.0, {}).plan.costs.predicted_decode_seconds
    steps = {"eval_decoding_steps": 3000, "eval_reference_steps": 1000}
    assert callback.after_validation(state, 60.0, steps).plan.costs.predicted_decode_seconds == pytest.approx(
        slow * 1.1 / 3
    )
    # A model that has not begun to translate (each translation ends at once: 10 steps where the references take
    # 293, the Zen 3's 6-minute run at update 44) keeps the prediction it had, where scaled up 32 times it stopped
    # that run at 45 of its 258 updates.
    kept = callback.plan.costs.predicted_decode_seconds
    early = {"eval_decoding_steps": 10, "eval_reference_steps": 293}
    assert callback.after_validation(state, 60.0, early).plan.costs.predicted_decode_seconds == kept
    half = {**early, "eval_decoding_steps": 147}
    assert callback.after_validation(state, 60.0, half).plan.costs.predicted_decode_seconds != kept
    # The validation that ends a run re-plans nothing (the length is what was trained).
    state.global_step, ended = state.max_steps, callback.plan.schedule.max_steps
    control.should_training_stop = True
    clock[0] += 60.0
    callback.on_evaluate(args, state, control)
    assert callback.plan.schedule.max_steps == ended == state.max_steps
    # What a checkpoint carries back: a resumed run keeps the length, with no deadline and no re-planning.
    resumed = TimeBudgetCallback(**callback.state()["args"])
    assert resumed.rules is None and resumed.clock is None
    fresh = TrainerState(max_steps=12404, global_step=600)
    resumed.on_train_begin(args, fresh, TrainerControl())
    assert fresh.max_steps == state.max_steps


def _choice(preset: str, tokens: int, seconds: float) -> dict:
    return {
        "preset": preset,
        "max_tokens": tokens,
        "accumulation": 1,
        "seconds_per_update": seconds,
        "updates_per_epoch": 350 if tokens == 2048 else 700,
    }


CHOICES = [
    _choice("small", 2048, 0.5),
    _choice("small", 1024, 0.27),
    _choice("compact", 2048, 0.35),
    _choice("compact", 1024, 0.19),
]


def test_a_trainer_much_faster_than_calibrated_switches_to_the_largest_choice_that_now_reaches_min_updates():
    rules = dataclasses.replace(REFIT_RULES, min_updates=3000, max_epochs=20)
    plan = plan_of(preset="compact", max_tokens=1024, candidates=CHOICES)
    current = (plan.choice.preset, plan.choice.max_tokens)

    def better(ratio: float, seconds_left: float, rules=rules, current=current) -> Switch | None:
        left = clock_of(seconds_left, now=lambda: 0.0).seconds_left(restart=True, planned=True)
        return better_candidate(plan.record.candidates, current, rules, ratio, left, 1.0, 20.0)

    # 1,300 s left, less 20 s to start again and the whole run's 12 x 1 s + 6 x 20 s, 97% usable: 1,109.6 s. At
    # 0.7 of every calibrated time, small with 2,048 tokens makes 0.35 s per update: 3,170 updates, enough.
    assert better(0.7, 1300.0) == Switch("small", 2048, 1, pytest.approx(0.35), 3170)
    # At 0.8: small with 2,048 reaches 2,774 only; with 1,024 tokens (0.216 s), 5,137.
    assert better(0.8, 1300.0).max_tokens == 1024
    # Small with 2,048 tokens capped at 8 epochs (2,800 updates) is not enough either.
    assert better(0.7, 1300.0, rules=dataclasses.replace(rules, max_epochs=8)).max_tokens == 1024
    # Close to the calibration, or nothing earlier that fits, or no rule to reach: no switch.
    assert better(0.95, 1300.0) is None
    assert better(0.7, 300.0) is None
    assert better(0.5, 1300.0, rules=dataclasses.replace(rules, min_updates=None)) is None
    assert better(0.5, 1300.0, current=("small", 2048)) is None


def test_the_first_check_stops_a_run_whose_choice_proved_wrong_before_any_checkpoint(monkeypatch, tmp_path):
    from transformers import TrainingArguments

    clock = [0.0]
    plan = PLANNED.but(
        preset="compact",
        max_tokens=1024,
        candidates=CHOICES,
        seconds_per_update=0.19,
        checkpoint_seconds=1.0,
        validation_seconds=20.0,
        predicted_decode_seconds=80.0,
    )
    rules = dataclasses.replace(REFIT_RULES, min_updates=3000, max_epochs=20)
    callback = TimeBudgetCallback(plan, clock_of(1325.0, lambda: clock[0], decode=80.0), rules)
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[])
    state, control = TrainerState(max_steps=12404, global_step=0), TrainerControl()
    callback.on_train_begin(args, state, control)
    for step in range(1, 126):  # 0.133 s per update: 0.7 of the calibration
        clock[0] += 0.133
        state.global_step = step
        callback.on_step_end(args, state, control)
    assert control.should_training_stop and not control.should_save
    assert (callback.switch.preset, callback.switch.max_tokens) == ("small", 2048)
    assert callback.switch.seconds_per_update == pytest.approx(0.5 * 0.133 / 0.19)
    assert callback.plan.history.replans == []  # no re-plan of a run that starts again
    # The run started again with that choice is not switched a second time by the same speeds: it re-plans its length.
    clock[0] = 0.0
    again = TimeBudgetCallback(
        plan.but(switched_from={"preset": "compact"}), clock_of(1325.0, lambda: clock[0], 80.0), rules
    )
    state, control = TrainerState(max_steps=12404, global_step=0), TrainerControl()
    again.on_train_begin(args, state, control)
    for step in range(1, 126):
        clock[0] += 0.133
        state.global_step = step
        again.on_step_end(args, state, control)
    assert again.switch is None and not control.should_training_stop
    assert [change["at"] for change in again.plan.history.replans] == [again.rules.room.first_check]


@pytest.mark.slow
def test_a_run_switched_at_its_first_check_starts_again_with_the_choice_and_records_it(tmp_path, monkeypatch):
    from hf_vanilla_transformer.training.budget import deadline
    from hf_vanilla_transformer.training.run import train_and_evaluate

    chosen = {}

    def switch_to_the_first(candidates, current, rules, ratio, *args):  # as if the Trainer were 3x faster than planned
        first = next(c for c in candidates if c["preset"] != current[0])  # the first of another size
        chosen.update(first)
        return Switch(first["preset"], first["max_tokens"], first["accumulation"], first["seconds_per_update"] / 3, 40)

    monkeypatch.setattr(deadline, "better_candidate", switch_to_the_first)
    recipe = _small_or_tiny(
        min_updates=10**9, max_minutes=3, max_tokens=1024, test_beams=1, checkpoints_per_run=4, max_epochs=1000
    )
    args = TransformerTrainingArguments(
        output_dir=str(tmp_path / "run"),
        warmup_steps=10,
        seed=3,
        use_cpu=True,
        disable_tqdm=True,
        report_to=[],
        eval_strategy="no",
    )
    results = train_and_evaluate(settle(recipe, args))
    plan = results["plan"]
    assert plan["switched_from"]["preset"] == "tiny" and plan["switched_from"]["max_tokens"] == 512
    assert plan["switched_from"]["at"] > WARM_UPDATES  # the first check, once the first run's updates were measured
    assert chosen["preset"] == "small" and (plan["preset"], plan["max_tokens"]) == ("small", chosen["max_tokens"])
    assert results["model"]["d_model"] == 256
    assert results["recipe"]["preset_choices"] == "small,tiny"  # what the user asked for, still
    steps = [int(p.name.split("-")[1]) for p in (tmp_path / "run").glob("checkpoint-*")]
    assert max(steps) == results["training"]["steps"] and min(steps) >= plan["save_steps"]  # only the second run's


def spaced_callback(tmp_path, **plan_fields):
    """A budget callback of `PLANNED` with these fields, begun on a Trainer state (its re-plans left to the test,
    no first check): (callback, args, state)."""
    from transformers import TrainingArguments

    plan = PLANNED.but(**plan_fields)
    callback = TimeBudgetCallback(plan, clock_of(10**6), with_room(REFIT_RULES, first_check=10**9))
    callback.replan = lambda *args, **kwargs: None  # the tests set the spacing or the length by hand
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[])
    state = TrainerState(max_steps=12404, global_step=0)
    callback.on_train_begin(args, state, TrainerControl())
    return callback, args, state


def spaced_events(callback, args, state, last: int, respace: dict | None = None) -> dict[str, list[int]]:
    """The updates at which `callback` asks for a checkpoint and a validation over updates 1 … `last`, the
    Trainer's own events apart; `respace` ({update: plan fields}) re-plans the spacing by hand there."""
    events = {"checkpoint": [], "validation": []}
    for step in range(1, last + 1):
        state.global_step = step
        if step in (respace or {}):
            callback.plan = callback.plan.but(**respace[step])
        control = callback.on_step_end(args, state, TrainerControl())
        if control.should_evaluate:
            events["validation"].append(step)
            callback.on_evaluate(args, state, control)
        if control.should_save:
            events["checkpoint"].append(step)
            callback.on_save(args, state, control)
    return events


def test_a_budgeted_runs_checkpoints_and_validations_are_spaced_from_the_last_one(tmp_path):
    """A re-plan that changes the spacing keeps the count per run: the next event comes a spacing after the last
    one, not at the next multiple of the new spacing (the Trainer's rule, which added validations and put two
    checkpoints 60 updates apart into the average of a main job)."""
    callback, args, state = spaced_callback(tmp_path, save_steps=100, eval_steps=200)
    # A re-plan at update 350: checkpoints every 130, validations every 260.
    events = spaced_events(callback, args, state, 1000, respace={350: dict(save_steps=130, eval_steps=260)})
    assert events["checkpoint"] == [100, 200, 300, 430, 560, 690, 820, 950]
    assert events["validation"] == [200, 430, 690, 950]  # at a checkpoint, once its spacing has (nearly) passed


@pytest.mark.parametrize(
    ("max_steps", "saves", "validations"),
    [
        (1001, [100, 200, 300, 400, 500, 600, 700, 800, 900], [200, 400, 600, 800]),  # 1,000: one before the end
        (1060, [100, 200, 300, 400, 500, 600, 700, 800, 900, 1000], [200, 400, 600, 800, 1000]),
        (1049, [100, 200, 300, 400, 500, 600, 700, 800, 900], [200, 400, 600, 800]),
    ],
)
def test_no_checkpoint_or_validation_comes_just_before_the_last_update(tmp_path, max_steps, saves, validations):
    """The last update saves and validates by the Trainer's rule: a spaced event within half its spacing of the end
    would put the run's end twice into the average (a main job re-planned to 6,067 updates saved at 6,066)."""
    callback, args, state = spaced_callback(tmp_path, max_steps=max_steps, save_steps=100, eval_steps=200)
    assert state.max_steps == max_steps
    events = spaced_events(callback, args, state, max_steps - 1)  # the last update's events are the Trainer's
    assert events == {"checkpoint": saves, "validation": validations}


@pytest.mark.parametrize(("new_end", "saves"), [(1001, False), (1200, True)])
def test_a_validation_that_replans_the_end_close_takes_back_its_checkpoint(tmp_path, new_end, saves):
    """A re-plan at a checkpoint's validation to an end within half a spacing (out of time: one more update) leaves
    the save to the last update; a re-plan that leaves room keeps it."""
    callback, args, state = spaced_callback(tmp_path, max_steps=3000, save_steps=100, eval_steps=200)

    def replan(state, after, decode=None, always=False):
        change = {"at": state.global_step, "after": after, "seconds_per_update": 0.2, "max_steps": new_end, "was": 3000}
        return Replan(callback.plan.but(max_steps=new_end), change)

    callback.replan = replan
    callback.meter.seconds, callback.meter.updates = 200.0, 999  # the Trainer's measured speed
    state.global_step = 1000
    control = callback.on_step_end(args, state, TrainerControl())
    assert control.should_save and control.should_evaluate
    callback.on_evaluate(args, state, control, metrics={})
    assert state.max_steps == new_end and control.should_save is saves


def test_the_first_check_at_the_runs_last_update_replans_nothing(tmp_path):
    """A run of 6 updates whose first check comes at its last one: the length is what was trained (a re-plan there
    once recorded 60 updates in results.json and the checkpoint, and a resume trained 54 more)."""
    from transformers import TrainingArguments

    clock = [0.0]
    plan = PLANNED.but(max_steps=6, save_steps=6, eval_steps=None, seconds_per_update=1.0)
    callback = TimeBudgetCallback(plan, clock_of(1000.0, lambda: clock[0]), with_room(REFIT_RULES, first_check=3))
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[])
    state = TrainerState(max_steps=60, global_step=0)
    callback.on_train_begin(args, state, TrainerControl())
    for step in range(1, 7):
        clock[0] += 0.1
        state.global_step = step
        callback.on_step_end(args, state, TrainerControl())
    assert callback.plan.schedule.max_steps == state.max_steps == 6 and callback.plan.history.replans == []


def test_a_recorded_plan_keeps_its_peak_and_fills_an_older_ones_with_the_width_of_its_own_size(tmp_path):
    from types import SimpleNamespace

    from hf_vanilla_transformer.training.budget.record import complete_recorded_plan
    from hf_vanilla_transformer.training.recipes import parse_run

    settings = parse_run(["--output_dir", str(tmp_path)], default_recipe="cpu")
    compact = SimpleNamespace(config=SimpleNamespace(d_model=192))
    recorded = plan_of(preset="compact", max_tokens=1024, warmup_steps=1000, lr_scale=0.7071, peak_learning_rate=1.4e-3)
    assert complete_recorded_plan(recorded, settings, compact).schedule.peak_learning_rate == 1.4e-3  # kept as recorded
    older = recorded.but(lr_scale=None, peak_learning_rate=None, gradient_accumulation_steps=None)
    completed = complete_recorded_plan(older, settings, compact)
    # The recipe's 1.98e-3 for small (d_model 256) at 2,048 tokens, at 1,024 tokens, for compact's width.
    assert completed.schedule.peak_learning_rate == pytest.approx(1.9764e-3 / 2**0.5 * (256 / 192) ** 0.5, rel=1e-4)
    assert completed.choice.gradient_accumulation_steps == 1


def test_the_plan_sets_aside_one_decoding_of_the_validation_pairs_for_every_alpha_together():
    """The choice of alpha decodes the validation pairs once for all its alphas (`translate_each_alpha`), so the plan
    counts them once beside the test split, not once per alpha; none where nothing is chosen."""
    import types

    from hf_vanilla_transformer.training.budget.planner import run_rules

    recipe = types.SimpleNamespace(
        test_beams=4,
        checkpoints_per_run=12,
        evaluations_per_run=6,
        source_check="stop",
        min_updates=4000,
        max_epochs=20,
    )
    args = types.SimpleNamespace(generation_num_beams=1, save_steps=500, eval_steps=None)
    data = types.SimpleNamespace(evaluation=list(range(500)), test=list(range(1152)))
    for alphas, sentences in (((0.6, 1.0, 1.5), 1152 + 500), ((0.6, 1.0, 1.5, 2.0, 3.0), 1152 + 500), ((), 1152)):
        settings = types.SimpleNamespace(recipe=recipe, args=args, validates=True, alphas=alphas, size_min_updates={})
        assert run_rules(settings, data).held_out.test_sentences == sentences, alphas
    no_validation = types.SimpleNamespace(evaluation=None, test=list(range(1152)))
    assert run_rules(settings, no_validation).held_out.test_sentences == 1152
