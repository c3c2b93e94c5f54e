"""What others hand the package runs nothing and what it publishes holds nothing private (issue 38, docs/security.md):
a checkpoint whose pickle would run code is refused by name; tokens and home paths stay out of results.json and the
card; translate and score run a folder's own code only when asked; locks and temporary files never follow a link;
a user's own test sentences stay home unless asked; the card's code escapes what it quotes; corpus lines and
translation inputs are read with a bound; the Debian download asks before apt-get update, keeps to its folder and
has caps; exports record no absolute path; the cache's temporary names are unique per machine; and a scan of the
package's source finds none of these mistakes again."""

from __future__ import annotations

import ast
import io
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT


PACKAGE = ROOT / "hf_vanilla_transformer"


# ---------------------------------------------------------------------------------------------------------------------
# 1. A checkpoint whose pickle would run code is refused by name and runs nothing
# ---------------------------------------------------------------------------------------------------------------------


class RunsCode:
    """Pickled, it calls os.system on loading: the proof of concept of a checkpoint that runs code."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def checkpoint(folder: Path, rng_state) -> Path:
    """A checkpoint folder as the Trainer writes one (marker, config, state, weights, optimizer), with `rng_state`
    saved as its rng_state.pth."""
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    (folder / ".complete").write_text("10\n")
    (folder / "config.json").write_text("{}")
    (folder / "trainer_state.json").write_text('{"global_step": 10}')
    save_file({"weight": torch.ones(2, 2)}, folder / "model.safetensors")
    torch.save({"state": {0: {"exp_avg": torch.zeros(2)}}, "param_groups": [{"lr": 1e-3}]}, folder / "optimizer.pt")
    torch.save(rng_state, folder / "rng_state.pth")
    return folder


def test_a_checkpoint_whose_pickle_runs_code_is_refused_by_name_and_runs_nothing(tmp_path):
    from hf_vanilla_transformer.training.checkpoints import CheckpointError, validate_checkpoint

    marker = tmp_path / "ran"
    folder = checkpoint(tmp_path / "checkpoint-10", RunsCode(f"touch {marker}"))
    with pytest.raises(CheckpointError, match=r"checkpoint-10/rng_state\.pth holds objects other than tensors"):
        validate_checkpoint(folder)
    assert not marker.exists()


def test_a_checkpoint_with_the_trainers_rng_state_validates(tmp_path, trained_folder):
    """The Trainer's rng_state.pth holds numpy's generator state (arrays, dtypes): allowed, as the Trainer allows
    it on resuming (transformers' safe_globals); so are the checkpoints of a real run."""
    import random

    import numpy as np
    import torch

    from hf_vanilla_transformer.training.checkpoints import checkpoint_folders, validate_checkpoint

    state = {"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.random.get_rng_state()}
    folder = checkpoint(tmp_path / "checkpoint-10", state)
    assert validate_checkpoint(folder) == folder
    written = checkpoint_folders(trained_folder[0])
    assert [path.name for path in written] == ["checkpoint-10", "checkpoint-20", "checkpoint-30"]
    for path in written:
        assert (path / "rng_state.pth").exists() and validate_checkpoint(path) == path


# ---------------------------------------------------------------------------------------------------------------------
# 4. Locks and temporary files never follow a symbolic link
# ---------------------------------------------------------------------------------------------------------------------


def test_a_run_lock_that_is_a_symbolic_link_is_refused_and_its_target_left_alone(tmp_path):
    from hf_vanilla_transformer.utils.locks import FolderInUseError, LockFileError, folder_lock

    victim = tmp_path / "notes.txt"
    victim.write_text("my notes\n")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / ".lock").symlink_to(victim)
    with pytest.raises(LockFileError, match=r"run/\.lock is a symbolic link") as refused, folder_lock(tmp_path / "run"):
        pass
    assert isinstance(refused.value, FolderInUseError)  # every process of a launch stops with it, in one line
    assert victim.read_text() == "my notes\n"


def test_a_cache_entry_lock_that_is_a_link_or_a_second_name_is_refused(tmp_path):
    from hf_vanilla_transformer.utils.locks import LockFileError, preparing

    victim = tmp_path / "notes.txt"
    victim.write_text("my notes\n")
    locks = tmp_path / "cache" / ".locks"
    locks.mkdir(parents=True)
    (locks / "corpus.lock").symlink_to(victim)
    with (
        pytest.raises(LockFileError, match=r"corpus\.lock is a symbolic link"),
        preparing(locks / "corpus.lock", tmp_path / "cache" / "corpus"),
    ):
        pass
    os.link(victim, locks / "other.lock")  # a hard link: the same file under a second name
    with (
        pytest.raises(LockFileError, match=r"other\.lock is a file with 2 names"),
        preparing(locks / "other.lock", tmp_path / "cache" / "other"),
    ):
        pass
    assert victim.read_text() == "my notes\n"


def test_an_atomic_write_never_writes_through_a_link_at_a_temporary_name(tmp_path):
    from hf_vanilla_transformer.utils.files import write_text_atomically

    victim = tmp_path / "notes.txt"
    victim.write_text("my notes\n")
    (tmp_path / "results.json.tmp").symlink_to(victim)  # the fixed temporary name of earlier versions
    write_text_atomically(tmp_path / "results.json", "{}\n")
    assert victim.read_text() == "my notes\n"
    assert not (tmp_path / "results.json").is_symlink() and (tmp_path / "results.json").read_text() == "{}\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["notes.txt", "results.json", "results.json.tmp"]


# ---------------------------------------------------------------------------------------------------------------------
# 10. The cache's temporary folders are unique per machine, not only per host name
# ---------------------------------------------------------------------------------------------------------------------


def dead_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def test_a_leftover_of_another_container_with_the_same_host_name_is_never_removed(tmp_path):
    from hf_vanilla_transformer.data.cache import process_space, temporary_folder

    host = socket.gethostname().replace("-", "_")
    where = process_space()
    assert where is not None and len(where) == 12  # Linux: /proc says
    pid = dead_pid()
    # the same host name and a pid not alive here: not provably ours
    theirs = tmp_path / f"corpus.tmp-{host}-{pid}-0a0a0a0a"
    theirs_too = tmp_path / f"corpus.tmp-{host}_0123456789ab-{pid}-0b0b0b0b"  # another kernel or container
    ours_dead = tmp_path / f"corpus.tmp-{host}_{where}-{pid}-0c0c0c0c"
    ours_alive = tmp_path / f"corpus.tmp-{host}_{where}-{os.getpid()}-0d0d0d0d"
    for folder in (theirs, theirs_too, ours_dead, ours_alive):
        folder.mkdir()
    fresh = temporary_folder(tmp_path / "corpus")
    assert fresh.name.startswith(f"corpus.tmp-{host}_{where}-{os.getpid()}-")
    assert theirs.is_dir() and theirs_too.is_dir() and ours_alive.is_dir()
    assert not ours_dead.exists()  # a dead process of this very machine: removed


# ---------------------------------------------------------------------------------------------------------------------
# 2, 5. No token, home path or private sentence in what a run publishes
# ---------------------------------------------------------------------------------------------------------------------

TOKEN = "hf_" + "Secret0" * 5  # the shape of a Hugging Face token
PLAIN_SECRET = "plain-Secret-4217"  # a token of another shape: only the flag it follows says it is one


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (
            f"vanilla-transformer train --hub_token {TOKEN} --output_dir /home/alice/runs/de",
            "vanilla-transformer train --hub_token REDACTED --output_dir de",
        ),
        (f"train --hub_token={TOKEN} --seed 1", "train --hub_token=REDACTED --seed 1"),
        (
            "train --hub-token abc --token=xyz --max_tokens 1024",
            "train --hub-token REDACTED --token=REDACTED --max_tokens 1024",
        ),
        (f"train --run_name {TOKEN}", "train --run_name REDACTED"),  # a token anywhere: its shape gives it away
        (
            "python /home/alice/src/scripts/train.py --recipe /home/alice/my.yaml --data_files ~/d/src.txt,/d/tgt.txt",
            "python train.py --recipe my.yaml --data_files src.txt,tgt.txt",
        ),
        (
            "train --resume_from_checkpoint /home/alice/runs/de/checkpoint-20 --output_dir /home/alice/runs/de",
            "train --resume_from_checkpoint checkpoint-20 --output_dir de",
        ),
        ("train --hub_model_id me/model --preset tiny", "train --hub_model_id me/model --preset tiny"),  # a Hub id
    ],
)
def test_the_published_command_line_holds_no_token_and_no_local_path(command, expected):
    from hf_vanilla_transformer.utils.redact import public_command

    assert public_command(command, "/home/alice/runs/de") == expected


