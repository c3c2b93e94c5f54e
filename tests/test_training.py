"""The training recipe (§5) through the real Seq2SeqTrainer: schedule, averaging, fine-tuning, learning, the script."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, TrainerCallback, TrainerState

from hf_vanilla_transformer import VanillaTransformerForConditionalGeneration
from hf_vanilla_transformer.evaluation.translation import evaluate_translations
from hf_vanilla_transformer.model import REMOTE_CODE_FILES
from hf_vanilla_transformer.training import callbacks as callbacks_module
from hf_vanilla_transformer.training.arguments import ModelDataArguments, TransformerTrainingArguments
from hf_vanilla_transformer.training.averaging import average_checkpoints, average_last_checkpoints, checkpoint_folders
from hf_vanilla_transformer.training.budget.schedule import cooldown_shape, noam_schedule, noam_shape
from hf_vanilla_transformer.training.callbacks import TrainingProgressCallback
from hf_vanilla_transformer.training.checks import check_recipe_arguments, check_schedule_arguments
from hf_vanilla_transformer.training.choices import length_penalty_choices
from hf_vanilla_transformer.training.models import build_model, parse_config_overrides
from hf_vanilla_transformer.training.run import prepare_run
from hf_vanilla_transformer.training.settings import settle

from conftest import FIXTURES, logged_losses, run_script, tiny_model, word_tokenizer


TRAIN_200 = str(FIXTURES / "libreoffice_help_en_de_200.tsv")
OTHER_40 = str(FIXTURES / "libreoffice_help_en_de_test_40.tsv")


def test_schedule_equals_the_paper_formula_step_by_step():
    d_model, warmup = 512, 40
    parameter = torch.nn.Parameter(torch.zeros(1))
    peak = d_model**-0.5 * warmup**-0.5
    optimizer = torch.optim.Adam([parameter], lr=peak)  # the Trainer's rate: the plan's peak
    scheduler = noam_schedule(optimizer, warmup)
    for step_num in range(1, 4 * warmup):
        expected = d_model**-0.5 * min(step_num**-0.5, step_num * warmup**-1.5)  # §5.3, eq. 3
        assert optimizer.param_groups[0]["lr"] == pytest.approx(expected, rel=1e-12)
        optimizer.step()
        scheduler.step()
    assert noam_shape(4000, 4000) == 1.0 and pytest.approx(6.99e-4, rel=1e-3) == 512**-0.5 * 4000**-0.5
    with pytest.raises(ValueError, match="warmup_steps=0"):
        noam_schedule(optimizer, 0)


def test_a_resumed_schedule_takes_its_step_from_the_checkpoint_and_its_rate_from_the_plan():
    """A checkpoint of a run whose Trainer rate was eq. 3's factor (d_model^-0.5, before the rate was the peak)
    resumes at the rate its plan holds, at the checkpoint's step."""
    d_model, warmup = 512, 40
    old = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=d_model**-0.5)
    old_schedule = noam_schedule(old, warmup)
    for _ in range(10):
        old.step()
        old_schedule.step()
    saved = old_schedule.state_dict()
    peak = d_model**-0.5 * warmup**-0.5
    optimizer = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=peak)
    scheduler = noam_schedule(optimizer, warmup)
    scheduler.load_state_dict(saved)
    optimizer.step()
    scheduler.step()  # update 12 next
    assert scheduler.last_epoch == 11
    assert optimizer.param_groups[0]["lr"] == pytest.approx(d_model**-0.5 * 12 * warmup**-1.5, rel=1e-12)


