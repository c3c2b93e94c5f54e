"""Fine-tuning a model that exists: `--model_name_or_path` takes the `finetune` recipe over this machine's (a recipe
named on the command line keeps its own), with its peak named for the saved model and no size to choose; the run
measures its starting model before the first update and keeps the better of it and the trained one on validation,
saying which (a learning rate that destroys the model keeps the start); `finetune-benchmark` puts the start, the
fine-tuned model and a model trained from scratch side by side, each row its run's own figures."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer

from hf_vanilla_transformer.training import recipes
from hf_vanilla_transformer.training.budget.schedule import dropout_for, learning_rate
from hf_vanilla_transformer.training.models import build_model
from hf_vanilla_transformer.training.recipes import parse_run, read_recipe, recipe_values
from hf_vanilla_transformer.training.start import better_or_equal, fingerprint

from conftest import FIXTURES, ROOT, run_script


TRAIN_200 = FIXTURES / "libreoffice_help_en_de_200.tsv"
TEST_40 = FIXTURES / "libreoffice_help_en_de_test_40.tsv"


def test_a_saved_model_takes_the_finetune_recipe_over_the_machines_and_a_named_recipe_stays(tmp_path, monkeypatch):
    settings = parse_run(["--model_name_or_path", "runs/start", "--output_dir", str(tmp_path)])
    recipe, own = settings.recipe, read_recipe("finetune")
    # The dropout of the run's own predicted epochs (the cpu recipe's steps), not the saved model's.
    assert recipe.recipe == "finetune" and (recipe.dropout, recipe.dropout_by_epochs) == (0.0, "8:0.1")
    assert (recipe.max_tokens, recipe.max_minutes, recipe.max_epochs) == (1024, 26, 20)  # the cpu recipe's
    # The data to adapt to is the run's to name: the help alone on any machine, not the cpu recipe's help and UI.
    assert recipe.dataset == "libreoffice-help" and read_recipe("cpu")["dataset"] == "libreoffice-help-ui"
    assert (recipe.peak_learning_rate, settings.args.warmup_steps) == (own["peak_learning_rate"], own["warmup_steps"])
    # The peak is the saved model's own, at any width and any batch: nothing scales it.
    assert settings.rate.owner_d_model is None and settings.rate.reference_tokens is None
    for width in (256, 512):
        assert learning_rate(settings.rate, width, 100, 4096).peak == pytest.approx(own["peak_learning_rate"])
    dashed = parse_run(["--model-name-or-path", "runs/start", "--output_dir", str(tmp_path)])  # as HfArgumentParser
    assert dashed.recipe.recipe == "finetune"
    # A recipe named on the command line is the run's: the CPU recipe's from-scratch ramp.
    named = parse_run(["--model_name_or_path", "runs/start", "--recipe", "cpu", "--output_dir", str(tmp_path)])
    assert named.recipe.recipe == "cpu" and named.recipe.dropout == 0.0
    # On a GPU the finetune recipe extends the gpu recipe.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert recipe_values("finetune", [])["max_tokens_choices"] == read_recipe("gpu")["max_tokens_choices"]


def test_the_starts_validation_bleu_sets_the_peak_and_warmup_where_the_recipe_says_and_those_given_stay(tmp_path):
    """`peak_by_start_bleu` and `warmup_by_start_bleu`: a start far from its new domain (validation BLEU below the
    bound) gets the larger peak and the longer warmup, one at or above it the recipe's; a --peak_learning_rate or
    --warmup_steps given is the run's whatever the start scores."""
    base = ["--model_name_or_path", "runs/start", "--output_dir", str(tmp_path)]
    settings = parse_run(base)  # the recipe's steps, read by the run's own parsers
    ((bound, peak),), ((warmup_bound, warmup),) = settings.start_peaks, settings.start_warmups
    assert warmup_bound == bound  # one bound: a start below it is far from its new domain
    assert peak > settings.rate.peak and warmup > settings.rate.warmup == read_recipe("finetune")["warmup_steps"]
    far = settings.for_start({"bleu": bound - 5.31})
    assert far.rate == dataclasses.replace(settings.rate, peak=peak, warmup=warmup)
    assert far.fired == (
        {"rule": "peak_by_start_bleu", "said": f"peak {peak:.1e} for a start of validation BLEU {bound - 5.31:.2f}"},
        {
            "rule": "warmup_by_start_bleu",
            "said": f"warmup {warmup:,.0f} for a start of validation BLEU {bound - 5.31:.2f}",
        },
    )
    for near in ({"bleu": bound}, {"bleu": bound + 10.67}, None):  # at the bound, above it, or not measured
        assert settings.for_start(near) is settings
    given = parse_run([*base, "--peak_learning_rate", "2e-4"])
    assert given.recipe.peak_by_start_bleu is None and given.for_start({"bleu": 1.0}).rate.peak == 2e-4
    assert given.for_start({"bleu": 1.0}).rate.warmup == warmup  # the warmup's rule is not the peak's to turn off
    given = parse_run([*base, "--warmup_steps", "300"])
    assert given.recipe.warmup_by_start_bleu is None and given.for_start({"bleu": 1.0}).rate == dataclasses.replace(
        settings.rate, peak=peak, warmup=300
    )
    steps = parse_run([*base, "--warmup_steps", "300", "--warmup_by_start_bleu", "30:600,10:2000"])
    assert [steps.for_start({"bleu": bleu}).rate.warmup for bleu in (5, 15, 40)] == [2000, 600, 300]
    with pytest.raises(ValueError, match=r"warmup_by_start_bleu='20:0.5' holds '20:0.5'; expected bleu:updates"):
        parse_run([*base, "--warmup_by_start_bleu", "20:0.5"])
    steps = parse_run([*base, "--peak_learning_rate", "2e-4", "--peak_by_start_bleu", "30:5e-4,10:1e-3"])
    assert [steps.for_start({"bleu": bleu}).rate.peak for bleu in (5, 15, 40)] == [1e-3, 5e-4, 2e-4]
    with pytest.raises(ValueError, match=r"peak_by_start_bleu='x:1' holds 'x:1'; expected bleu:peak pairs"):
        parse_run([*base, "--peak_by_start_bleu", "x:1"])
    with pytest.raises(ValueError, match=r"holds '20:0'"):
        parse_run([*base, "--peak_by_start_bleu", "20:0"])
    # A model trained from scratch has no start: the recipe's rule does not reach it, nor a bound of no number.
    scratch = parse_run(["--recipe", "finetune", "--output_dir", str(tmp_path)])
    assert scratch.recipe.peak_by_start_bleu and scratch.start_peaks == ()
    with pytest.raises(ValueError, match=r"holds '20:inf'"):
        parse_run([*base, "--peak_by_start_bleu", "20:inf"])


