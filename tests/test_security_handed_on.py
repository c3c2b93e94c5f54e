"""What the package hands on is checked as carefully as what it is handed (issue 47, docs/security.md): `push` reads
only regular files inside the model folder (a symbolic link, a folder reached through one, a hard link to a file
outside, a pipe are refused in one line naming the file, the link's target never read), training_log.json only as
the run writes it and no config naming code other than the package's, and `--dry-run` says what it refused; the Trainer's copy of the arguments holds no token; flags are
written in full, an abbreviated secret flag refused without its value, and one recorded by an earlier version
redacted. (No file of a run folder holds the token: tests/test_security.py; the export engines' bounds:
tests/test_export.py.)"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from conftest import ROOT


TOKEN = "hf_" + "Handed0" * 5  # the shape of a Hugging Face token


@pytest.fixture
def folder(trained_folder, tmp_path) -> Path:
    """A copy of the trained model folder, its checkpoints left behind, and a Hub token file outside it."""
    copy = tmp_path / "run"
    shutil.copytree(trained_folder[0], copy, ignore=shutil.ignore_patterns("checkpoint-*"))
    (tmp_path / "hf_home").mkdir()
    (tmp_path / "hf_home" / "token").write_text(TOKEN)
    return copy


def staged_bytes(stage: Path) -> dict[str, bytes]:
    return {path.relative_to(stage).as_posix(): path.read_bytes() for path in stage.rglob("*") if path.is_file()}


# ---------------------------------------------------------------------------------------------------------------------
# 1. push reads only regular files inside the model folder
# ---------------------------------------------------------------------------------------------------------------------


def test_push_never_reads_through_a_link_and_the_dry_run_says_what_it_refused(folder, tmp_path, capsys):
    """The report's proof of concept: `training_log.json -> ~/.cache/huggingface/token` in a folder received from
    someone else. The dry run lists what would go up without it, and says in one line that it refused it."""
    from hf_vanilla_transformer.commands.push import main

    token_file = tmp_path / "hf_home" / "token"
    (folder / "training_log.json").unlink()
    (folder / "training_log.json").symlink_to(token_file)
    assert main([str(folder), "me/x", "--dry-run"], prog="push") == 0
    out = capsys.readouterr().out
    assert (
        f"Not uploaded: training_log.json is a symbolic link (to {token_file}); push reads only regular files inside "
        "the model folder.\n" in out
    )
    listed = [line.split()[0] for line in out.splitlines() if line.startswith("  ")]
    assert "training_log.json" not in listed and "model.safetensors" in listed
    assert not re.search(r"(?<![\d.])37 B\b", out) and TOKEN not in out  # the token file's size, listed nowhere


@pytest.mark.parametrize(
    ("name", "make", "reason"),
    [
        ("plots/training_curves.png", "link", "a symbolic link (to "),
        ("plots", "link", "a symbolic link (to "),
        ("tokenizer_config.json", "hard link", "a file with 2 names (hard links), 1 of them outside the folder"),
        ("training_log.json", "pipe", "a named pipe, not a regular file"),
        ("training_log.json", "a token in the log", "not the log the run writes: log_history's entry 1 holds a str"),
        ("training_log.json", "not JSON", "not JSON (Expecting value"),
        ("plots/training_curves.png", "not a PNG", "not the kind of file its name says"),
    ],
)
def test_push_refuses_what_is_no_regular_file_of_the_folder_and_uploads_the_rest(folder, tmp_path, name, make, reason):
    from hf_vanilla_transformer.sharing.hub import stage_for_hub

    outside = tmp_path / "outside"
    outside.mkdir()
    target = folder / name
    original = target.read_bytes() if target.is_file() else None
    if make == "link":  # to a copy of what it replaces, outside the folder: a link is refused whatever it points to
        copy = shutil.copytree(target, outside / target.name) if target.is_dir() else outside / target.name
        if original is not None:
            copy.write_bytes(original)
        shutil.rmtree(target) if target.is_dir() else target.unlink()
        target.symlink_to(copy)
    elif make == "hard link":
        (outside / target.name).write_bytes(original)
        target.unlink()
        os.link(outside / target.name, target)
    elif make == "pipe":
        target.unlink()
        os.mkfifo(target)  # opening it to read would wait for a writer: never opened so
    elif make == "a token in the log":
        target.write_text(json.dumps({"log_history": [{"loss": TOKEN, "step": 1}]}))
    elif make == "not JSON":
        target.write_text((tmp_path / "hf_home" / "token").read_text())
    else:
        target.write_bytes(b"<svg>" + original)
    staged, refused = stage_for_hub(folder, tmp_path / "stage", repo_id="me/x")
    assert len(refused) == 1 and refused[0].startswith(f"Not uploaded: {name} is {reason}"), refused
    assert refused[0].endswith(".") and "\n" not in refused[0]
    files = staged_bytes(tmp_path / "stage")
    assert {path.relative_to(tmp_path / "stage").as_posix() for path in staged} == set(files)
    assert name not in files and not any(path.startswith(f"{name}/") for path in files)
    assert {"model.safetensors", "tokenizer.json", "README.md", "results.json"} <= set(files)
    assert not any(TOKEN.encode() in data for data in files.values())


def test_push_stops_where_a_file_the_model_needs_is_a_link_and_uploads_nothing(folder, tmp_path):
    from hf_vanilla_transformer.sharing.hub import PublishError, push_model_folder

    weights = tmp_path / "outside.safetensors"
    shutil.move(folder / "model.safetensors", weights)
    (folder / "model.safetensors").symlink_to(weights)
    with pytest.raises(PublishError) as refused:
        push_model_folder(folder, "me/x", dry_run=True)
    assert str(refused.value) == (
        f"Cannot publish {folder}: model.safetensors is a symbolic link (to {weights}); push reads only regular files "
        "inside the model folder. Nothing was uploaded."
    )


def test_push_takes_a_hard_link_whose_every_name_is_inside_the_folder_and_the_runs_own_log(folder, tmp_path):
    """A file with two names inside the folder is proved the folder's own; the run's log goes up as written."""
    from hf_vanilla_transformer.sharing.hub import stage_for_hub

    (folder / "checkpoint-30").mkdir()
    os.link(folder / "tokenizer_config.json", folder / "checkpoint-30" / "tokenizer_config.json")
    staged, refused = stage_for_hub(folder, tmp_path / "stage", repo_id="me/x")
    assert refused == []
    files = staged_bytes(tmp_path / "stage")
    assert len(staged) == len(files) and "tokenizer_config.json" in files
    assert files["tokenizer_config.json"] == (folder / "tokenizer_config.json").read_bytes()
    assert json.loads(files["training_log.json"]) == json.loads((folder / "training_log.json").read_text())


@pytest.mark.parametrize("name", ["config.json", "tokenizer_config.json"])
def test_push_publishes_no_config_whose_auto_map_names_code_other_than_the_packages(folder, tmp_path, name):
    """A converted source's tokenizer config can carry an `auto_map` naming another repository's code, which the
    card's `trust_remote_code=True` would run: push stops. The package's own modules pass (a converted fairseq
    model's tokenizer)."""
    from hf_vanilla_transformer.sharing.hub import PublishError, stage_for_hub

    config = json.loads((folder / name).read_text())
    config.setdefault("auto_map", {})["AutoTokenizer"] = ["tokenization_vanilla_transformer.Fairseq", None]
    (folder / name).write_text(json.dumps(config))
    assert stage_for_hub(folder, tmp_path / "own", repo_id="me/x")[1] == []
    config["auto_map"]["AutoTokenizer"] = ["owner/repo--tokenization.Hostile", None]
    (folder / name).write_text(json.dumps(config))
    with pytest.raises(PublishError) as refused:
        stage_for_hub(folder, tmp_path / "stage", repo_id="me/x")
    assert str(refused.value).startswith(
        f"{name}'s auto_map names code that is not this package's (owner/repo--tokenization.Hostile): it would run "
        "wherever the repository is loaded with trust_remote_code=True. Nothing was uploaded;"
    )


def test_the_training_log_check_takes_the_trainers_log_and_refuses_anything_else():
    from hf_vanilla_transformer.sharing.reading import training_log

    log = {"log_history": [{"loss": 6.2, "grad_norm": None, "step": 5}, {"eval_bleu": 1.5, "epoch": 0.5}]}
    assert training_log(log) == log
    for bad, message in (
        ({"log_history": [], "token": "x"}, r"an object of 2 keys, not \{'log_history': \[\.\.\.\]\}"),
        ({"log_history": [["loss"]]}, r"log_history's entry 1 is a list, not an object"),
        ({"log_history": [{"step": 1}, {"hf_abc def": 1}]}, r"log_history's entry 2 holds a key that names no logged"),
        ({"log_history": [{"loss": True}]}, r"log_history's entry 1 holds a bool at 'loss', not a number"),
    ):
        with pytest.raises(ValueError, match=message):
            training_log(bad)


# ---------------------------------------------------------------------------------------------------------------------
# 2. The token never reaches the arguments the Trainer pickles
# ---------------------------------------------------------------------------------------------------------------------


def test_the_trainers_copy_of_the_arguments_holds_no_token(tmp_path):
    from hf_vanilla_transformer.training.recipes import parse_run

    settings = parse_run(["--preset", "tiny", "--output_dir", str(tmp_path / "run"), "--hub_token", "plain-4217"])
    from hf_vanilla_transformer.training.budget import BudgetPlan, apply_plan

    plan = BudgetPlan.of(max_steps=4, warmup_steps=1, save_steps=2, peak_learning_rate=1.0)
    planned = apply_plan(plan, settings.args)
    assert planned.hub_token is None and planned.max_steps == 4
    assert settings.args.hub_token == "plain-4217"  # the user's arguments are kept as given (results.json's record)


# ---------------------------------------------------------------------------------------------------------------------
# 4. Flags are written in full; an abbreviated secret flag is refused without its value
# ---------------------------------------------------------------------------------------------------------------------


def test_an_abbreviated_hub_token_is_refused_without_its_value_and_nothing_is_written(tmp_path, capsys):
    """`--hub_tok VALUE` was taken for `--hub_token` and recorded as typed, its value in the card: now refused in one
    line that names the flag and not the value, before anything is written."""
    from hf_vanilla_transformer.commands.train import train_from_command_line

    output = tmp_path / "run"
    argv = ["--preset", "tiny", "--max_steps", "2", "--output_dir", str(output), "--hub_tok", "plain-4217"]
    with pytest.raises(SystemExit) as refused:
        train_from_command_line(argv, prog="train")
    assert refused.value.code == (
        "train: unrecognized flag --hub_tok (did you mean --hub_token?); 1 word(s) that no flag takes. Flags are "
        "written in full (no abbreviations): see --help."
    )
    assert "plain-4217" not in capsys.readouterr().err and not output.exists()


@pytest.mark.parametrize(
    ("command", "argv", "flag"),
    [
        ("push", ["run", "me/x", "--tok", "plain-4217"], "--tok (did you mean --token?)"),
        ("translate", ["run", "--max_tok", "5"], "--max_tok (did you mean --max_tokens?)"),
        ("score", ["run", "--data_file=plain-4217"], "--data_file (did you mean --data_files?)"),
    ],
)
def test_every_command_takes_flags_only_in_full_and_never_repeats_an_unknown_ones_value(command, argv, flag, capsys):
    import importlib

    main = importlib.import_module(f"hf_vanilla_transformer.commands.{command}").main
    with pytest.raises(SystemExit) as refused:
        main(argv, prog=command)
    err = capsys.readouterr().err
    assert refused.value.code == 2 and f"{command}: error: unrecognized flag {flag}" in err
    assert "plain-4217" not in err


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("train --hub_tok plain-4217 --seed 1", "train --hub_tok REDACTED --seed 1"),
        ("train --hub-t=plain-4217", "train --hub-t=REDACTED"),
        ("train --hub_strategy end --hub_model_id me/x", "train --hub_strategy end --hub_model_id me/x"),
    ],
)
def test_an_abbreviated_hub_token_recorded_by_an_earlier_version_is_redacted(command, expected):
    from hf_vanilla_transformer.utils.redact import public_command

    assert public_command(command) == expected


PARSERS = ("ArgumentParser", "HfArgumentParser")


def parsers_without_abbreviations_off(source: str) -> list[str]:
    """The argument parsers `source` builds (`ArgumentParser(...)`, `HfArgumentParser(...)`) that take abbreviations:
    without `allow_abbrev=False`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or ast.unparse(node.func).split(".")[-1] not in PARSERS:
            continue
        if not any(k.arg == "allow_abbrev" and ast.unparse(k.value) == "False" for k in node.keywords):
            found.append(ast.unparse(node))
    return found


def test_no_parser_of_the_package_or_its_scripts_takes_abbreviations():
    assert len(parsers_without_abbreviations_off("p = argparse.ArgumentParser()\nq = HfArgumentParser((A,))")) == 2
    found = {
        str(path.relative_to(ROOT)): parsers_without_abbreviations_off(path.read_text(encoding="utf-8"))
        for path in [*(ROOT / "hf_vanilla_transformer").rglob("*.py"), *(ROOT / "scripts").glob("*.py")]
    }
    assert {path: calls for path, calls in found.items() if calls} == {}