def test_a_cooldown_decays_the_rate_linearly_to_zero_at_the_end_it_reads_at_each_step():
    """With a cooldown the rate is the §5.3 rate times (end - s + 1) / (fraction * end) over the last fraction of
    the run, the end read at every update (a re-plan moves it); without one it is the §5.3 rate exactly."""
    warmup, fraction, peak = 10, 0.25, 1e-3
    end = [100]
    optimizer = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=peak)
    scheduler = noam_schedule(optimizer, warmup, fraction, lambda: end[0])
    paper = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=peak)
    paper_scheduler = noam_schedule(paper, warmup)
    for update in range(1, 121):
        if update == 60:
            end[0] = 120  # re-planned before the cooldown began: it begins at update 91 instead of 76
        expected = peak * min(update**-0.5 * warmup**0.5, update / warmup)
        if update > (1 - fraction) * end[0]:
            expected *= (end[0] - update + 1) / (fraction * end[0])
        assert optimizer.param_groups[0]["lr"] == pytest.approx(expected, rel=1e-12), update
        assert (optimizer.param_groups[0]["lr"] == paper.param_groups[0]["lr"]) == (update <= 91), (
            update
        )  # 91: the cooldown's first, at 30/30
        for each, schedule in ((optimizer, scheduler), (paper, paper_scheduler)):
            each.step()
            schedule.step()
    assert optimizer.param_groups[0]["lr"] == 0.0  # past the end: none left
    assert cooldown_shape(120, 120, fraction) == 1 / 30 and cooldown_shape(90, 120, fraction) == 1.0
    with pytest.raises(ValueError, match="cooldown_fraction needs the run's last update"):
        noam_schedule(optimizer, warmup, fraction)


@pytest.mark.parametrize("fraction", [-0.1, 1.0])
def test_a_cooldown_outside_the_run_is_refused(tmp_path, fraction):
    with pytest.raises(ValueError, match=rf"cooldown_fraction={fraction} is invalid; expected a fraction of the run"):
        settle(_recipe(), _args(tmp_path, cooldown_fraction=fraction))


def test_the_trainers_updates_follow_the_cooldown_to_the_end_its_state_holds(tmp_path):
    """The real Trainer's optimizer, update by update: the rate of each update is the schedule's at the end the
    Trainer's state held when the update before it was stepped (the budget's callback moves the end when it
    re-plans, after an update, as a callback does here: the update after next follows it)."""
    rates, ends = [], []

    class Replan(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            state.max_steps = 12

        def on_step_begin(self, args, state, control, optimizer=None, **kwargs):
            rates.append(optimizer.param_groups[0]["lr"])
            ends.append(state.max_steps)

        def on_step_end(self, args, state, control, **kwargs):
            state.max_steps = 16 if state.global_step == 8 else state.max_steps
            control.should_training_stop = state.global_step >= state.max_steps

    arguments = _args(tmp_path, max_steps=16, warmup_steps=4, save_steps=100, cooldown_fraction=0.5)
    run = prepare_run(settle(_recipe(preset="tiny", vocab_size=300), arguments))
    run.trainer.add_callback(Replan())
    run.trainer.train()
    peak = run.trainer.args.learning_rate
    stepped_with = [16, *ends[:-1]]  # the first update's rate is set before training, at the arguments' end
    expected = [
        peak * noam_shape(update, 4) * min(1.0, (end - update + 1) / (0.5 * end))
        for update, end in enumerate(stepped_with, start=1)
    ]
    assert ends == [12] * 8 + [16] * 8 and rates == pytest.approx(expected, rel=1e-9)
    assert rates[7] == pytest.approx(peak * noam_shape(8, 4) * 5 / 6, rel=1e-9)  # update 8: 5 of 6 left to 12
    assert rates[9] == pytest.approx(peak * noam_shape(10, 4) * 7 / 8, rel=1e-9)  # update 10: 7 of 8 left to 16


def test_training_arguments_default_to_the_paper():
    args = TransformerTrainingArguments(output_dir="unused")
    assert (args.adam_beta1, args.adam_beta2, args.adam_epsilon) == (0.9, 0.98, 1e-9)
    assert args.weight_decay == 0.0 and args.max_grad_norm == 0.0 and args.warmup_steps == 4000
    assert args.generation_num_beams == 4 and args.predict_with_generate


def _save_checkpoint(model, folder: Path) -> Path:
    model.save_pretrained(folder)
    (folder / "trainer_state.json").write_text("{}")
    return folder


def test_flags_the_schedule_would_ignore_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"learning_rate=0.001 is not used.*--lr_scale"):
        settle(_recipe(), _args(tmp_path, learning_rate=1e-3))
    with pytest.raises(ValueError, match="lr_scheduler_type=.*cosine.* is not supported"):
        settle(_recipe(), _args(tmp_path, lr_scheduler_type="cosine"))