@pytest.mark.slow  # a training run of the script
def test_a_run_on_own_data_publishes_no_token_no_path_and_no_sentence(tmp_path):
    """`train --hub_token ... --data_files /private/...`: results.json, the card and the log hold neither the token
    nor the folders; the test sentences of the user's files stay out of the folder (examples, attention maps). No
    file of the run folder, checkpoints included (training_args.bin, the Trainer's pickle of its arguments), nor of
    the data cache, holds the token: one not shaped like a Hub token, so that only its flag can hide it (issue 47)."""
    private = tmp_path / "alice" / "private"
    private.mkdir(parents=True)
    data = private / "mine.tsv"
    data.write_bytes((ROOT / "tests" / "fixtures" / "libreoffice_help_en_de_200.tsv").read_bytes())
    recipe = private / "recipe.yaml"
    recipe.write_text("preset: tiny\nvocab_size: 500\n")
    output = private / "runs" / "mine"
    arguments = ["--recipe", str(recipe), "--data_files", str(data), "--output_dir", str(output)]
    arguments += ["--data_cache_dir", str(tmp_path / "cache"), "--hub_token", PLAIN_SECRET]
    arguments += ["--max_steps", "4", "--save_steps", "4", "--average_last", "1", "--test_beams", "1"]
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "train.py"), *arguments],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_VANILLA_TRANSFORMER_ALLOCATOR": "system"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    results_text = (output / "results.json").read_text()
    card = (output / "README.md").read_text()
    for published in (results_text, card, result.stdout + result.stderr):
        assert PLAIN_SECRET not in published
    written = [path for folder in (output, tmp_path / "cache") for path in folder.rglob("*") if path.is_file()]
    assert any(path.name == "training_args.bin" for path in written)  # the checkpoint is among them
    assert [path for path in written if PLAIN_SECRET.encode() in path.read_bytes()] == []
    for published in (results_text, card):
        assert str(private) not in published and str(tmp_path) not in published
    results = json.loads(results_text)
    assert results["command"].endswith(
        "--hub_token REDACTED --max_steps 4 --save_steps 4 --average_last 1 --test_beams 1"
    )
    assert "--recipe recipe.yaml --data_files mine.tsv --output_dir mine" in results["command"]
    assert results["recipe"]["recipe_file"] == "recipe.yaml"
    assert results["examples"] == [] and results["test"]["pairs"] > 0  # tested, not shown
    sentences = [line.split("\t")[0] for line in data.read_text().splitlines()]
    assert not any(sentence in card for sentence in sentences if len(sentence) > 12)
    assert "Example translations are left out" in card
    assert (output / "plots" / "positional_encoding.png").exists() and not list((output / "plots").glob("attention*"))


