"""Set up `.venv` for this machine: the Makefile's `setup` (`make main`, `make test`, `make gpu-check` run it first).

Usage:
    python3 scripts/setup_env.py              # create or update .venv, or keep it where it is current
    python3 scripts/setup_env.py --dry-run    # say what it would do on this machine, change nothing

It runs with the machine's own Python before this package is installed, so it imports nothing of it (the one script
that cannot be a thin entry over package code). What it does:

1. **The machine's kind.** `nvidia-smi -L` lists a GPU: a CUDA machine, else a CPU one.
2. **PyTorch.** On a CPU machine, the tested CPU build (`TORCH`) from the machine's wheel folder where pip finds it
   there, else from PyTorch's CPU index. On a CUDA machine whose own Python already has a PyTorch that sees the GPU
   (an offline cluster image), the virtual environment sees the system's site-packages and uses it; else the
   tested version's CUDA build for the driver (`nvidia-smi`'s "CUDA Version": the newest of `CUDA_BUILDS` the driver
   runs) from PyTorch's index. Either way, a GPU that `nvidia-smi` sees and PyTorch cannot use stops the set-up
   with one line saying why, rather than a main job that silently runs the CPU recipe.
3. **A `.venv` of another kind is not reused**: its stamp (`.venv/.installed`) names the kind it was made for, and
   a CPU-made `.venv` on a CUDA machine (or the other way round) is made again.
4. This package, editable, with its `dev` extra.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


TORCH = "2.13.0"  # the tested PyTorch
# PyTorch's CUDA builds of TORCH, newest first, with the CUDA version a driver must run (nvidia-smi's "CUDA Version").
CUDA_BUILDS = (("13.0", "cu130"), ("12.8", "cu128"), ("12.6", "cu126"))
INDEX = "https://download.pytorch.org/whl/{build}"
STAMP = ".installed"


@dataclass(frozen=True)
class Machine:
    """What set-up needs to know of a machine: the GPUs `nvidia-smi -L` names (none: a CPU machine), the CUDA version
    its driver runs, and the machine Python's own PyTorch (its version, whether it sees a GPU; None: none)."""

    gpus: tuple[str, ...] = ()
    driver_cuda: str | None = None
    system_torch: str | None = None
    system_torch_sees_gpu: bool = False


@dataclass(frozen=True)
class Setup:
    """What to do: the environment's `kind` (cpu, cuda, cuda-system), whether it sees the system's site-packages,
    the pip arguments that install PyTorch (none: the system's is used), and an `error` that stops the set-up."""

    kind: str
    system_site_packages: bool = False
    torch: tuple[str, ...] = ()
    error: str | None = None


def plan_setup(machine: Machine) -> Setup:
    """The set-up of `machine` (see the module docstring)."""
    if not machine.gpus:
        return Setup("cpu", torch=(f"torch=={TORCH}",))
    if machine.system_torch_sees_gpu:
        return Setup("cuda-system", system_site_packages=True)
    build = cuda_build(machine.driver_cuda)
    if build is None:
        return Setup(
            "cuda",
            error=f"nvidia-smi sees {machine.gpus[0]}, but its driver runs CUDA {machine.driver_cuda or 'unknown'}, "
            f"older than every CUDA build of PyTorch {TORCH} ({', '.join(v for v, _ in CUDA_BUILDS)}): update the "
            "driver, or run on the CPU (`--recipe cpu`) in a virtual environment of your own.",
        )
    return Setup("cuda", torch=(f"torch=={TORCH}", "--index-url", INDEX.format(build=build)))


def cuda_build(driver_cuda: str | None) -> str | None:
    """The newest CUDA build of `TORCH` a driver running CUDA `driver_cuda` ("12.9") can run, or None."""
    if not driver_cuda:
        return None
    version = tuple(int(part) for part in driver_cuda.split(".")[:2])
    for needed, build in CUDA_BUILDS:
        if version >= tuple(int(part) for part in needed.split(".")):
            return build
    return None


def venv_kind(venv: Path) -> str | None:
    """The kind `venv` was made for: its stamp's, else (a stamp of an older set-up, which names none) that of the
    PyTorch it holds, a CUDA build or not; None where it holds none."""
    stamp = venv / STAMP
    named = stamp.read_text(encoding="utf-8").split() if stamp.exists() else []
    if named:
        return named[0]
    probe = "import torch; print('cuda' if torch.version.cuda else 'cpu')"
    result = subprocess.run([str(venv / "bin" / "python"), "-c", probe], capture_output=True, text=True)
    return result.stdout.strip() or None if result.returncode == 0 else None


