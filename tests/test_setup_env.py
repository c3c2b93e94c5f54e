"""The Makefile's set-up (scripts/setup_env.py) decides, on any machine, what a GPU machine needs (issue 39): the
tested PyTorch pinned, the CUDA build the driver runs or the image's own CUDA PyTorch, one line where a GPU that
nvidia-smi sees cannot be used, and a .venv made for another kind of machine made again."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT


def load_setup():
    spec = importlib.util.spec_from_file_location("setup_env", ROOT / "scripts" / "setup_env.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


setup_env = load_setup()
Machine, Setup = setup_env.Machine, setup_env.Setup
H200 = ("NVIDIA H200",)


def test_a_cpu_machine_gets_the_tested_cpu_wheel():
    assert setup_env.plan_setup(Machine()) == Setup("cpu", torch=("torch==2.13.0",))


def test_a_gpu_image_with_its_own_cuda_pytorch_is_used_as_it_is():
    machine = Machine(H200, "13.0", system_torch="2.11.0+cu130", system_torch_sees_gpu=True)
    assert setup_env.plan_setup(machine) == Setup("cuda-system", system_site_packages=True)


@pytest.mark.parametrize(
    ("driver", "build"), [("13.1", "cu130"), ("13.0", "cu130"), ("12.9", "cu128"), ("12.8", "cu128"), ("12.6", "cu126")]
)
def test_a_gpu_machine_gets_the_tested_version_in_the_cuda_build_its_driver_runs(driver, build):
    setup = setup_env.plan_setup(Machine(H200, driver, system_torch="2.13.0+cpu"))
    assert setup.kind == "cuda" and not setup.error
    assert setup.torch == ("torch==2.13.0", "--index-url", f"https://download.pytorch.org/whl/{build}")


def test_a_driver_too_old_for_every_build_stops_the_set_up_in_one_line():
    setup = setup_env.plan_setup(Machine(H200, "12.2"))
    assert setup.error.startswith("nvidia-smi sees NVIDIA H200, but its driver runs CUDA 12.2")
    assert "\n" not in setup.error and "update the driver" in setup.error


def fake_python(venv: Path, output: str) -> None:
    """A `venv` whose python prints `output` whatever it is asked."""
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(f"#!/bin/sh\necho '{output}'\n", encoding="utf-8")
    python.chmod(0o755)


def test_a_venv_made_for_another_kind_of_machine_is_made_again(tmp_path):
    venv = tmp_path / ".venv"
    assert not setup_env.stale(venv, "cuda")  # none yet: nothing to make again
    fake_python(venv, "cpu")  # an older set-up's venv: an empty stamp, a CPU PyTorch inside
    (venv / ".installed").write_text("", encoding="utf-8")
    assert setup_env.stale(venv, "cuda") and not setup_env.stale(venv, "cpu")
    (venv / ".installed").write_text("cuda\n", encoding="utf-8")
    assert setup_env.stale(venv, "cpu") and not setup_env.stale(venv, "cuda")


def test_a_gpu_that_pytorch_cannot_use_is_named_with_the_build_that_cannot(tmp_path):
    venv = tmp_path / ".venv"
    fake_python(venv, '["2.13.0+cpu", null, false]')
    refusal = setup_env.gpu_refusal(venv / "bin" / "python", Machine(H200, "13.0"))
    assert refusal.startswith("nvidia-smi sees NVIDIA H200 (driver CUDA 13.0), but PyTorch 2.13.0+cpu")
    assert "a CPU-only build" in refusal
    (venv / "bin" / "python").write_text('#!/bin/sh\necho \'["2.13.0+cu130", "13.0", true]\'\n', encoding="utf-8")
    assert setup_env.gpu_refusal(venv / "bin" / "python", Machine(H200, "13.0")) is None


@pytest.mark.slow  # a process of its own: 8-11 s on a Zen 3
def test_the_set_up_says_what_it_would_do_on_this_machine(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "setup_env.py"), "--dry-run", "--venv", str(tmp_path / "venv")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    kind = "cuda" if setup_env.probe_machine().gpus else "cpu machine (no GPU)"
    assert result.stdout.startswith(kind) and f"{tmp_path / 'venv'} set up" in result.stdout