def test_the_hub_gets_no_token_path_or_own_sentence_even_of_an_older_folder(trained_folder, tmp_path):
    import shutil

    from hf_vanilla_transformer.sharing.hub import stage_for_hub

    folder = tmp_path / "run"
    shutil.copytree(trained_folder[0], folder, ignore=shutil.ignore_patterns("checkpoint-*"))
    results = json.loads((folder / "results.json").read_text())
    assert results["examples"] and results["data"]["dataset"] == "local files"
    home = str(Path.home())
    results["command"] = f"python {home}/src/train.py --data_files {home}/data/mine.tsv --hub_token {TOKEN}"
    del results["recipe"]["publish_examples"]  # as a folder of an earlier version records it
    (folder / "results.json").write_text(json.dumps(results))
    stage_for_hub(folder, tmp_path / "stage", repo_id="me/x")
    staged, card = (tmp_path / "stage" / "results.json").read_text(), (tmp_path / "stage" / "README.md").read_text()
    for published in (staged, card):
        assert TOKEN not in published and home not in published and results["examples"][0]["source"] not in published
    assert json.loads(staged)["command"] == "python train.py --data_files mine.tsv --hub_token REDACTED"


# ---------------------------------------------------------------------------------------------------------------------
# 6. The card's code quotes any sentence as one Python string
# ---------------------------------------------------------------------------------------------------------------------

HOSTILE = "Hi\\\"]);__import__('os').system('id')#"


def test_the_cards_code_quotes_a_hostile_sentence_as_one_string(trained_folder):
    import re

    from hf_vanilla_transformer.sharing.model_card import render_model_card

    results = json.loads((trained_folder[0] / "results.json").read_text())
    hostile = HOSTILE + "\u202e\n'\\x"  # and a bidirectional override, a line end, a quote, a backslash
    results["examples"][0]["source"] = hostile
    card = render_model_card(results, repo_id="me/model")
    blocks = re.findall(r"```python\n(.*?)```", card, flags=re.DOTALL)
    assert len(blocks) == 2
    calls, strings = [], []
    for block in blocks:
        for node in ast.walk(ast.parse(block)):
            if isinstance(node, ast.Call):
                calls.append(ast.unparse(node.func))
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                strings.append(node.value)
    assert sorted(calls) == sorted(
        [
            "AutoModelForSeq2SeqLM.from_pretrained",
            "AutoTokenizer.from_pretrained",
            "tokenizer",
            "print",
            "tokenizer.batch_decode",
            "model.generate",
            "pipeline",
            "print",
            "translator",
        ]
    )
    assert strings.count(hostile) == 2 and strings.count("me/model") == 3
    assert "\u202e" not in "".join(blocks) and "\\u202e" in blocks[0]  # escaped: visible, not obeyed