def stale(venv: Path, kind: str) -> bool:
    """Whether `venv` exists and was made for another kind of machine."""
    if not (venv / "bin" / "python").exists():
        return False
    made_for = venv_kind(venv)
    return made_for is not None and made_for != kind


def current(venv: Path, kind: str, project: Path) -> bool:
    """Whether `venv` is set up for `kind` and newer than the project's dependencies."""
    stamp = venv / STAMP
    return (
        not stale(venv, kind)
        and stamp.exists()
        and stamp.stat().st_mtime >= (project / "pyproject.toml").stat().st_mtime
    )


def gpu_refusal(python: Path, machine: Machine) -> str | None:
    """Why the environment's PyTorch cannot use the GPU `nvidia-smi` sees (None: it can)."""
    probe = "import json, torch; print(json.dumps([torch.__version__, torch.version.cuda, torch.cuda.is_available()]))"
    result = subprocess.run([str(python), "-c", probe], capture_output=True, text=True)
    if result.returncode != 0:
        return f"PyTorch does not import: {result.stderr.strip().splitlines()[-1] if result.stderr.strip() else '?'}"
    version, cuda, available = json.loads(result.stdout.strip().splitlines()[-1])
    if available:
        return None
    build = f"CUDA {cuda}" if cuda else "a CPU-only build"
    return (
        f"nvidia-smi sees {machine.gpus[0]} (driver CUDA {machine.driver_cuda}), but PyTorch {version} ({build}) "
        "cannot use it: check that the driver runs that CUDA version and that no CUDA_VISIBLE_DEVICES hides the GPU."
    )


def probe_machine() -> Machine:
    """This machine, as `Machine` describes it."""
    gpus, driver = (), None
    if shutil.which("nvidia-smi"):
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
        if listed.returncode == 0:
            found = (re.match(r"GPU \d+: (.*?)(?: \(UUID:.*)?$", line.strip()) for line in listed.stdout.splitlines())
            gpus = tuple(match.group(1) for match in found if match)
            header = subprocess.run(["nvidia-smi"], capture_output=True, text=True).stdout
            found = re.search(r"CUDA Version:\s*([0-9.]+)", header)
            driver = found.group(1) if found else None
    probe = "import torch; print(torch.__version__); print(torch.cuda.is_available())"
    system = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    version, sees = None, False
    if system.returncode == 0:
        version, available = system.stdout.split()[-2:]
        sees = available == "True"
    return Machine(gpus, driver, version, sees)


def set_up(venv: Path, project: Path, setup: Setup, machine: Machine) -> None:
    """Make `venv` as `setup` says, install PyTorch and this package, check the GPU, write the stamp."""
    if stale(venv, setup.kind):
        print(f"{venv} was made for another kind of machine: making it again for {setup.kind}", flush=True)
        shutil.rmtree(venv)
    python = venv / "bin" / "python"
    if not python.exists():
        flags = ["--system-site-packages"] if setup.system_site_packages else []
        subprocess.run([sys.executable, "-m", "venv", *flags, str(venv)], check=True)
    if setup.kind == "cpu":
        local = subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", *setup.torch]
        )
        if local.returncode == 0:
            print(f"torch {TORCH} (CPU wheel) installed from this machine's wheel folder", flush=True)
        else:
            pip(python, *setup.torch, "--index-url", INDEX.format(build="cpu"))
    elif setup.torch:
        pip(python, *setup.torch)
    pip(python, "--quiet", "-e", f"{project}[dev]")
    if setup.kind != "cpu":
        refusal = gpu_refusal(python, machine)
        if refusal:
            raise SystemExit(f"setup: {refusal}")
    (venv / STAMP).write_text(f"{setup.kind}\n", encoding="utf-8")


def pip(python: Path, *arguments: str) -> None:
    subprocess.run([str(python), "-m", "pip", "install", *arguments], check=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--venv", default=".venv")
    parser.add_argument("--dry-run", action="store_true", help="say what would be done, change nothing")
    options = parser.parse_args(argv)
    project = Path(__file__).resolve().parent.parent
    venv = Path(options.venv)
    machine = probe_machine()
    setup = plan_setup(machine)
    if setup.error:
        raise SystemExit(f"setup: {setup.error}")
    if options.dry_run:
        action = "kept" if current(venv, setup.kind, project) else "made again" if stale(venv, setup.kind) else "set up"
        torch = "the system's PyTorch" if not setup.torch else " ".join(setup.torch)
        print(f"{setup.kind} machine ({', '.join(machine.gpus) or 'no GPU'}): {venv} {action}; {torch}")
        return
    if not current(venv, setup.kind, project):
        set_up(venv, project, setup, machine)


if __name__ == "__main__":
    main()
