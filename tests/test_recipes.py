"""The recipes as the run reads them (training/recipes.py, arguments.py, settings.py, budget/schedule.py): the main
job's recipe chosen by the machine, the GPU recipe's values, lists of choices honoured or refused by name (never
dropped), and a learning rate that follows the model the planner picks (§5.3)."""

from __future__ import annotations

import pytest
import torch

from hf_vanilla_transformer.training import recipes
from hf_vanilla_transformer.training.arguments import ModelDataArguments, TransformerTrainingArguments
from hf_vanilla_transformer.training.budget.schedule import learning_rate
from hf_vanilla_transformer.training.recipes import machine_recipe, parse_run
from hf_vanilla_transformer.training.settings import rate_rule


def parse(tmp_path, *flags: str, recipe: str | None = "cpu"):
    """The settled run's recipe and arguments (every check made)."""
    settings = parse_run(["--output_dir", str(tmp_path), *flags], default_recipe=recipe)
    return settings.recipe, settings.args


def test_the_main_job_runs_the_gpu_recipe_where_pytorch_sees_a_cuda_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert machine_recipe([]) == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert machine_recipe([]) == machine_recipe(["--seed", "1"]) == "gpu"
    for asked in (["--use_cpu", "true"], ["--use_cpu"], ["--use_cpu=True"]):  # the CPU asked for on a GPU machine
        assert machine_recipe(asked) == "cpu", asked
    assert machine_recipe(["--use_cpu", "false"]) == "gpu"


def test_the_gpu_recipe_chooses_among_the_papers_sizes_up_to_the_papers_batch(tmp_path):
    recipe, args = parse(tmp_path, recipe="gpu")
    assert (recipe.preset, recipe.preset_choices) == ("big", "big,base,small")
    assert (recipe.max_tokens, recipe.max_tokens_choices) == (25000, "25000,12500,8192,4096")
    assert (recipe.precision, recipe.attn_implementation, recipe.compile_training) == ("auto", "auto", "auto")
    assert (recipe.max_minutes, recipe.max_epochs, recipe.min_updates, recipe.dropout) == (26, 50, 2500, None)
    assert (args.warmup_steps, recipe.lr_scale, recipe.peak_learning_rate) == (4000, 1.0, None)
    assert not args.use_cpu and args.dataloader_num_workers == 4 and args.dataloader_persistent_workers
    assert not args.logging_nan_inf_filter  # the Trainer would read every update's loss on the host


def test_a_list_of_choices_given_is_honoured_and_a_recipes_list_gives_way_to_a_value_given(tmp_path):
    # The run: --preset_choices base,small over the CPU recipe measured only small.
    recipe, _ = parse(tmp_path, "--preset_choices", "base,small", "--max_tokens_choices", "8192,4096")
    assert (recipe.preset, recipe.preset_choices) == ("base", "base,small")
    assert (recipe.max_tokens, recipe.max_tokens_choices) == (8192, "8192,4096")
    # A value given over a recipe's list trains that value: --preset tiny over the CPU recipe trains tiny.
    recipe, _ = parse(tmp_path, "--preset", "tiny", "--max_tokens", "300")
    assert (recipe.preset, recipe.preset_choices, recipe.max_tokens, recipe.max_tokens_choices) == (
        "tiny",
        None,
        300,
        None,
    )
    # A size given is the size trained, the recipe's first choice or its own preset as well.
    for preset in ("medium", "small"):
        recipe, _ = parse(tmp_path, "--preset", preset)
        assert (recipe.preset, recipe.preset_choices) == (preset, None)
    # A given length has nothing to choose by: the recipe's lists give way.
    recipe, _ = parse(tmp_path, "--max_steps", "30")
    assert recipe.preset_choices is None and recipe.max_tokens_choices is None


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--preset_choices", "base,small", "--max_steps", "30"], "preset_choices='base,small' needs a time budget"),
        (["--max_tokens_choices", "4096,2048", "--max_steps", "30"], "max_tokens_choices='4096,2048' needs a time"),
        (
            ["--preset", "big", "--preset_choices", "base,small"],
            "--preset big and --preset_choices base,small disagree",
        ),
        (["--max_tokens", "512", "--max_tokens_choices", "4096,2048"], "--max_tokens 512 and --max_tokens_choices"),
        (["--preset_choices", "base,huge"], r"preset_choices='base,huge' is invalid"),
        (["--preset_choices", "base", "--model_name_or_path", "runs/x"], "cannot apply to the saved model 'runs/x'"),
    ],
)
def test_a_list_of_choices_the_run_cannot_honour_is_named(tmp_path, flags, message):
    with pytest.raises(ValueError, match=message):
        parse(tmp_path, *flags)