# ---------------------------------------------------------------------------------------------------------------------
# Publishing stays explicit and says whether the repository is public
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("existing", "flags", "line"),
    [
        (None, [], "a new PUBLIC repository, which anyone can read (--private keeps it to you)."),
        (None, ["--private"], "a new private repository."),
        (False, ["--private"], "an existing PUBLIC repository, which anyone can read (--private does not change it)."),
        (True, [], "an existing private repository."),
    ],
)
def test_push_says_before_uploading_whether_the_repository_is_public(
    trained_folder, monkeypatch, capsys, existing, flags, line
):
    from types import SimpleNamespace

    import httpx2
    from huggingface_hub import HfApi
    from huggingface_hub.errors import RepositoryNotFoundError

    from hf_vanilla_transformer.commands.push import main

    def repo_info(self, repo_id, repo_type=None):
        if existing is None:
            response = httpx2.Response(404, request=httpx2.Request("GET", "https://huggingface.co/api/models/me/x"))
            raise RepositoryNotFoundError("not found", response=response)
        return SimpleNamespace(private=existing)

    said_before = []

    def create_repo(self, repo_id, **kwargs):
        said_before.append(capsys.readouterr().out)
        return SimpleNamespace(repo_id=repo_id)

    monkeypatch.setattr(HfApi, "repo_info", repo_info)
    monkeypatch.setattr(HfApi, "create_repo", create_repo)
    monkeypatch.setattr(HfApi, "create_commit", lambda self, **kwargs: SimpleNamespace(commit_url="https://hub/c/1"))
    assert main([str(trained_folder[0]), "me/x", "--token", "hf_test", *flags], prog="push") == 0
    assert said_before == [f"Publishing run to me/x: {line}\n"]


def test_training_never_pushes_to_the_hub_by_itself(tmp_path):
    from hf_vanilla_transformer.training.recipes import parse_run

    with pytest.raises(ValueError, match=r"push_to_hub=True is not supported: publish the finished folder with"):
        parse_run(["--preset", "tiny", "--output_dir", str(tmp_path / "run"), "--push_to_hub", "true"])


# ---------------------------------------------------------------------------------------------------------------------
# 3. translate and score run a folder's own code only when asked
# ---------------------------------------------------------------------------------------------------------------------


def folder_with_code(folder: Path, marker: Path) -> Path:
    """A model folder whose config.json points to code of its own (auto_map) that, imported, leaves `marker`."""
    folder.mkdir()
    (folder / "configuration_other.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).touch()\n"
        "from transformers import PretrainedConfig\n\n\nclass OtherConfig(PretrainedConfig):\n"
        '    model_type = "other"\n'
    )
    auto_map = {"AutoConfig": "configuration_other.OtherConfig", "AutoModelForSeq2SeqLM": "modeling_other.OtherModel"}
    (folder / "config.json").write_text(json.dumps({"model_type": "other", "auto_map": auto_map}))
    return folder


def test_translate_and_score_run_a_folders_own_code_only_with_trust_remote_code(tmp_path, monkeypatch):
    from hf_vanilla_transformer.commands import score, translate
    from hf_vanilla_transformer.evaluation.translation import load_translator

    marker = tmp_path / "ran"
    folder = folder_with_code(tmp_path / "model", marker)
    with pytest.raises(OSError) as refused:
        load_translator(folder)
    assert not marker.exists()
    assert str(refused.value) == (
        f"{folder} holds code of its own (config.json's auto_map) for a model this package does not know: not run. "
        "Pass --trust_remote_code (trust_remote_code=True) to run it, only if you trust its author."
    )
    asked = []  # the commands pass the flag on, and only the flag

    def loading(model, device, trust_remote_code=False):
        asked.append(trust_remote_code)
        raise OSError("stop here")

    monkeypatch.setattr("hf_vanilla_transformer.data.cache.DEFAULT_CACHE", tmp_path / "cache")
    monkeypatch.setattr(translate, "load_translator", loading)
    monkeypatch.setattr(score, "load_translator", loading)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"Hello.\n")))
    data = ["--data_files", str(ROOT / "tests" / "fixtures" / "libreoffice_help_en_de_test_40.tsv")]
    for command, extra in ((translate, []), (score, data)):
        for flags in ([], ["--trust_remote_code"]):
            with pytest.raises(SystemExit, match="stop here"):
                command.main([str(folder), *extra, *flags], prog="x")
    assert asked == [False, True, False, True]


