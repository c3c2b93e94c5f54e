"""The rules that make the recipe hold from a few minutes to hours (issue 63): the sizes grow with the budget
(`size_min_updates`, measured only where the anchor's time allows), dropout follows the predicted epochs
(`dropout_by_epochs`), a plateau of validation BLEU ends a run early and says so (`plateau_validations`), the
collapse guard judges a model only once it has seen an epoch, the measuring step keeps the budget, and the
checkpoints averaged follow the epochs made where a recipe asks for it (`average_last_by_epochs`, off in `cpu`)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from test_budget import _small_or_tiny, _staged_plan
from transformers import TrainerControl, TrainerState

from hf_vanilla_transformer.training.arguments import ModelDataArguments, TransformerTrainingArguments
from hf_vanilla_transformer.training.averaging import averaging_for, choose_checkpoints
from hf_vanilla_transformer.training.budget import BudgetClock, BudgetError, apply_plan
from hf_vanilla_transformer.training.budget.calibration import measure_updates
from hf_vanilla_transformer.training.budget.plan import BudgetPlan
from hf_vanilla_transformer.training.budget.schedule import EventRule, dropout_for, event_spacing
from hf_vanilla_transformer.training.callbacks import PlateauCallback
from hf_vanilla_transformer.training.choices import average_last_by_epochs, dropout_by_epochs, size_min_updates
from hf_vanilla_transformer.training.collapse import NOTHING_BELOW, SourceCheckCallback
from hf_vanilla_transformer.training.recipes import parse_arguments, read_recipe
from hf_vanilla_transformer.training.results import fired_rules
from hf_vanilla_transformer.training.run import train_and_evaluate
from hf_vanilla_transformer.training.settings import settle

from conftest import FIXTURES, plan_of, tiny_model


BASE, SMALL = 512, 256


def test_a_larger_size_is_measured_only_where_the_anchors_time_allows_its_updates(tmp_path, monkeypatch):
    """With `size_min_updates` naming base, small (the first size it does not name) is measured first and chooses
    the precision and attention; base, whose update is never faster, is not measured at all where small's time
    cannot give base's updates, and small trains; where it can, base is measured, with small's choice, and chosen."""
    recipe = _small_or_tiny(
        preset="base", preset_choices="base,small,tiny", size_min_updates="base:100000000", min_updates=1,
        max_minutes=30, checkpoints_per_run=4,
    )  # fmt: skip
    plan, measured, _ = _staged_plan(tmp_path / "a", monkeypatch, recipe)
    assert [(width, size) for width, size, _ in measured[:4]] == [(SMALL, 1024)] * 4  # the anchor chooses
    assert all(width != BASE for width, _, _ in measured) and plan.choice.preset == "small"
    assert "its updates: base 100,000,000, small 1" in plan.summary()
    assert plan.record.rules[0] == {"rule": "preset_choices", "said": "size small"}
    recipe = _small_or_tiny(
        preset="base", preset_choices="base,small,tiny", size_min_updates="base:2", min_updates=1, max_minutes=30,
        checkpoints_per_run=4,
    )  # fmt: skip
    plan, measured, _ = _staged_plan(tmp_path / "b", monkeypatch, recipe)
    assert [(width, size) for width, size, _ in measured[:4]] == [(SMALL, 1024)] * 4
    assert [(width, size) for width, size, _ in measured if width == BASE] == [(BASE, 512), (BASE, 1024)]
    assert {key for width, _, key in measured if width == BASE} == {f"{plan.choice.precision}/sdpa"}
    assert plan.choice.preset == "base" and plan.record.rules[0]["said"] == "size base"
    # What a switch may choose, in the recipe's order (the first that fits is taken), not in the order measured.
    order = [candidate["preset"] for candidate in plan.record.candidates]
    assert order[0] == "base" and order == sorted(order, key=["base", "small", "tiny"].index)
    with pytest.raises(ValueError, match=r"size_min_updates='base:many' holds 'base:many'; expected size:updates"):
        size_min_updates(ModelDataArguments(size_min_updates="base:many"))
    assert size_min_updates(ModelDataArguments(size_min_updates="base:12000, medium:6000")) == {
        "base": 12000,
        "medium": 6000,
    }


def test_dropout_follows_the_epochs_the_plan_predicts(tmp_path, monkeypatch):
    """`dropout_by_epochs`: the dropout of the last step the predicted epochs reach, none below the first (the
    model's own); the plan holds it and says why, the Trainer's model gets it in every module that applies §5.4's
    dropout; a dropout given on the command line is the run's whatever its epochs."""
    steps = dropout_by_epochs(ModelDataArguments(dropout_by_epochs="25:0.3, 12:0.1"))
    assert steps == [(12.0, 0.1), (25.0, 0.3)]
    assert (dropout_for(steps, 11.9), dropout_for(steps, 12.0), dropout_for(steps, 40)) == (None, 0.1, 0.3)
    with pytest.raises(ValueError, match=r"dropout_by_epochs='12:1.5' holds '12:1.5'"):
        dropout_by_epochs(ModelDataArguments(dropout_by_epochs="12:1.5"))
    recipe = _small_or_tiny(preset="tiny", preset_choices=None, max_minutes=30, dropout_by_epochs="0:0.3")
    plan, _, _ = _staged_plan(tmp_path / "a", monkeypatch, recipe)
    assert plan.choice.dropout == 0.3 and "dropout 0.3 for " in plan.summary()
    assert {"rule": "dropout_by_epochs"}.items() <= plan.record.rules[-1].items()
    recipe = _small_or_tiny(preset="tiny", preset_choices=None, max_minutes=30, dropout_by_epochs="1e9:0.3")
    plan_none, _, _ = _staged_plan(tmp_path / "b", monkeypatch, recipe)
    assert plan_none.choice.dropout is None and plan_none.record.rules == []
    model = tiny_model()
    apply_plan(plan, TransformerTrainingArguments(output_dir=str(tmp_path), use_cpu=True), model)
    assert model.config.dropout == 0.3 and model.model.encoder.dropout == 0.3
    assert {layer.dropout for layer in model.model.decoder.layers} == {0.3}
    assert model.model.decoder.layers[0].self_attn.attention_dropout == 0.0  # not §5.4's: left alone
    recipe, _ = parse_arguments(["--recipe", "cpu", "--output_dir", str(tmp_path), "--dropout", "0.2"])
    assert recipe.dropout == 0.2 and recipe.dropout_by_epochs is None


def test_the_checkpoints_averaged_follow_the_epochs_of_the_run(tmp_path, monkeypatch):
    """`average_last_by_epochs`: a run whose epochs reach a step's averages that step's count of checkpoints, its
    window widened to hold them from its last checkpoint back (half a spacing to spare; a run stopped early too),
    never narrowed; below the first step, the recipe's count and window. The plan predicts the count from its
    epochs, says it and records it (a resumed run reads it back; the budget's margin after the test decoding counts
    the checkpoints it reads); a count or a window given turns the rule off."""
    steps = average_last_by_epochs(ModelDataArguments(average_last_by_epochs="30:10, 20:8"))
    assert steps == [(20.0, 8), (30.0, 10)]
    for bad in ("20:2.5", "20:0", "-1:8", "many:8"):
        with pytest.raises(ValueError, match=rf"average_last_by_epochs='{bad}' holds '{bad}'; expected epochs:"):
            average_last_by_epochs(ModelDataArguments(average_last_by_epochs=bad))
    assert averaging_for(steps, 19.9, 1000, 12000, 1 / 3) is None
    assert averaging_for(steps, 20.0, 1000, 12000, 1 / 3) == (8, 0.625)
    assert averaging_for(steps, 35.0, 1000, 12000, 1 / 3) == (10, 0.7916666666666666)
    assert averaging_for(steps, 20.0, 1000, 12000, 0.9) == (8, 0.9)  # never narrower than the recipe's
    assert averaging_for(steps, 35.0, 2000, 12000, 1 / 3) == (10, 1.0)  # at most the whole run
    # The recipe's 12 checkpoints a run, wherever the run ends (its planned length, or stopped early by its deadline
    # between two checkpoints or by its plateau at one): the rule's window holds its count; the recipe's holds its 5
    # where the run ends as planned.
    recipe, _ = parse_arguments(["--recipe", "cpu", "--output_dir", str(tmp_path), "--average_last_by_epochs", "20:8"])
    (epochs, count), *_ = average_last_by_epochs(recipe)
    for max_steps in (9004, 12854, 22295, 25666):
        save, _ = event_spacing(max_steps, EventRule(recipe.checkpoints_per_run, recipe.evaluations_per_run))
        for stop in (max_steps, 10 * save + save // 2, 10 * save, 8 * save):
            saved = [Path(f"checkpoint-{step}") for step in (*range(save, stop, save), stop)]
            last, window = averaging_for(average_last_by_epochs(recipe), epochs, save, stop, recipe.average_window)
            assert choose_checkpoints(saved, last, window) == saved[-count:], (max_steps, stop)
            if stop == max_steps:
                assert len(saved) == 12 and choose_checkpoints(saved, 5, recipe.average_window) == saved[-5:]
    # The plan's prediction, said and recorded, and read back from its record.
    recipe = _small_or_tiny(preset="tiny", preset_choices=None, max_minutes=30, average_last_by_epochs="0:3")
    plan, _, _ = _staged_plan(tmp_path / "a", monkeypatch, recipe)
    assert plan.choice.average_last == 3 and "; the last 3 checkpoints averaged for " in plan.summary()
    assert {"rule": "average_last_by_epochs"}.items() <= plan.record.rules[-1].items()
    assert BudgetPlan.from_dict(plan.to_dict()).choice.average_last == 3
    recipe = _small_or_tiny(preset="tiny", preset_choices=None, max_minutes=30, average_last_by_epochs="1e9:3")
    plan_none, _, _ = _staged_plan(tmp_path / "b", monkeypatch, recipe)
    assert plan_none.choice.average_last is None and plan_none.record.rules == []
    assert "checkpoints averaged" not in plan_none.summary()
    # The recipes leave it off (its pairs won twice on the AMX Xeon and lost once on the Zen 4: docs/cpu_recipe.md).
    # In a recipe file that asks for it, a count or a window given on the command line is the run's, whatever its
    # epochs; both with the rule, the rule.
    assert read_recipe("cpu")["average_last_by_epochs"] is None
    recipe, _ = parse_arguments(["--recipe", "finetune", "--output_dir", str(tmp_path), "--model_name_or_path", "m"])
    assert recipe.average_last_by_epochs is None and recipe.average_last == read_recipe("cpu")["average_last"]
    asking = tmp_path / "long.yaml"
    asking.write_text('extends: cpu\naverage_last_by_epochs: "20:8"\n')
    recipe, _ = parse_arguments(["--recipe", str(asking), "--output_dir", str(tmp_path)])
    assert recipe.average_last_by_epochs == "20:8"
    for flags in (["--average_last", "3"], ["--average_window", "0.5"]):
        recipe, _ = parse_arguments(["--recipe", str(asking), "--output_dir", str(tmp_path), *flags])
        assert recipe.average_last_by_epochs is None, flags
    given = ["--average_last", "3", "--average_last_by_epochs", "9:4"]
    recipe, _ = parse_arguments(["--recipe", "cpu", "--output_dir", str(tmp_path), *given])
    assert (recipe.average_last, recipe.average_last_by_epochs) == (3, "9:4")


@pytest.mark.slow  # a tiny run of 40 updates in this process: about 10 s
def test_a_run_averages_the_checkpoints_its_epochs_choose(tmp_path):
    """A run whose epochs reach the rule's step averages the rule's count (3 of its 4 checkpoints: 20, 30, 40), where
    the recipe's own (the last 2 from the last third) would have averaged 30 and 40; results.json says which, and
    why."""
    recipe = ModelDataArguments(
        preset="tiny", vocab_size=500, data_files=str(FIXTURES / "libreoffice_help_en_de_200.tsv"),
        test_files=str(FIXTURES / "libreoffice_help_en_de_test_40.tsv"), precision="fp32", attn_implementation="sdpa",
        test_beams=1, checkpoints_per_run=4, average_last=2, average_last_by_epochs="0:3",
    )  # fmt: skip
    args = TransformerTrainingArguments(
        output_dir=str(tmp_path / "run"), max_steps=40, warmup_steps=10, seed=3, use_cpu=True, disable_tqdm=True,
        report_to=[], eval_strategy="no",
    )  # fmt: skip
    results = train_and_evaluate(settle(recipe, args))
    assert results["averaged_checkpoints"] == ["checkpoint-20", "checkpoint-30", "checkpoint-40"]
    assert results["plan"]["average_last"] == 3
    assert "average_last_by_epochs" in {rule["rule"] for rule in results["plan"]["rules"]}
    made = results["training"]["epochs"]  # the fired rules say the end's choice, on the epochs made
    said = f"the last 3 checkpoints averaged ({made:.1f} epochs made)"
    assert {"rule": "average_last_by_epochs", "said": said} in results["rules"]


def validate(callback, step: int, gain: float, max_steps: int = 5000, warmup: int = 100) -> TrainerControl:
    args = TransformerTrainingArguments(output_dir="unused", warmup_steps=warmup, use_cpu=True)
    state = TrainerState(global_step=step, max_steps=max_steps)
    metrics = {"eval_source_loss": 3.0, "eval_loss_shuffled_sources": 3.0 + gain, "eval_source_gain": gain}
    return callback.on_evaluate(args, state, TrainerControl(), metrics=metrics)


def test_a_model_is_judged_on_its_source_only_after_an_epoch(caplog):
    """The 6-minute run on an AVX2 laptop: 252 updates, a quarter of an epoch, its source worth nothing yet at three
    validations after warmup: not a collapse (it had not begun to read); it ends its run, said in the log. After an
    epoch the same three validations stop a run."""
    nothing = NOTHING_BELOW / 2
    early = SourceCheckCallback("stop", updates_per_epoch=925)
    for step in (168, 210):
        assert not validate(early, step, nothing, max_steps=252).should_training_stop
    assert not validate(early, 252, nothing, max_steps=252).should_training_stop and early.collapsed_at is None
    assert "0.27 epochs of its corpus, before its model read its source" in caplog.text
    assert not any(entry["nothing"] for entry in early.history)
    late = SourceCheckCallback("stop", updates_per_epoch=925)
    assert not validate(late, 900, nothing).should_training_stop  # still before its first epoch: not judged
    for step in (1000, 1100):
        assert not validate(late, step, nothing).should_training_stop
    control = validate(late, 1200, nothing)
    assert control.should_training_stop and late.collapsed_at == 1200
    assert late.record()["judged_after_epochs"] == 1.0 and late.record()["updates_per_epoch"] == 925


def evaluated(callback, step: int, bleu: float, max_steps: int = 1000, epoch: float | None = None) -> TrainerControl:
    args = TransformerTrainingArguments(output_dir="unused", use_cpu=True)
    state = TrainerState(global_step=step, max_steps=max_steps, epoch=epoch)
    return callback.on_evaluate(args, state, TrainerControl(), {"eval_bleu": bleu})


def test_a_plateau_of_validation_bleu_ends_a_run_early_and_says_so(capsys):
    """Three validations in a row without a better BLEU stop training there (saved); a run that keeps improving, or
    whose plateau reaches its last update, is not stopped; results.json's rules say so."""
    plateau = PlateauCallback(3)
    for step, bleu in ((100, 10.0), (200, 12.0), (300, 11.0), (400, 11.9)):
        assert not evaluated(plateau, step, bleu).should_training_stop
    control = evaluated(plateau, 500, 12.0)  # equal is no better
    assert control.should_training_stop and control.should_save and plateau.stopped_at == 500
    assert "Stopped at update 500: validation BLEU has not risen in 3 validations, its best 12.00 at update 200" in (
        capsys.readouterr().out
    )
    assert plateau.record() == {"patience": 3, "stopped_at": 500, "best": {"step": 200, "bleu": 12.0}}
    rising = PlateauCallback(3)
    assert not any(evaluated(rising, 100 * i, float(i)).should_training_stop for i in range(1, 10))
    at_the_end = PlateauCallback(1)
    assert not evaluated(at_the_end, 900, 5.0).should_training_stop
    assert not evaluated(at_the_end, 1000, 4.0).should_training_stop and at_the_end.stopped_at is None
    # Within the first epoch a fall is no plateau (the Zen 4's 6-minute run, 2026-12-03: stopped at 396 of 659
    # updates, 0.43 epochs, its best 0.038 at update 162): it counts only once an epoch is seen, the best as ever.
    young = PlateauCallback(3)
    for step, bleu, epoch in ((162, 0.038, 0.18), (214, 0.030, 0.23), (286, 0.015, 0.31), (358, 0.008, 0.39)):
        assert not evaluated(young, step, bleu, epoch=epoch).should_training_stop
    assert young.since == 0 and young.best == (162, 0.038)
    evaluated(young, 900, 5.0, epoch=0.97)  # a better one, still within the epoch
    for step, epoch in ((1000, 1.08), (1100, 1.19)):
        assert not evaluated(young, step, 4.0, max_steps=2000, epoch=epoch).should_training_stop
    assert evaluated(young, 1200, 4.5, epoch=1.3, max_steps=2000).should_training_stop and young.stopped_at == 1200
    plan = plan_of(rules=[{"rule": "preset_choices", "said": "size medium"}])
    results = {"plan": {"ended_by": "validation plateau"}, "plateau": plateau.record()}
    assert [rule["said"] for rule in fired_rules(plan, results)] == ["size medium", "stopped at 500"]
    # The averaging the plan predicted is not what fired: the end's choice on the epochs made is (a run predicted
    # at 20 epochs that its plateau stopped at 15 averaged the recipe's 5; one predicted at 15 that ran to 21, 8).
    predicted = {"rule": "average_last_by_epochs", "said": "the last 8 checkpoints averaged (20.5 epochs predicted)"}
    plan = plan_of(rules=[{"rule": "preset_choices", "said": "size medium"}, predicted])
    assert [rule["said"] for rule in fired_rules(plan, results)] == ["size medium", "stopped at 500"]
    made = {"rule": "average_last_by_epochs", "said": "the last 8 checkpoints averaged (21.0 epochs made)"}
    assert fired_rules(plan, results, made) == [
        plan.record.rules[0],
        made,
        {"rule": "plateau_validations", "said": "stopped at 500"},
    ]


def test_the_measuring_stops_when_the_budget_is_spent():
    """The issue's run: a 2-minute budget measured base for 7.6 minutes beside another process. The budget's clock
    is asked before every update the calibration times: once the budget is spent, the measuring ends with a
    BudgetError naming it (no candidate is marked failed); with time left it measures as before."""
    model, batch = tiny_model(), {"input_ids": torch.tensor([[5, 6, 2]]), "labels": torch.tensor([[7, 2]])}
    spent = BudgetClock(time.monotonic() - 130, 120.0)
    with pytest.raises(BudgetError, match=r"max_minutes=2 leaves no time to train on this machine: the budget was "):
        measure_updates(model, [batch] * 4, [("fp32", "eager", False)], check=spent.check_measuring)
    calls = []

    def third_fails():
        calls.append(1)
        if len(calls) == 3:
            spent.check_measuring()

    with pytest.raises(BudgetError, match="spent while measuring the update"):
        measure_updates(model, [batch] * 4, [("fp32", "eager", False)], check=third_fails)
    left = BudgetClock(time.monotonic(), 600.0)
    timings = measure_updates(model, [batch] * 4, [("fp32", "eager", False)], check=left.check_measuring)
    assert timings["fp32/eager"].failure is None and timings["fp32/eager"].steady > 0
    BudgetClock(time.monotonic(), None).check_measuring()  # no budget: nothing to keep