def test_a_recipe_files_peak_belongs_to_its_own_preset(tmp_path):
    recipe, _ = parse(tmp_path, "--preset", "base")
    assert (recipe.peak_learning_rate, recipe.peak_learning_rate_preset) == (0.0019764, "small")
    recipe, _ = parse(tmp_path, "--peak_learning_rate", "0.001")  # given here: the run's own preset's
    assert recipe.peak_learning_rate_preset is None
    # ... and the update's own: the recipe's reference (2,048 tokens) scaled the recipe's peak, not this one.
    assert recipe.lr_reference_tokens is None and rate(recipe, 256, tokens=1024) == pytest.approx(1e-3)
    recipe, _ = parse(tmp_path, "--peak_learning_rate", "0.001", "--lr_reference_tokens", "4096")
    assert recipe.lr_reference_tokens == 4096


def test_the_cpu_recipes_peak_is_named_for_2048_token_updates(tmp_path):
    """1.98e-3 at 2,048 tokens per update; the recipe's 1,024-token updates peak at 1/sqrt(2) of it, 1.40e-3
    (docs/cpu_recipe.md); two processes of 1,024 tokens make 2,048 again."""
    recipe, _ = parse(tmp_path)
    assert rate(recipe, 256, tokens=1024) == pytest.approx(1.3975e-3, rel=1e-4)
    assert rate(recipe, 256, tokens=2048) == pytest.approx(1.9764e-3, rel=1e-4)
    assert rate(recipe, 192, tokens=1024) == pytest.approx(2.2821e-3 / 2**0.5, rel=1e-4)  # compact, its own width


def test_a_run_started_again_with_another_size_keeps_the_peaks_owner(tmp_path):
    """A switch to a larger model gives it the §5.3 rate of its width, from the peak the user named for the size
    they gave, not that peak itself."""
    flags = ("--preset", "compact", "--preset_choices", "compact,tiny", "--peak_learning_rate", "0.002")
    settings = parse_run(["--output_dir", str(tmp_path), *flags], default_recipe="cpu")
    switched = settings.switched_to("compact", 2048, "fp32", "sdpa", False)  # from tiny, the plan's first pick
    assert (switched.presets, switched.token_sizes, switched.choices.precisions) == (("compact",), (2048,), ("fp32",))
    assert switched.rate == settings.rate and settings.rate.owner_d_model == 192  # compact's: the size given
    assert learning_rate(switched.rate, 192, 1000, 2048).peak == pytest.approx(0.002)
    assert learning_rate(switched.rate, 32, 1000, 2048).peak == pytest.approx(0.002 * 6**0.5)  # tiny, its width


def test_an_explicit_mixed_precision_fixes_what_auto_would_measure(tmp_path):
    parsed = lambda *flags: recipes.parse_arguments(["--output_dir", str(tmp_path), *flags], "cpu")[0]  # noqa: E731
    assert parsed().precision == "auto"
    assert parsed("--fp16", "true").precision == "fp16"
    assert parsed("--bf16", "true").precision == "bf16"
    assert parsed("--bf16", "false").precision == "fp32"
    with pytest.raises(ValueError, match="precision='fp16' is invalid on cpu"):  # settled: refused on a CPU
        parse(tmp_path, "--fp16", "true")