FOREIGN_CODE = {"AutoTokenizer": ["owner/repo--module.Class", None], "AutoModel": "owner/repo--modeling.Model"}
OWN_AUTO_MAP = {
    "AutoConfig": "configuration_vanilla_transformer.VanillaTransformerConfig",
    "AutoModelForSeq2SeqLM": "modeling_vanilla_transformer.VanillaTransformerForConditionalGeneration",
}


def folder_from_elsewhere(trained: Path, folder: Path) -> Path:
    """A copy of a trained model folder as a folder this package did not write could be: its tokenizer_config.json
    and config.json name another repository's code (`auto_map`, `custom_pipelines`, which `trust_remote_code=True`
    would run), and a key no class defines."""
    shutil.copytree(trained, folder, ignore=shutil.ignore_patterns("checkpoint-*", "plots", "tokenizer"))
    tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
    tokenizer_config |= {"auto_map": FOREIGN_CODE, "owner_setting": 1}
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] |= FOREIGN_CODE
    config["custom_pipelines"] = {"translation": {"impl": "owner/repo--pipeline.Pipeline", "pt": []}}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_what_fine_tuning_saves_of_a_folder_from_elsewhere_names_none_of_its_code(tmp_path, trained_folder):
    """The model a run fine-tunes (`training.models.build_model` from `--model_name_or_path`) and its tokenizer, saved
    as the run saves them (`save_pretrained`, `data.tokenizer.save_tokenizer`): this package's classes only in
    auto_map, no custom pipeline, the tokenizer's own keys only."""
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from hf_vanilla_transformer.data.tokenizer import save_tokenizer
    from hf_vanilla_transformer.training.models import build_model

    source = folder_from_elsewhere(trained_folder[0], tmp_path / "elsewhere")
    tokenizer = AutoTokenizer.from_pretrained(source)
    recipe = SimpleNamespace(
        model_name_or_path=str(source), config_overrides=None, dropout=None, label_smoothing=None,
        attn_implementation=None,
    )  # fmt: skip
    build_model(recipe, tokenizer).save_pretrained(tmp_path / "tuned")
    save_tokenizer(tokenizer, tmp_path / "tuned")
    tokenizer_config = json.loads((tmp_path / "tuned" / "tokenizer_config.json").read_text())
    assert "auto_map" not in tokenizer_config and "owner_setting" not in tokenizer_config, tokenizer_config
    config = json.loads((tmp_path / "tuned" / "config.json").read_text())
    assert config["auto_map"] == OWN_AUTO_MAP and "custom_pipelines" not in config


def test_push_refuses_a_folder_naming_code_that_is_not_the_packages(tmp_path, trained_folder):
    """A folder written before the package kept a source's code out of it (or edited since) is not published: the
    refusal names each reference to code that is not one of the package's files."""
    from hf_vanilla_transformer.sharing.hub import PublishError, stage_for_hub

    source = folder_from_elsewhere(trained_folder[0], tmp_path / "elsewhere")
    with pytest.raises(
        PublishError, match=r"config.json's auto_map names code that is not this package's \(owner/repo--module.Class"
    ):
        stage_for_hub(source, tmp_path / "staging")
    assert not (tmp_path / "staging").exists()


