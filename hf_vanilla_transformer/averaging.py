"""Checkpoint averaging (§6.1): the base models average the last 5 checkpoints, the big ones the last 20."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import torch
from safetensors import safe_open

from .modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration


CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
COMPLETE = ".complete"  # written last, after every process has finished writing (see TransformerTrainer)
HF_COMPLETE_MARKERS = ("model.safetensors", "trainer_state.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def checkpoint_folders(output_dir: str | Path) -> list[Path]:
    """Complete `checkpoint-<step>` folders of a run, oldest first.

    Runs of this package mark a checkpoint complete with a `.complete` file written after everything else, so a
    checkpoint interrupted while being written is never taken for a complete one. For a run made by another
    trainer (no marker anywhere), a folder with weights and `trainer_state.json` counts as complete."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return []
    found = []
    for path in output_dir.iterdir():
        match = CHECKPOINT.match(path.name)
        if match and path.is_dir():
            found.append((int(match.group(1)), path))
    found.sort()
    marked = [path for _, path in found if (path / COMPLETE).exists()]
    if marked:
        return marked
    return [path for _, path in found if all((path / name).exists() for name in HF_COMPLETE_MARKERS)]


def average_state_dicts(paths: list[str | Path]) -> dict[str, torch.Tensor]:
    """Elementwise mean of the `model.safetensors` tensors of `paths` (accumulated in float64)."""
    if not paths:
        raise ValueError("No checkpoint to average.")
    total: dict[str, torch.Tensor] = {}
    dtypes: dict[str, torch.dtype] = {}
    for path in paths:
        file = Path(path) / "model.safetensors"
        if not file.exists():
            raise FileNotFoundError(f"{file} does not exist; is {path} a complete checkpoint?")
        with safe_open(str(file), framework="pt") as handle:
            keys = set(handle.keys())
            if total and keys != set(total):
                raise ValueError(f"{file} holds other tensors than {paths[0]}; checkpoints of different models?")
            for key in keys:
                tensor = handle.get_tensor(key)
                dtypes[key] = tensor.dtype
                value = tensor.to(torch.float64) if tensor.is_floating_point() else tensor
                total[key] = total[key] + value if key in total and tensor.is_floating_point() else value
    return {
        key: (value / len(paths)).to(dtypes[key]) if value.is_floating_point() else value
        for key, value in total.items()
    }


def average_checkpoints(
    checkpoints: list[str | Path], output_dir: str | Path
) -> VanillaTransformerForConditionalGeneration:
    """Average `checkpoints` into a model folder at `output_dir` (weights, config, generation config, remote-code
    files and the tokenizer of the last checkpoint). The three-way tie is kept: the average is loaded into a model
    and saved through `save_pretrained`."""
    checkpoints = [Path(path) for path in checkpoints]
    model = VanillaTransformerForConditionalGeneration.from_pretrained(checkpoints[-1])
    averaged = average_state_dicts(checkpoints)
    missing, unexpected = model.load_state_dict(averaged, strict=False)
    tied = set(model.all_tied_weights_keys)
    if unexpected or set(missing) - tied:
        raise ValueError(f"Averaged weights do not fit the model: missing {missing}, unexpected {unexpected}.")
    model.tie_weights()
    output_dir = Path(output_dir)
    model.save_pretrained(output_dir)
    for name in TOKENIZER_FILES:
        if (checkpoints[-1] / name).exists():
            shutil.copy2(checkpoints[-1] / name, output_dir / name)
    return model


def average_last_checkpoints(run_dir: str | Path, output_dir: str | Path, last: int = 5):
    """Average the newest `last` complete checkpoints of `run_dir` into `output_dir`; returns (model, folders)."""
    if last < 1:
        raise ValueError(f"last={last} is invalid; average at least one checkpoint.")
    folders = checkpoint_folders(run_dir)
    if not folders:
        raise FileNotFoundError(f"{run_dir} holds no complete checkpoint-<step> folder to average.")
    chosen = folders[-last:]
    return average_checkpoints(chosen, output_dir), chosen