def test_a_recipe_that_extends_itself_is_named(tmp_path, monkeypatch):
    first, second = tmp_path / "first.yaml", tmp_path / "second.yaml"
    first.write_text(f"extends: {second}\nseed: 1\n")
    second.write_text(f"extends: {first}\nseed: 2\n")
    with pytest.raises(ValueError, match="extends .*first.yaml'?, which extends it again"):
        recipe_values(first, [])
    monkeypatch.setattr(recipes, "machine_recipe", lambda argv=None: "cpu")
    second.write_text("extends: machine\nseed: 2\n")
    assert recipe_values(first, [])["seed"] == 1 and recipe_values(first, [])["max_tokens"] == 1024


def test_a_value_a_recipe_file_gives_over_finetune_turns_off_its_rule_as_on_the_command_line(tmp_path):
    """A recipe written over `finetune` that gives a warmup, peak or dropout of its own runs at it, whatever the start
    scores or the run's epochs (the rule that would set it is off), as the same flag on the command line does; one that
    gives the rule too keeps it."""
    base = ["--model_name_or_path", "runs/start", "--output_dir", str(tmp_path)]
    settings = parse_run(base)
    ((bound, peak),), ((_, warmup),) = settings.start_peaks, settings.start_warmups
    mine = tmp_path / "mine.yaml"
    mine.write_text("extends: finetune\nwarmup_steps: 300\n")
    own = parse_run([*base, "--recipe", str(mine)])
    assert own.recipe.warmup_by_start_bleu is None and own.start_warmups == ()
    assert own.for_start({"bleu": bound - 1}).rate == dataclasses.replace(settings.rate, peak=peak, warmup=300)
    mine.write_text("extends: finetune\npeak_learning_rate: 0.0002\ndropout: 0.1\n")
    own = parse_run([*base, "--recipe", str(mine)])
    assert (own.recipe.peak_by_start_bleu, own.recipe.dropout_by_epochs, own.recipe.dropout) == (None, None, 0.1)
    assert own.for_start({"bleu": bound - 1}).rate.peak == 2e-4 and own.dropout_steps == ()
    assert own.for_start({"bleu": bound - 1}).rate.warmup == warmup  # the warmup's rule is not the peak's to turn off
    mine.write_text('extends: finetune\nwarmup_steps: 300\nwarmup_by_start_bleu: "30:600"\n')
    both = parse_run([*base, "--recipe", str(mine)])
    assert [both.for_start({"bleu": bleu}).rate.warmup for bleu in (25, 40)] == [600, 300]
    # Two files deep (mine over theirs over finetune): the value of the top one turns the rule off as well.
    theirs = tmp_path / "theirs.yaml"
    theirs.write_text("extends: finetune\nseed: 3\n")
    mine.write_text(f"extends: {theirs}\nwarmup_steps: 300\n")
    assert parse_run([*base, "--recipe", str(mine)]).start_warmups == ()
    # A null is no value given (the size's own dropout is the rule's own below its first step): the rule stays.
    mine.write_text("extends: finetune\ndropout: null\n")
    assert recipe_values(mine, [])["dropout_by_epochs"] == read_recipe("finetune")["dropout_by_epochs"]
    # Over a recipe without the rule, the value adds no rule: nothing to turn off, nothing written.
    mine.write_text("extends: cpu\nwarmup_steps: 300\n")
    assert "warmup_by_start_bleu" not in recipe_values(mine, []) and recipe_values(mine, [])["warmup_steps"] == 300