@pytest.mark.slow
def test_a_model_fine_tuned_from_a_folder_from_elsewhere_keeps_nothing_of_its_code(tmp_path, trained_folder):
    """`vanilla-transformer train --model_name_or_path` on a folder from elsewhere (`folder_from_elsewhere`): the
    folder the run writes names this package's classes only and keeps only the tokenizer's own keys."""
    from conftest import FIXTURES, run_script

    source = folder_from_elsewhere(trained_folder[0], tmp_path / "elsewhere")
    result = run_script(
        "train.py",
        *("--model_name_or_path", source, "--max_steps", "2", "--output_dir", tmp_path / "tuned"),
        *("--data_files", FIXTURES / "libreoffice_help_en_de_200.tsv", "--eval_strategy", "no"),
        *("--validation_files", FIXTURES / "libreoffice_help_en_de_test_40.tsv", "--max_eval_samples", "4"),
        *("--test_files", FIXTURES / "libreoffice_help_en_de_test_40.tsv", "--test_beams", "1"),
        *("--length_penalty_choices", "1"),  # greedy: the finetune recipe's alpha grid does not apply
        *("--data_cache_dir", tmp_path / "cache", "--disable_tqdm", "true"),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    tokenizer_config = json.loads((tmp_path / "tuned" / "tokenizer_config.json").read_text())
    assert "auto_map" not in tokenizer_config and "owner_setting" not in tokenizer_config, tokenizer_config
    config = json.loads((tmp_path / "tuned" / "config.json").read_text())
    assert config["auto_map"] == OWN_AUTO_MAP and "custom_pipelines" not in config


@pytest.mark.slow  # a script in a process of its own: about 11 s on a Zen 3
def test_the_translate_command_refuses_a_folders_own_code_in_one_line(tmp_path):
    marker = tmp_path / "ran"
    folder = folder_with_code(tmp_path / "model", marker)
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf_home"), "HF_HUB_OFFLINE": "1"}
    script = [sys.executable, str(ROOT / "scripts" / "translate.py"), str(folder)]
    refused = subprocess.run(script, input="Hello.\n", capture_output=True, text=True, timeout=300, env=env)
    assert not marker.exists()
    assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr[-2000:]
    assert refused.stderr.strip().splitlines()[-1].startswith(f"translate.py: {folder} holds code of its own")


# ---------------------------------------------------------------------------------------------------------------------
# 7. Translation inputs are tokenized with a bound; an over-long line is refused in one line
# ---------------------------------------------------------------------------------------------------------------------


class CountingTokenizer:
    """A tokenizer that records the longest text it was asked to tokenize."""

    def __init__(self, tokenizer):
        self.tokenizer, self.longest = tokenizer, 0

    def __call__(self, texts, **kwargs):
        self.longest = max([self.longest, *map(len, texts)])
        return self.tokenizer(texts, **kwargs)

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)


def test_translate_refuses_a_line_longer_than_max_tokens_and_tokenizes_no_huge_one(trained_folder):
    from hf_vanilla_transformer.evaluation.translation import load_translator, translate

    model, tokenizer = load_translator(trained_folder[0])
    counting = CountingTokenizer(tokenizer)
    for bad in (0, -5, 2.5, True):
        with pytest.raises(ValueError, match=rf"max_tokens={bad!r} is invalid; expected a positive number of tokens"):
            translate(model, counting, ["Save it."], max_tokens=bad, progress=False)
    with pytest.raises(ValueError, match=r"^line 2 is 1,000,000 characters long, more than max_tokens=100 tokens can"):
        translate(model, counting, ["Save it.", "x" * 1_000_000], max_tokens=100, progress=False)
    assert counting.longest == 0  # refused before anything was tokenized
    long = " ".join(["Choose Format - Cells."] * 40)
    tokens = len(tokenizer(long)["input_ids"])
    with pytest.raises(ValueError, match=rf"^line 3 is {tokens} tokens long, more than max_tokens=100 \(the padded"):
        translate(model, counting, ["Save it.", "", long], max_tokens=100, progress=False)
    assert translate(model, tokenizer, ["", long], max_tokens=tokens, num_beams=1, progress=False)[1]


def test_the_translate_command_checks_max_tokens_and_names_an_over_long_line(trained_folder, monkeypatch, capsys):
    from hf_vanilla_transformer.commands.translate import main

    with pytest.raises(SystemExit) as zero:
        main([str(trained_folder[0]), "--max_tokens", "0"], prog="translate")
    assert zero.value.code == 2
    assert "argument --max_tokens: '0' is invalid; expected a positive number of tokens" in capsys.readouterr().err
    huge = "Save it.\n" + "word " * 200_000 + "\n"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(huge.encode())))
    with pytest.raises(SystemExit) as refused:
        main([str(trained_folder[0])], prog="translate")
    assert refused.value.code == (
        "translate: line 2 is 1,000,000 characters long, more than max_tokens=4000 tokens can hold (128,000 "
        "characters); split it, or raise max_tokens (--max_tokens)."
    )


def test_a_corpus_line_is_read_with_a_bound_and_an_over_long_one_counted(tmp_path):
    import tracemalloc
    from collections import Counter

    from hf_vanilla_transformer.data.corpora import SKIPPED, parallel_pairs

    good = "Open a file.\tÖffnen Sie eine Datei.\n"
    path = tmp_path / "pairs.tsv"
    with path.open("w", encoding="utf-8") as handle:
        handle.write(good + "x" * 30_000_000 + "\tno pair\n" + good + "y" * 30_000_000 + "\tno line end")
    skipped = Counter()
    tracemalloc.start()
    try:
        pairs = list(parallel_pairs(path, skipped=skipped))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert pairs == [("Open a file.", "Öffnen Sie eine Datei.")] * 2
    assert skipped == {SKIPPED["long"]: 2}
    assert peak < 4_000_000, peak  # a few hundred kB of a line at a time, never the 30 MB


