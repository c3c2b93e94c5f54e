"""The package as a user installs it: the wheel built from this checkout, installed into a fresh virtual environment,
used from a folder outside the checkout with nothing of the checkout on the path. Its command and every
sub-command answer `--help`, its recipes and launch files are found by name, and a recipe trains by name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from hf_vanilla_transformer.commands.cli import COMMANDS

from conftest import FIXTURES, ROOT


def run(command: list[str], cwd: Path, timeout: int = 600, allocator: str | None = None) -> subprocess.CompletedProcess:
    environment = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    environment["HF_HUB_OFFLINE"] = "1"
    if allocator:
        environment["HF_VANILLA_TRANSFORMER_ALLOCATOR"] = allocator
    return subprocess.run(command, cwd=cwd, env=environment, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A virtual environment with the wheel installed (the dependencies come from this one, through a `.pth` file:
    nothing is downloaded); the folder it is used from."""
    where = tmp_path_factory.mktemp("installed")
    wheels = where / "wheels"
    built = run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(ROOT)], where
    )
    assert built.returncode == 0, built.stderr[-3000:]
    environment = where / "env"
    created = run([sys.executable, "-m", "venv", str(environment)], where)
    assert created.returncode == 0, created.stderr[-3000:]
    python = environment / "bin" / "python"
    site = run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], where)
    Path(site.stdout.strip(), "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    wheel = next(wheels.glob("hf_vanilla_transformer-*.whl"))
    pip = run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", str(wheel)], where)
    assert pip.returncode == 0, pip.stderr[-3000:]
    return environment


@pytest.mark.slow
def test_the_installed_package_is_the_wheels_not_the_checkouts(installed, tmp_path):
    found = run(
        [str(installed / "bin" / "python"), "-c", "import hf_vanilla_transformer as p; print(p.__file__)"], tmp_path
    )
    assert found.returncode == 0, found.stderr[-3000:]
    assert Path(found.stdout.strip()).is_relative_to(installed) and ROOT not in Path(found.stdout.strip()).parents


# Every command's help, asked of the installed package's own dispatcher in one interpreter (a process each cost 122 s
# of CI's Zen 3 for 16 commands, nearly all of it importing the same libraries again).
HELPS = """
import contextlib, io, json, sys
from hf_vanilla_transformer.commands.cli import COMMANDS, main
answers = {}
for name in COMMANDS:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([name, "--help"])
        except SystemExit as stop:
            code = stop.code
    answers[name] = [code, out.getvalue(), err.getvalue()]
json.dump(answers, sys.stdout)
"""


@pytest.mark.slow
def test_every_installed_command_answers_help(installed, tmp_path):
    command = str(installed / "bin" / "vanilla-transformer")
    listing = run([command, "--help"], tmp_path)
    assert listing.returncode == 0 and all(name in listing.stdout for name in COMMANDS), listing.stdout
    # The installed command itself, through a training command's re-run with its allocator (utils/allocator.py).
    helped = run([command, "train", "--help"], tmp_path)
    assert helped.returncode == 0 and "usage: vanilla-transformer train" in helped.stdout, helped.stderr[-2000:]
    asked = run([str(installed / "bin" / "python"), "-c", HELPS], tmp_path, allocator="system")
    assert asked.returncode == 0, asked.stderr[-3000:]
    answers = json.loads(asked.stdout)
    assert list(answers) == list(COMMANDS)
    for name, (code, out, err) in answers.items():
        assert code in (0, None), (name, err[-2000:])
        assert f"usage: vanilla-transformer {name}" in out, (name, out[:300], err[-2000:])
    unknown = run([command, "fly"], tmp_path)
    assert unknown.returncode == 1 and "'fly' is not a command; expected one of train, main" in unknown.stderr


@pytest.mark.slow
def test_the_installed_recipes_are_found_by_name_and_train(installed, tmp_path):
    command = str(installed / "bin" / "vanilla-transformer")
    located = run([command, "configs", "--path", "recipes/cpu"], tmp_path)
    assert located.returncode == 0 and Path(located.stdout.strip()).is_relative_to(installed), located.stdout
    listing = run([command, "configs"], tmp_path)
    assert all(name in listing.stdout for name in ("cpu", "gpu", "base", "big", "fsdp", "single_node_multi_gpu"))
    fixture = str(FIXTURES / "libreoffice_help_en_de_200.tsv")
    trained = run(
        [
            command,
            *("train", "--recipe", "cpu", "--preset", "tiny", "--max_steps", "4", "--output_dir", "run"),
            *("--data_files", fixture, "--validation_files", str(FIXTURES / "libreoffice_help_en_de_test_40.tsv")),
            *("--test_files", str(FIXTURES / "libreoffice_help_en_de_test_40.tsv"), "--vocab_size", "300"),
            *("--test_beams", "1", "--length_penalty_choices", "0.6", "--eval_strategy", "no"),
            *("--data_cache_dir", str(tmp_path / "cache"), "--disable_tqdm", "true"),
        ],
        tmp_path,
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["recipe"]["recipe_file"] == "cpu" and results["training"]["steps"] == 4
    assert results["command"].startswith("vanilla-transformer train --recipe cpu")
