"""Checkpoints of a run and the `.complete` protocol: `TransformerTrainer` writes the marker last, after every process
has finished writing a checkpoint, so a checkpoint interrupted at any moment (SIGKILL included) is never taken for a
complete one; resuming, averaging and validation read the marker back here."""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path

import torch

from ..utils.files import sync_folder, write_text_atomically


CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
COMPLETE = ".complete"  # written last, after every process has finished writing (see mark_complete)
HF_COMPLETE_MARKERS = ("model.safetensors", "trainer_state.json")


def mark_complete(folder: str | Path, step: int) -> None:
    """Flush the checkpoint `folder` to the disk, then write its `.complete` atomically: the last file of a
    checkpoint, never on the disk before the others."""
    sync_folder(folder)
    write_text_atomically(Path(folder) / COMPLETE, f"{step}\n")


def checkpoint_folders(output_dir: str | Path, complete_only: bool = True) -> list[Path]:
    """Complete `checkpoint-<step>` folders of a run, oldest first (with `complete_only=False`, every one).

    Runs of this package mark a checkpoint complete with a `.complete` file written after everything else, so a
    checkpoint interrupted while being written is never taken for a complete one. For a run made by another
    trainer (no marker anywhere, and no `budget.json`: this package writes it before any checkpoint), a folder with
    weights and `trainer_state.json` counts as complete."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return []
    found = []
    for path in output_dir.iterdir():
        match = CHECKPOINT.match(path.name)
        if match and path.is_dir():
            found.append((int(match.group(1)), path))
    found.sort()
    if not complete_only:
        return [path for _, path in found]
    marked = [path for _, path in found if (path / COMPLETE).exists()]
    if marked or (output_dir / "budget.json").exists():  # (budget/record.BUDGET_FILE: a run of this package)
        return marked
    return [path for _, path in found if all((path / name).exists() for name in HF_COMPLETE_MARKERS)]


def checkpoint_step(folder: Path) -> int:
    match = CHECKPOINT.match(Path(folder).name)
    if match is None:
        raise ValueError(f"{folder} is not a checkpoint-<step> folder.")
    return int(match.group(1))


class CheckpointError(RuntimeError):
    """A checkpoint is incomplete or corrupted; the message names the file."""


def validate_checkpoint(folder: str | Path) -> Path:
    """Raise `CheckpointError` naming the file if `folder` is not a complete, readable checkpoint of this package."""
    from safetensors import safe_open

    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"{folder} is not a checkpoint folder.")
    if not (folder / COMPLETE).exists():
        raise CheckpointError(
            f"{folder / COMPLETE} is missing: the checkpoint was interrupted while being written. Resume from an "
            "earlier one, or leave out --resume_from_checkpoint to take the newest complete one."
        )
    for name in ("config.json", "trainer_state.json"):
        try:
            json.loads((folder / name).read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise CheckpointError(f"{folder / name} cannot be read: {error}") from error
    try:
        with safe_open(str(folder / "model.safetensors"), framework="pt") as handle:
            for key in handle.keys():  # noqa: SIM118 (safe_open handles are not containers)
                handle.get_slice(key)
    except Exception as error:
        raise CheckpointError(f"{folder / 'model.safetensors'} is corrupted or truncated: {error}") from error
    for path in sorted(folder.glob("*.pt")) + sorted(folder.glob("*.pth")):
        check_pickle(path)
    return folder


def check_pickle(path: Path) -> None:
    """Read the `torch.save` file `path` as the Trainer does on resuming (`weights_only=True`, with the numpy
    arrays of its RNG state allowed: transformers' `safe_globals`), memory-mapped: the archive and its index are
    checked, the tensors not read. A pickle that would build anything else (call a function: run code) is refused by
    name, nothing of it run; a corrupted or truncated file is named too."""
    from transformers.trainer_pt_utils import safe_globals

    try:
        with safe_globals():
            torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as error:
        if "Weights only load failed" not in str(error):
            raise CheckpointError(f"{path} is corrupted or truncated: {error}") from error
        raise CheckpointError(
            f"{path} holds objects other than tensors (its pickle would run code when loaded): refused, nothing of it "
            "was run. Resume only from checkpoints written by this package, or delete this one."
        ) from None
    except Exception as error:
        raise CheckpointError(f"{path} is corrupted or truncated: {error}") from error


def latest_checkpoint(output_dir: str | Path) -> str | None:
    """The newest complete checkpoint folder of a run, for resuming; None if there is none."""
    folders = checkpoint_folders(output_dir)
    return str(folders[-1]) if folders else None