def test_a_deeply_nested_jsonl_line_is_refused_naming_the_file_and_the_line(tmp_path):
    from hf_vanilla_transformer.data.corpora import parallel_files_corpus
    from hf_vanilla_transformer.data.splits import DataFileError

    path = tmp_path / "deep.jsonl"
    path.write_text('{"source": "a", "target": "b"}\n' + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(DataFileError, match=r"deep\.jsonl:2 is not JSON \(nested too deep\); expected one object"):
        parallel_files_corpus(str(path), cache_dir=tmp_path / "cache")


# ---------------------------------------------------------------------------------------------------------------------
# 8. The Debian download changes nothing on the system, keeps to its folder and has caps
# ---------------------------------------------------------------------------------------------------------------------

FAKE_TOOL = """#!{python}
import json, os, sys
from pathlib import Path
with open({log!r}, "a") as log:
    log.write(json.dumps([os.path.basename(sys.argv[0]), *sys.argv[1:]]) + "\\n")
behaviour = json.loads(Path({behaviour!r}).read_text())
tool, arguments = os.path.basename(sys.argv[0]), sys.argv[1:]
if tool == "apt-get" and arguments[0] == "download":
    if behaviour["known"] is False:
        sys.stderr.write("E: Unable to locate package " + arguments[1] + "\\n")
        sys.exit(100)
    Path(arguments[1] + "_1.0_all.deb").write_bytes(b"!" * behaviour["deb_bytes"])
elif tool == "dpkg-deb" and arguments[0] == "-f":
    print(behaviour["installed_kib"])
elif tool == "dpkg-deb" and arguments[0] == "-x":
    os.makedirs(arguments[2], exist_ok=True)
    Path(arguments[2], "page.html").write_bytes(b"x" * behaviour["unpacked_bytes"])
"""


@pytest.fixture
def fake_apt(tmp_path, monkeypatch):
    """apt-get and dpkg-deb stand-ins on PATH that log their calls and behave as `behaviour` says; returns
    (set the behaviour, read the calls)."""
    bin_dir, log, behaviour = tmp_path / "bin", tmp_path / "calls.jsonl", tmp_path / "behaviour.json"
    bin_dir.mkdir()
    for tool in ("apt-get", "dpkg-deb"):
        (bin_dir / tool).write_text(FAKE_TOOL.format(python=sys.executable, log=str(log), behaviour=str(behaviour)))
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))

    def behave(**settings):
        defaults = {"known": True, "deb_bytes": 100, "installed_kib": 1, "unpacked_bytes": 100}
        behaviour.write_text(json.dumps({**defaults, **settings}))

    def calls():
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    return behave, calls


def test_an_unknown_package_asks_for_apt_get_update_and_never_runs_it(tmp_path, fake_apt):
    from hf_vanilla_transformer.data.libreoffice import fetch_debian_package
    from hf_vanilla_transformer.data.splits import CorpusError

    behave, calls = fake_apt
    behave(known=False)
    with pytest.raises(CorpusError) as refused:
        fetch_debian_package("libreoffice-help-xx", tmp_path / "cache")
    assert str(refused.value) == (
        "apt-get does not know the package libreoffice-help-xx: its package index is missing or out of date. Run "
        "`sudo apt-get update` (this program never changes the system), then try again."
    )
    assert calls() == [["apt-get", "download", "libreoffice-help-xx"]]


@pytest.mark.parametrize(
    ("behaviour", "message", "unpacked"),
    [
        ({"deb_bytes": 3000}, r"libreoffice-help-xx_1\.0_all\.deb is 3,000 bytes, more than a corpus package", False),
        ({"installed_kib": 10}, r"_all\.deb unpacks to 10,240 bytes, more than a corpus package may \(5,000\)", False),
        ({"unpacked_bytes": 6000}, r"_all\.deb unpacked to 6,000 bytes, more than a corpus package may", True),
    ],
)
def test_a_package_over_its_size_caps_is_refused(tmp_path, fake_apt, monkeypatch, behaviour, message, unpacked):
    from hf_vanilla_transformer.data import libreoffice
    from hf_vanilla_transformer.data.splits import CorpusError

    behave, calls = fake_apt
    behave(**behaviour)
    monkeypatch.setattr(libreoffice, "MAX_DEB_BYTES", 2000)
    monkeypatch.setattr(libreoffice, "MAX_UNPACKED_BYTES", 5000)
    with pytest.raises(CorpusError, match=message):
        libreoffice.fetch_debian_package("libreoffice-help-xx", tmp_path / "cache")
    assert any(call[:2] == ["dpkg-deb", "-x"] for call in calls()) == unpacked
    assert not (tmp_path / "cache" / "debs" / "libreoffice-help-xx").exists()
    behave()  # within the caps: unpacked
    folder = libreoffice.fetch_debian_package("libreoffice-help-xx", tmp_path / "cache")
    assert (folder / "page.html").stat().st_size == 100