def test_averaging_two_checkpoints_is_the_elementwise_mean_with_ties_kept(tmp_path):
    first, second = tiny_model(seed=1), tiny_model(seed=2)
    a = _save_checkpoint(first, tmp_path / "run" / "checkpoint-10")
    b = _save_checkpoint(second, tmp_path / "run" / "checkpoint-20")
    (tmp_path / "run" / "checkpoint-30").mkdir()  # incomplete: no weights, no trainer state
    assert checkpoint_folders(tmp_path / "run") == [a, b]
    averaged = average_checkpoints([a, b], tmp_path / "averaged")
    for (name, x), y, z in zip(
        first.state_dict().items(), second.state_dict().values(), averaged.state_dict().values(), strict=True
    ):
        assert torch.allclose(z, (x + y) / 2, atol=1e-7), name
    loaded = VanillaTransformerForConditionalGeneration.from_pretrained(tmp_path / "averaged")
    assert loaded.lm_head.weight is loaded.model.shared.weight is loaded.model.encoder.embed_tokens.weight
    assert torch.equal(loaded.model.shared.weight, averaged.model.shared.weight)
    model, used = average_last_checkpoints(tmp_path / "run", tmp_path / "last", last=1)
    assert used == [b] and torch.equal(model.model.shared.weight, second.model.shared.weight)
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        average_last_checkpoints(tmp_path / "averaged", tmp_path / "x")


def _recipe(**overrides) -> ModelDataArguments:
    values = dict(
        preset="small",
        vocab_size=1000,
        data_files=TRAIN_200,
        validation_files=TRAIN_200,
        test_files=TRAIN_200,
        dropout=0.0,
        max_tokens=1024,
        lr_scale=0.25,
    )
    return ModelDataArguments(**{**values, **overrides})


def _args(tmp_path, **overrides) -> TransformerTrainingArguments:
    values = dict(
        output_dir=str(tmp_path),
        max_steps=300,
        warmup_steps=100,
        logging_steps=25,
        save_steps=300,
        eval_strategy="no",
        seed=0,
        disable_tqdm=True,
        use_cpu=True,
    )
    return TransformerTrainingArguments(**{**values, **overrides})


@pytest.mark.slow
def test_a_short_run_on_a_small_slice_conditions_on_the_source(tmp_path):
    """300 updates on 200 real pairs: the model must read its source. The failure this guards against is a model
    that outputs one fluent sentence for every input (a decoder-only language model of the targets)."""
    run = prepare_run(settle(_recipe(), _args(tmp_path)))
    trainer, tokenizer, corpus = run.trainer, run.tokenizer, run.corpus
    trainer.train()
    losses = logged_losses(trainer.state.log_history)
    assert losses[-1] < losses[0] / 3
    pairs = corpus["test"]  # the 200 training pairs themselves (test_files=TRAIN_200): tokenized, the run keeps no text
    sources, references = list(pairs["source"]), list(pairs["target"])
    scores, hypotheses = evaluate_translations(
        trainer.model, tokenizer, sources, references, num_beams=1, progress=False
    )
    # Different sources -> different outputs, as many as there are different references.
    assert len(set(hypotheses)) >= 0.95 * len(set(references)), sorted(set(hypotheses))[:10]
    # Numbers and names that the reference copies from the source (4.02, BETAINV, LibreOffice, ...) appear in the
    # output: only a model that reads the source can place them.
    copied = [
        (token, hypothesis)
        for source, reference, hypothesis in zip(sources, references, hypotheses, strict=True)
        for token in set(re.findall(r"\b(?:[A-Z][A-Za-z]*[A-Z0-9][A-Za-z0-9]*|[A-Z][a-z]{3,}|\d+)\b", source))
        if re.search(rf"\b{re.escape(token)}\b", reference)
    ]
    assert len(copied) >= 30
    found = [token for token, hypothesis in copied if re.search(rf"\b{re.escape(token)}\b", hypothesis)]
    assert len(found) >= 0.9 * len(copied), sorted({t for t, _ in copied} - set(found))
    assert scores["score"] > 90, (scores["score"], hypotheses[:5])


@pytest.mark.slow
def test_a_saved_model_fine_tunes_on_other_pairs(tmp_path):
    trainer = prepare_run(settle(_recipe(), _args(tmp_path / "first", max_steps=20, save_steps=20))).trainer
    trainer.train()
    saved = tmp_path / "first" / "checkpoint-20"
    recipe = _recipe(model_name_or_path=str(saved), data_files=OTHER_40, validation_files=OTHER_40, test_files=OTHER_40)
    run = prepare_run(settle(recipe, _args(tmp_path / "second", max_steps=40, warmup_steps=40, logging_steps=5)))
    trainer, tokenizer = run.trainer, run.tokenizer
    assert trainer.model.config.vocab_size == 1000  # the saved model's vocabulary and tokenizer, not new ones
    assert tokenizer("Save")["input_ids"] == trainer.processing_class("Save")["input_ids"]
    trainer.train()
    losses = logged_losses(trainer.state.log_history)
    assert losses[-1] < losses[0] - 0.5, losses