def test_the_better_model_is_the_higher_bleu_and_at_equal_bleu_the_higher_chrf():
    start = {"bleu": 20.0, "chrf": 50.0}
    assert better_or_equal({"bleu": 20.5, "chrf": 40.0}, start) and not better_or_equal(
        {"bleu": 19.9, "chrf": 60}, start
    )
    assert better_or_equal({"bleu": 20.001, "chrf": 50.0}, start)  # a tie keeps the trained model
    assert not better_or_equal({"bleu": 0.0, "chrf": 3.0}, {"bleu": 0.0, "chrf": 11.0})  # a weak model's BLEU is 0


@pytest.mark.slow  # a fine-tuning run of the script
def test_a_learning_rate_that_destroys_the_model_keeps_the_one_it_started_from(tmp_path, trained_folder):
    """Fine-tuned at a peak of 3 (the tiny model's own trained at about 0.02): worse on validation than where it
    started, so the folder holds the starting weights, and the log, results.json and the card say so."""
    start, _ = trained_folder
    output = tmp_path / "tuned"
    result = run_script(
        "train.py",
        *("--model_name_or_path", start, "--output_dir", output, "--max_steps", "12", "--save_steps", "6"),
        *("--data_files", TRAIN_200, "--validation_files", TEST_40, "--test_files", TEST_40),
        *("--peak_learning_rate", "3", "--warmup_steps", "2", "--max_eval_samples", "10", "--test_beams", "1"),
        *("--eval_strategy", "no", "--length_penalty_choices", "1", "--disable_tqdm", "true"),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads((output / "results.json").read_text())
    kept = results["kept"]
    assert kept["kept"] == "start" and not better_or_equal(kept["trained"], kept["start"]), kept
    assert kept["start"] == json.loads((output / "start.json").read_text())  # measured before the first update
    assert "Kept: the model it started from" in result.stdout and results["recipe"]["recipe_file"] == "finetune"
    for name, weight in load_file(start / "model.safetensors").items():
        assert torch.equal(load_file(output / "model.safetensors")[name], weight), name
    assert (
        "This folder holds **the model it started from (training made it worse)**" in (output / "README.md").read_text()
    )


@pytest.mark.slow
def test_the_finetune_benchmark_sets_each_runs_own_figures_side_by_side(tmp_path, trained_folder):
    start, _ = trained_folder
    output = tmp_path / "bench"
    command = [sys.executable, str(ROOT / "scripts" / "finetune_benchmark.py"), "--model_name_or_path", str(start)]
    command += ["--output_dir", str(output), "--data_files", str(TRAIN_200), "--validation_files", str(TEST_40)]
    command += ["--test_files", str(TEST_40), "--seeds", "0", "--max_steps", "6", "--max_eval_samples", "10"]
    command += ["--test_beams", "1", "--eval_strategy", "no", "--length_penalty_choices", "1"]
    command += ["--max_warmup_fraction", "1", "--warmup_by_start_bleu", "20:4"]  # a warmup the rule alone gives
    result = subprocess.run(command, capture_output=True, text=True, timeout=1200, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    figures = json.loads((output / "figures.json").read_text())
    rows = {row["row"]: row for row in figures["rows"]}
    assert list(rows) == ["start", "finetune-seed0", "scratch-seed0"]
    for name in ("finetune-seed0", "scratch-seed0"):
        results = json.loads((output / name / "results.json").read_text())
        assert rows[name]["bleu"] == results["test"]["bleu"] and rows[name]["updates"] == 6
    tuned = json.loads((output / "finetune-seed0" / "results.json").read_text())
    assert tuned["recipe"]["recipe_file"] == "finetune"
    # The start (30 updates of a tiny model) is far below the recipe's bound: its run took the larger peak, and says so.
    bound, peak = (float(value) for value in read_recipe("finetune")["peak_by_start_bleu"].split(":"))
    start_bleu = json.loads((output / "finetune-seed0" / "start.json").read_text())["bleu"]
    assert start_bleu < bound and tuned["plan"]["peak_learning_rate"] == pytest.approx(peak)
    assert {
        "rule": "peak_by_start_bleu",
        "said": f"peak {peak:.1e} for a start of validation BLEU {start_bleu:.2f}",
    } in tuned["rules"]
    # ... and the warmup of `warmup_by_start_bleu` (4 of its 6 updates; the recipe's 100 would warm up for all 6).
    scratch = json.loads((output / "scratch-seed0" / "results.json").read_text())  # no start: no start's rule
    assert tuned["plan"]["warmup_steps"] == 4 and scratch["plan"]["warmup_steps"] == 6
    said = f"warmup 4 for a start of validation BLEU {start_bleu:.2f}"
    assert {"rule": "warmup_by_start_bleu", "said": said} in tuned["rules"]
    assert rows["scratch-seed0"]["kept"] is None and rows["finetune-seed0"]["kept"] in ("trained", "start")
    scored = run_script("score.py", start, "--data_files", TEST_40)  # the start row: the folder scored as it is
    assert rows["start"]["bleu"] == json.loads(scored.stdout[scored.stdout.rfind("\n{") + 1 :])["score"]
    table = (output / "table.md").read_text()
    assert f"| start | {rows['start']['bleu']:.2f} |" in table and "| finetune-seed0 |" in table


def test_a_finetuning_run_trains_at_the_dropout_of_its_epochs_not_the_starts(trained_folder, tmp_path):
    """The `finetune` recipe's dropout is that of the run's predicted epochs (`dropout_by_epochs`, the cpu recipe's
    steps): the saved model (trained with its preset's 0.1) is loaded, timed and trained at the recipe's 0.0 below
    the first step, and the plan gives the step's dropout from its epochs on; a --dropout given is the run's."""
    start, _ = trained_folder
    assert json.loads((start / "config.json").read_text())["dropout"] == 0.1
    tokenizer = AutoTokenizer.from_pretrained(start)
    settings = parse_run(["--model_name_or_path", str(start), "--output_dir", str(tmp_path)])
    model = build_model(settings.recipe, tokenizer)
    floats = {module.dropout for module in model.modules() if isinstance(getattr(module, "dropout", None), float)}
    assert model.config.dropout == 0.0 and floats == {0.0}
    steps = list(settings.dropout_steps)
    (epochs, dropout), *_ = steps
    assert dropout_for(steps, epochs - 0.1) is None  # the model's own: the recipe's 0.0
    assert dropout_for(steps, epochs) == dropout
    given = parse_run(["--model_name_or_path", str(start), "--output_dir", str(tmp_path), "--dropout", "0.2"])
    assert given.dropout_steps == ()
    assert build_model(given.recipe, tokenizer).config.dropout == 0.2


def test_a_recorded_start_is_reused_only_for_the_same_model_and_validation_pairs(tmp_path):
    """A resumed run reads its start from start.json; another folder of the same name, a changed folder or other
    validation pairs measure it again (their fingerprints differ); no path is in the fingerprint."""
    first, second = tmp_path / "a" / "model", tmp_path / "b" / "model"
    for folder, width in ((first, 256), (second, 512)):
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps({"d_model": width}))
    pairs = (["Hello."], ["Hallo."])
    mark = fingerprint(str(first), pairs)
    assert mark == fingerprint(str(first), pairs) and str(tmp_path) not in mark
    assert mark != fingerprint(str(second), pairs)  # the same name, another model
    assert mark != fingerprint(str(first), (["Hello."], ["Guten Tag."]))  # other validation pairs
    (first / "model.safetensors").write_bytes(b"weights")
    assert mark != fingerprint(str(first), pairs)  # the folder changed
    assert fingerprint("owner/model", pairs) != fingerprint("owner/other", pairs)  # a Hub id


def test_a_start_inside_the_output_folder_is_refused(tmp_path):
    start = tmp_path / "out" / "checkpoint-6"
    start.mkdir(parents=True)
    for output in (tmp_path / "out", start):
        with pytest.raises(ValueError, match=r"model_name_or_path=.*checkpoint-6' is inside output_dir="):
            parse_run(["--model_name_or_path", str(start), "--output_dir", str(output)])
    assert parse_run(["--model_name_or_path", str(start), "--output_dir", str(tmp_path / "tuned")])