def test_the_help_pages_read_keep_to_the_unpacked_folder(tmp_path):
    from hf_vanilla_transformer.data.libreoffice import align_help_trees

    page = '<html><body><p id="par_id1">{}</p></body></html>'
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.html").write_text(page.format("private words"))
    for lang, text in (("en-US", "Open a file."), ("de", "Öffnen Sie eine Datei.")):
        root = tmp_path / "help" / lang
        root.mkdir(parents=True)
        (root / "page.html").write_text(page.format(text))
        (root / "linked.html").symlink_to(outside / "secret.html")
    rows = list(align_help_trees(tmp_path / "help" / "en-US", tmp_path / "help" / "de"))
    assert rows == [("page.html", "Open a file.", "Öffnen Sie eine Datei.")]


# ---------------------------------------------------------------------------------------------------------------------
# Done when: a scan of the package's source finds none of these mistakes
# ---------------------------------------------------------------------------------------------------------------------

TEMPORARY_OR_LOCK = re.compile(r"lock|temp|tmp", re.IGNORECASE)
WRITES = ("open", "write_text", "write_bytes", "touch")


def file_name(expression: ast.expr) -> str:
    """The source of the file's own name in a path expression: `folder / NAME` -> `NAME` (a file inside a folder
    this process made is not itself a temporary file), anything else as written."""
    if isinstance(expression, ast.BinOp) and isinstance(expression.op, ast.Div):
        return ast.unparse(expression.right)
    return ast.unparse(expression)


def unsafe_calls(source: str) -> list[str]:
    """What in `source` (a module's text) would run code or follow a link: a `torch.load` without
    `weights_only=True`, `trust_remote_code=True` written out (an opt-in passes the user's choice, never the
    constant), and a lock or temporary file (named so) opened by `open`, `Path.open`/`write_*`/`touch`, or by
    `os.open` without `O_NOFOLLOW` (its flags, or the module-level name they are kept in)."""
    tree = ast.parse(source)
    names = {
        target.id: ast.unparse(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == "trust_remote_code" and ast.unparse(value) == "True":
                    found.append(ast.unparse(node))
        if not isinstance(node, ast.Call):
            continue
        call, keywords = ast.unparse(node.func), {k.arg: ast.unparse(k.value) for k in node.keywords}
        if keywords.get("trust_remote_code") == "True":
            found.append(ast.unparse(node))
        if call in ("torch.load", "load") and keywords.get("weights_only") != "True":
            found.append(ast.unparse(node))
        if call == "os.open" and node.args and TEMPORARY_OR_LOCK.search(ast.unparse(node.args[0])):
            flags = ast.unparse(node.args[1]) if len(node.args) > 1 else ""
            if "O_NOFOLLOW" not in names.get(flags, flags):
                found.append(ast.unparse(node))
        opened = node.args[0] if call == "open" and node.args else None
        if isinstance(node.func, ast.Attribute) and node.func.attr in WRITES:
            opened = node.func.value
        if call != "os.open" and opened is not None and TEMPORARY_OR_LOCK.search(file_name(opened)):
            found.append(ast.unparse(node))
    return found


def test_the_scan_finds_each_mistake_it_looks_for():
    bad = """
import os, torch
torch.load(path, weights_only=False)
torch.load(path)
model = AutoModel.from_pretrained(name, trust_remote_code=True)
options = {"trust_remote_code": True}
with lock.open("a+") as handle: pass
with open(temporary, "w") as handle: pass
(folder / f"{name}.tmp").write_text("x")
(temporary / "inside.json").write_text("x")
os.open(lock_file, os.O_RDWR | os.O_CREAT)
FLAGS = os.O_RDWR | os.O_NOFOLLOW
os.open(lock_file, FLAGS)
torch.load(path, weights_only=True)
AutoModel.from_pretrained(name, trust_remote_code=trust_remote_code)
"""
    assert len(unsafe_calls(bad)) == 8


def test_the_package_loads_no_pickle_runs_no_remote_code_unasked_and_follows_no_link():
    found = {
        str(path.relative_to(ROOT)): unsafe_calls(path.read_text(encoding="utf-8")) for path in PACKAGE.rglob("*.py")
    }
    assert {path: calls for path, calls in found.items() if calls} == {}