def test_the_training_collator_makes_the_models_decoder_inputs_without_the_model():
    """Data-loading workers get a copy of the collator: it holds two token ids, not the model (on a GPU)."""
    from transformers import DataCollatorForSeq2Seq

    from hf_vanilla_transformer.data.collating import training_collator

    from conftest import reversal_task, tiny_model

    tokenizer, dataset = reversal_task()
    model = tiny_model(vocab_size=len(tokenizer))
    features = [dataset[i] for i in range(4)]
    collator = training_collator(tokenizer, model.config, torch.device("cpu"))
    assert not isinstance(collator.model, torch.nn.Module)
    ours, reference = collator(features), DataCollatorForSeq2Seq(tokenizer, model=model)(features)
    for key in ("input_ids", "labels", "decoder_input_ids"):
        assert torch.equal(ours[key], reference[key]), key


def rate(recipe: ModelDataArguments, d_model: int, warmup: int = 1000, tokens: int = 2048, nominal: int = 1000):
    args = TransformerTrainingArguments(output_dir="unused", warmup_steps=nominal, use_cpu=True)
    return learning_rate(rate_rule(recipe, args), d_model, warmup, tokens).peak


def test_the_learning_rate_follows_the_model_the_planner_picks():
    """The CPU recipe's 1.9764e-3 is §5.3's peak for d_model 256 at warmup 1,000 (lr_scale 1): base gets 1.40e-3,
    big 0.99e-3, compact 2.28e-3 (the issue's base run collapsed at the small model's 1.98e-3)."""
    cpu = ModelDataArguments(preset="small", peak_learning_rate=0.0019764, peak_learning_rate_preset="small")
    assert rate(cpu, 256) == pytest.approx(1.9764e-3)
    assert rate(cpu, 512) == pytest.approx(1.3975e-3, rel=1e-4)
    assert rate(cpu, 1024) == pytest.approx(0.9882e-3, rel=1e-4)
    assert rate(cpu, 192) == pytest.approx(2.2821e-3, rel=1e-4)
    # Without a named preset, the peak is --preset's: the paper's lr_scale 1 gives base 7.0e-4 at warmup 4,000.
    paper = ModelDataArguments(preset="base")
    assert rate(paper, 512, warmup=4000, nominal=4000) == pytest.approx(6.988e-4, rel=1e-3)
    assert rate(ModelDataArguments(preset="base", peak_learning_rate=1e-3), 1024) == pytest.approx(0.7071e-3, rel=1e-4)


def test_a_cut_warmup_climbs_the_same_ramp_and_a_reference_batch_scales_the_rate():
    # Warmup 4,000 cut to 1,000 (a short run): the rate at update 1,000 of the paper's ramp, a quarter of its peak.
    paper = ModelDataArguments(preset="base")
    assert rate(paper, 512, warmup=1000, nominal=4000) == pytest.approx(6.988e-4 / 4, rel=1e-3)
    # Named at 25,000 tokens per update: an update of 6,250 tokens gets half the rate (the square root of 1/4).
    scaled = ModelDataArguments(preset="base", lr_reference_tokens=25000)
    assert rate(scaled, 512, warmup=4000, tokens=6250, nominal=4000) == pytest.approx(6.988e-4 / 2, rel=1e-3)


def test_the_plan_line_names_the_recipe_and_the_machine(tmp_path, monkeypatch):
    from hf_vanilla_transformer.training.budget.planner import where

    settings = parse_run(["--output_dir", str(tmp_path)], default_recipe="cpu")
    line = where(settings.recipe.recipe, settings.device)
    assert line.startswith("recipe cpu on ") and "cores" in line
    assert recipes.recipe_file("gpu").is_file() and recipes.recipe_file("gpu").parent.name == "recipes"