def test_results_say_where_the_time_went_and_the_parts_make_the_whole(trained_folder):
    output, result = trained_folder
    results = json.loads((output / "results.json").read_text())
    spent = results["time"]
    parts = ("set_up", "training", "averaging", "alpha", "test", "folder")
    # Each step after training timed on its own; together with the set-up and training they are the whole run
    # (only what lies between them, a few milliseconds, is in none).
    whole = sum(spent[f"{part}_seconds"] for part in parts)
    assert 0 <= results["wall_seconds"] - whole < 1.0, (whole, results["wall_seconds"], spent)
    assert all(spent[f"{part}_seconds"] > 0 for part in parts), spent
    # The validations are the Trainer's own (eval_runtime, two in 30 updates), inside training's seconds.
    evals = [entry["eval_runtime"] for entry in results_log(output) if "eval_runtime" in entry]
    assert len(evals) == 2 and spent["validations_seconds"] == pytest.approx(sum(evals))
    assert 0 < spent["validations_seconds"] < spent["training_seconds"]
    # Without a budget nothing is unspent; the run says the same in minutes.
    assert spent["budget_seconds"] is None and spent["unspent_seconds"] is None
    line = next(line for line in result.stdout.splitlines() if line.startswith("Where the time went"))
    assert f"training {spent['training_seconds'] / 60:.1f} (validations" in line and "unspent" not in line


def test_a_resumed_run_counts_its_own_time_and_says_nothing_of_the_budget_it_shares():
    """A resumed run's record holds this process's minutes: the validations after its checkpoint only, and no
    unspent part (the budget was the first process's); a run that ends past its budget says by how much."""
    from hf_vanilla_transformer.training.results import RunOutcome, describe_time, time_spent

    log = [{"step": 10, "eval_runtime": 4.0}, {"step": 20, "loss": 3.0}, {"step": 30, "eval_runtime": 5.0}]
    finishing = {"averaging": 1.0, "alpha": 6.0, "test": 12.0, "folder": 2.0}
    resumed = RunOutcome(0.0, 100.0, resumed_at="out/checkpoint-20", set_up_seconds=12.0, finishing=finishing)
    spent = time_spent(130.0, 26, resumed, log)
    assert spent["validations_seconds"] == 5.0 and spent["unspent_seconds"] is None and spent["resumed"]
    assert describe_time(spent).startswith("since the run resumed: set-up 0.2, training 1.7 (validations 0.1)")
    whole = time_spent(78.0, 1, RunOutcome(0.0, 50.0, set_up_seconds=9.0, finishing=finishing), log)
    assert whole["validations_seconds"] == 9.0 and whole["unspent_seconds"] == -18.0
    assert describe_time(whole).endswith("log and plots 0.0; over it by 0.3")


def results_log(output: Path) -> list[dict]:
    return json.loads((output / "training_log.json").read_text())["log_history"]


def test_the_length_penalty_is_chosen_by_validation_bleu_and_kept_in_the_model(trained_folder):
    output, result = trained_folder
    results = json.loads((output / "results.json").read_text())
    choice = results["length_penalty_choice"]
    assert list(choice["validation_bleu"]) == ["0.6", "3"] and choice["validation_pairs"] == 10
    scores = {float(alpha): bleu for alpha, bleu in choice["validation_bleu"].items()}
    best = max(scores.values())
    assert choice["chosen"] == min(alpha for alpha, bleu in scores.items() if bleu == best)  # a tie keeps 0.6
    # the chosen alpha is the model's: its generation config, the test decoding and the card
    model = VanillaTransformerForConditionalGeneration.from_pretrained(output)
    assert model.generation_config.length_penalty == choice["chosen"] == results["test"]["length_penalty"]
    assert (
        f"GNMT length penalty α {choice['chosen']:g} (chosen by validation BLEU" in (output / "README.md").read_text()
    )
    assert f"Length penalty: GNMT alpha {choice['chosen']:g}" in result.stdout
    # the recorded scores are those of real decodings: decoding the same pairs again gives them
    tokenizer = AutoTokenizer.from_pretrained(output)
    sources, references = zip(*(line.split("\t") for line in Path(OTHER_40).read_text().splitlines()[:10]), strict=True)
    for alpha, bleu in scores.items():
        again, _ = evaluate_translations(
            model,
            tokenizer,
            list(sources),
            list(references),
            tokenized_bleu=False,
            num_beams=2,
            length_penalty=alpha,
            progress=False,
        )
        assert again["score"] == pytest.approx(bleu, abs=1e-9), alpha


@pytest.mark.parametrize(
    ("choices", "beams", "expected"),
    [
        ("0.6,1.5", 4, [0.6, 1.5]),
        ("0, 1", 4, [0.0, 1.0]),
        ("", 4, []),
        ("0.6,x", 4, "'x'"),
        ("-1", 4, "'-1'"),
        ("0.6,1", 1, "needs beam search"),
    ],
)
def test_length_penalty_choices_are_read_and_checked(choices, beams, expected):
    recipe = ModelDataArguments(length_penalty_choices=choices, test_beams=beams)
    if isinstance(expected, list):
        assert length_penalty_choices(recipe) == expected
    else:
        with pytest.raises(ValueError, match=re.escape(expected)):
            length_penalty_choices(recipe)


def test_config_overrides_change_the_presets_sizes_and_bad_ones_are_named():
    assert parse_config_overrides("d_model=192, encoder_ffn_dim=768,scale_embedding=false,dropout=0.2") == {
        "d_model": 192,
        "encoder_ffn_dim": 768,
        "scale_embedding": False,
        "dropout": 0.2,
    }
    model = build_model(
        ModelDataArguments(preset="small", config_overrides="d_model=192,decoder_layers=2"), word_tokenizer(["a", "b"])
    )
    assert (model.config.d_model, model.config.decoder_layers, model.config.encoder_layers) == (192, 2, 3)
    assert model.model.shared.weight.shape[1] == 192
    for text, message in [
        ("d_model", "'d_model' is invalid; expected name=value"),
        ("width=3", "'width' is not a field"),
        ("d_model=wide", "d_model='wide' is invalid; expected a int"),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)):
            parse_config_overrides(text)
    with pytest.raises(ValueError, match="cannot change the sizes of the saved model"):
        check_recipe_arguments(ModelDataArguments(config_overrides="d_model=64", model_name_or_path="some/model"))


def test_the_train_script_leaves_a_complete_model_folder(trained_folder):
    output, result = trained_folder
    for name in (
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        *REMOTE_CODE_FILES,  # the configuration, modeling file and its siblings (listed in test_remote_code.py)
        "results.json",
        "README.md",
        "training_log.json",
        "plots/training_curves.png",
        "plots/attention_cross.png",
    ):
        assert (output / name).exists(), name
    results = json.loads((output / "results.json").read_text())
    # --average_last 3 of checkpoints 10, 20, 30: only the last third of the run is averaged
    assert results["averaged_checkpoints"] == ["checkpoint-20", "checkpoint-30"]
    assert results["training"]["steps"] == 30 and results["test"]["pairs"] == 40
    assert math.isfinite(results["test"]["bleu"]) and "nrefs:1" in results["test"]["bleu_signature"]
    assert f"value: {round(results['test']['bleu'], 2)}" in (output / "README.md").read_text()
    assert "test sacreBLEU" in result.stdout
    log = json.loads((output / "training_log.json").read_text())["log_history"]
    assert [entry["step"] for entry in log if "eval_bleu" in entry] == [15, 30]  # validation BLEU for the curves
    # Each validation counts its decoding steps against translations as long as their references (the budget
    # scales its prediction of the test decoding by them): an untrained tiny model decodes past its references.
    for entry in (entry for entry in log if "eval_bleu" in entry):
        assert entry["eval_decoding_steps"] > entry["eval_reference_steps"] > 0, entry
    model = VanillaTransformerForConditionalGeneration.from_pretrained(output)
    assert model.generation_config.num_beams == 4
    # evaluating with generate() during training must not leave transformers' global defaults (max_length 20) behind
    assert "max_length" not in json.loads((output / "generation_config.json").read_text())


def test_the_progress_lines_read_well_in_a_log_file(trained_folder):
    """Not a terminal: one line per log with the training speed in source tokens (counted by default), validation
    lines, and no cursor movements from bars nested in the training bar."""
    _, result = trained_folder
    lines = [line for line in result.stdout.splitlines() if line.startswith("update ")]
    training = [line for line in lines if "| loss " in line]
    assert [line.split()[1] for line in training] == [f"{step}/30" for step in range(5, 31, 5)]
    rates = [float(re.search(r"\| ([\d,]+) source tok/s", line)[1].replace(",", "")) for line in training]
    assert all(rate > 0 for rate in rates), training
    assert [line.split()[1] for line in lines if "validation BLEU" in line] == ["15/30", "30/30"]
    assert "\x1b[" not in result.stdout + result.stderr


def test_the_main_jobs_recipe_averages_the_last_third_of_any_run_length(tmp_path):
    """The CPU recipe file (scripts/main.py) builds both argument sets and passes the schedule checks; whatever
    length the budget fixes, its checkpoints fall so that the last five averaged cover the end of the run."""
    from hf_vanilla_transformer.training.averaging import choose_checkpoints
    from hf_vanilla_transformer.training.budget.schedule import EventRule, event_spacing, warmup_for
    from hf_vanilla_transformer.training.recipes import parse_arguments

    recipe, args = parse_arguments(["--output_dir", str(tmp_path)], default_recipe="cpu")
    check_schedule_arguments(args)
    events = EventRule(recipe.checkpoints_per_run, recipe.evaluations_per_run, args.save_steps, None)
    for steps in (300, 1700, 2100, 5400):
        warmup = warmup_for(steps, args.warmup_steps, recipe.max_warmup_fraction)
        save, evaluate = event_spacing(steps, events)
        assert warmup == min(1000, round(0.35 * steps))
        assert evaluate % save == 0  # validation where a checkpoint is written
        saved = [*range(save, steps, save), steps]
        chosen = choose_checkpoints(
            [Path(f"checkpoint-{s}") for s in saved], recipe.average_last, recipe.average_window
        )
        first = int(chosen[0].name.split("-")[1])
        assert len(chosen) >= 4 and first >= 0.66 * steps, (steps, chosen)


def test_the_progress_rate_leaves_validation_and_checkpoint_time_out(monkeypatch, capsys):
    """5,000 source tokens per 10 s of training on both lines, though 40 s of validation and checkpoint writing
    (which train on nothing) lie between them."""
    clock = [100.0]
    monkeypatch.setattr(callbacks_module.time, "monotonic", lambda: clock[0])
    callback = TrainingProgressCallback()
    state = TrainerState(max_steps=10, is_world_process_zero=True, num_input_tokens_seen=0)
    callback.on_train_begin(None, state, None)
    for step in (5, 10):
        clock[0] += 10
        state.global_step, state.num_input_tokens_seen = step, step * 1000
        callback.on_log(None, state, None, logs={"loss": 1.0, "learning_rate": 1e-3})
        clock[0] += 30
        callback.on_evaluate(None, state, None)
        clock[0] += 10
        callback.on_save(None, state, None)
    callback.on_train_end(None, state, None)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("update ")]
    assert len(lines) == 2 and all("| 500 source tok/s |" in line for line in lines), lines


@pytest.mark.slow  # two scripts, each in a process of its own
def test_the_score_and_translate_scripts_read_a_trained_folder(trained_folder, tmp_path):
    output, _ = trained_folder
    scored = run_script("score.py", output, "--data_files", OTHER_40, "--num_beams", "1")
    assert scored.returncode == 0, scored.stderr[-3000:]
    summary = json.loads(scored.stdout)
    assert summary["pairs"] == 40 and "nrefs:1" in summary["signature"]
    translated = run_script("translate.py", output, "--num_beams", "1", input="Tools\nChoose Format - Cells.\n")
    assert translated.returncode == 0, translated.stderr[-3000:]
    assert len(translated.stdout.splitlines()) == 2


@pytest.mark.slow
def test_the_train_script_on_the_default_corpus(tmp_path):
    output = tmp_path / "run"
    result = run_script(
        "train.py",
        "--preset",
        "tiny",
        "--max_steps",
        "30",
        "--output_dir",
        output,
        "--disable_tqdm",
        "true",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((output / "results.json").read_text())["data"]["dataset"] == "libreoffice-help"
